"""`platoon init NAME` makes a project whose own test passes at once."""

from __future__ import annotations

import subprocess
import sys

import pytest

from platoon.cli import main


@pytest.mark.slow
def test_a_new_project_passes_its_own_test(tmp_path, capsys):
    assert main(["init", "word-game", "--directory", str(tmp_path / "word-game")]) == 0
    project = tmp_path / "word-game"
    assert sorted(p.name for p in project.iterdir()) == sorted(
        ["env.py", "harness.py", "scripted.py", "config.yaml", "test_word_game.py", "README.md"]
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(project)],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 passed" in done.stdout


def test_bad_names_and_taken_directories_are_refused(tmp_path, capsys):
    assert main(["init", "Bad_Name", "--directory", str(tmp_path / "x")]) == 1
    assert "lower-case letters, digits and dashes" in capsys.readouterr().err
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("mine")
    assert main(["init", "ok", "--directory", str(tmp_path / "taken")]) == 1
    assert "exists and is not empty" in capsys.readouterr().err
    assert (tmp_path / "taken" / "file").read_text() == "mine"

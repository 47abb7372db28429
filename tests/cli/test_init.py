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


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.learning
def test_a_new_project_learns_on_the_cpu(tmp_path, monkeypatch, capsys):
    """The scaffold's own config trains the tiny model with a reward that rises (a task it can
    fail in varied ways), not at a constant 0 with nothing to learn from. The test trains the
    first 15 of its 30 steps: the run is reproducible, so they are the whole run's first 15."""
    import json

    from platoon.config.site import load_site

    project = tmp_path / "word-game"
    assert main(["init", "word-game", "--directory", str(project)]) == 0
    site = tmp_path / "site.yaml"
    site.write_text(f"runs: {tmp_path / 'runs'}\ncache: {load_site().cache}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    try:
        assert main(["train", "config.yaml", "stats.trial_name=learns", "train.max_training_steps=15"]) == 0
    finally:
        for module in ("env", "harness", "scripted"):
            sys.modules.pop(module, None)
    rows = (tmp_path / "runs" / "word-game" / "learns" / "metrics.jsonl").read_text().splitlines()
    rewards = [json.loads(row)["reward/mean"] for row in rows]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    # The scaffold trains with train.reproducible, so this run is the same whatever the load:
    # 0.30 -> 0.52 over these 15 steps, 0.50 over the last 5 of 30 (seed 2, the scaffold's). Measured as the tests run (OMP_NUM_THREADS=1), seeds
    # 1-4 rise 0.07, 0.20, 0.22, 0.27 in these 30 steps at learning rate 0.03. At 0.02 (before)
    # seed 2 rose 0.07 to 0.09 and, with batched sampling, failed the bar under load.
    print("rewards:", [round(r, 3) for r in rewards])
    assert last >= first + 0.1, rewards

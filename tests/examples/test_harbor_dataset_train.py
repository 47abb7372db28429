"""`platoon prepare` then `platoon train` on examples/harbor-dataset, with the embedded backend
and a tiny model: every episode runs in a bubblewrap sandbox of its task, is graded by the
task's own tests, and the trainer steps on the result."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from platoon.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "harbor-dataset"
pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
]


@pytest.mark.slow
def test_prepare_then_train_on_the_embedded_backend(tmp_path, monkeypatch, capsys):
    site = tmp_path / "site.yaml"
    site.write_text(f"runs: {tmp_path}/runs\ncache: {tmp_path}/cache\nprovider: bwrap\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    config = str(EXAMPLE / "train-local.yaml")
    assert main(["prepare", config]) == 0
    assert main(["train", config]) == 0, capsys.readouterr().err
    run_dir = tmp_path / "runs" / "harbor-dataset" / "tiny-local"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    # 2 tasks x 2 rollouts a step, each graded by its task's tests (a reward of 0 or 1, never missing)
    assert all(m["episodes/graded"] == 4 for m in metrics)
    assert all(m["policy/version"] >= 1 for m in metrics)
    assert len((run_dir / "checkpoints.jsonl").read_text().splitlines()) == 2

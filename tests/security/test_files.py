"""What a run writes is its owner's alone: every file 0600, every folder 0700, whatever the umask.

The weights, the optimizer's state and the manifest of a checkpoint are a trained policy; the
events hold every prompt. A `platoon train` on the embedded backend runs under umask 000 (the
loosest a user can have), and its finished tree is walked.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.torch, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def test_a_finished_runs_tree_is_private_whatever_the_umask(tmp_path):
    pytest.importorskip("peft")
    site = tmp_path / "site.yaml"
    site.write_text(f"runs: {tmp_path / 'runs'}\ncache: {tmp_path / 'cache'}\n")
    argv = [sys.executable, "-m", "platoon", "train", "examples/quickstart/train-local.yaml"]
    done = subprocess.run(
        [*argv, "train.max_training_steps=2", "train.save_every=1", "--quiet"],
        cwd=ROOT,
        env={**os.environ, "PLATOON_SITE": str(site)},
        preexec_fn=lambda: os.umask(0),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = tmp_path / "runs"
    run = runs / "quickstart" / "vowels-local"
    checkpoints = list(run.glob("tinker/*/weights/state-*/optimizer.pt"))
    assert len(checkpoints) == 2  # what the walk below covers: checkpoints, their manifests, events
    loose = [
        f"{oct(stat.S_IMODE(path.stat().st_mode))} {path.relative_to(runs)}"
        for path in [runs, *runs.rglob("*")]
        if stat.S_IMODE(path.stat().st_mode) != (0o700 if path.is_dir() else 0o600)
    ]
    assert not loose, "\n".join(loose)

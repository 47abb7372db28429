"""The SFT-then-RL example (`examples/sft-then-rl/`), shortened: the scripted expert's episodes
teach the tiny random-init model number search's tool-call format by SFT, where RL alone gets
no signal, and RL goes on from the SFT state. The commands are the README's; the full run's
figures are in the README."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from platoon.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "sft-then-rl"


def evals(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["eval/reward_mean"] for r in rows if "eval/reward_mean" in r}


@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.torch
def test_sft_teaches_the_format_rl_alone_never_finds(tmp_path, monkeypatch, capsys):
    profile = tmp_path / "site.yaml"
    profile.write_text(yaml.safe_dump({"runs": str(tmp_path / "runs"), "cache": str(tmp_path / "cache")}))
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    monkeypatch.chdir(EXAMPLE)
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "number-search"))
    runs = tmp_path / "runs" / "sft-then-rl"
    expert = ["eval", "config.yaml", "--split", "train", "--policy", "scripted:bisect_policy:bisect"]
    assert main([*expert, "eval.max_tasks=64"]) == 0
    assert main(["sft", "config.yaml", "--from", str(runs / "tiny-eval"), "--where", "reward>=1"]) == 0
    rl = ["train.max_training_steps=2", "eval.every=2", "train.save_every=2", "--quiet"]
    assert main(["train", "config.yaml", f"checkpoint.load_path={runs / 'tiny-sft'}", *rl]) == 0
    assert main(["train", "config.yaml", "stats.trial_name=rl-alone", *rl]) == 0
    after_sft, alone = evals(runs / "tiny"), evals(runs / "rl-alone")
    # Measured (seeded, the same every run): the base model 0.0 at steps 0 and 2; the SFT state
    # 0.44 at step 0 (7 of the 16 test tasks, greedy), 0.44 after two RL steps.
    assert alone == {0: 0.0, 2: 0.0}, alone  # the base model never calls the tool right
    assert after_sft[0] >= 0.3, after_sft  # the SFT state solves held-out tasks at once
    out = capsys.readouterr().out
    assert "per token, by epoch" in out

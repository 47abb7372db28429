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


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def evals(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["eval/reward_mean"] for r in rows(run_dir) if "eval/reward_mean" in r}


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
    assert main([*expert, "eval.max_tasks=32"]) == 0  # the README records 64: half the SFT steps
    assert main(["sft", "config.yaml", "--from", str(runs / "tiny-eval"), "--where", "reward>=1"]) == 0
    rl = ["train.max_training_steps=2", "eval.every=2", "train.save_every=2", "--quiet"]
    assert main(["train", "config.yaml", f"checkpoint.load_path={runs / 'tiny-sft'}", *rl]) == 0
    assert main(["train", "config.yaml", "stats.trial_name=rl-alone", *rl]) == 0
    after_sft, alone = evals(runs / "tiny"), evals(runs / "rl-alone")
    # Measured (reproducible): the base model 0.0 at steps 0 and 2 (no group ever told its rollouts
    # apart); from 32 expert episodes the SFT state 0.06 at step 0 and 0.25 after two RL steps
    # (from the README's 64: 0.06 and 0.31). One greedy test task is 0.0625: what holds is that
    # SFT gives RL the signal it lacked.
    assert alone == {0: 0.0, 2: 0.0}, alone  # the base model never calls the tool right
    assert max(after_sft.values()) >= 0.125, after_sft  # from the SFT state, held-out tasks are solved
    trained = lambda run: [r.get("train/datums", 0) for r in rows(runs / run) if "reward/mean" in r]  # noqa: E731
    assert trained("rl-alone") == [0, 0] and sum(trained("tiny")) > 0  # RL has something to learn now
    out = capsys.readouterr().out
    assert "per token, by epoch" in out


def test_the_real_model_config_names_its_model_task_and_expert(monkeypatch):
    """`real-model.yaml` (SmolLM2-135M, measured in the README; too slow to train here) validates,
    trains the catalogue model on the real-model example's sums, and its expert solves every
    training sum in the form the base model writes when right."""
    from platoon.config import load_config

    monkeypatch.syspath_prepend(str(ROOT / "examples" / "real-model"))
    monkeypatch.syspath_prepend(str(EXAMPLE))
    import arithmetic
    from sums_expert import answer

    config = load_config(EXAMPLE / "real-model.yaml")
    assert (config.train.model_name, config.train.renderer_name) == ("smollm2-135m", "smollm2")
    [entry] = config.environments
    assert (entry.service, entry.package) == ("python://arithmetic:Sums", "arithmetic")
    for task in arithmetic.Sums.list_tasks("train"):
        [prompt] = arithmetic.Sums(task_spec=task).get_prompt()
        reply = answer([{"role": "user", "content": prompt.text}])
        assert reply == f"{task['a']} + {task['b']} = {task['a'] + task['b']}"
        assert arithmetic.last_number(reply) == task["a"] + task["b"]
    readme = (EXAMPLE / "README.md").read_text()
    assert "PYTHONPATH=../real-model platoon eval real-model.yaml" in readme
    assert "--policy scripted:sums_expert:answer" in readme

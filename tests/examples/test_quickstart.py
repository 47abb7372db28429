"""The quickstart as the README gives it, on a fresh clone: no site profile of the user's, no
model, no account. The commands run in process through `platoon.cli.main`, from the example's
directory with it on the import path (as `PYTHONPATH=.` does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from platoon.bus import read_events
from platoon.bus.events import EpisodeGraded, ModelCallFinished, ToolReturned
from platoon.cli import main

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart"
POLICY = "scripted:scripted:binary_search"


@pytest.fixture
def site(tmp_path, monkeypatch):
    profile = tmp_path / "site.yaml"
    profile.write_text(yaml.safe_dump({"runs": str(tmp_path / "runs"), "cache": str(tmp_path / "cache")}))
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    monkeypatch.syspath_prepend(str(QUICKSTART))
    return tmp_path


@pytest.fixture
def in_quickstart(site, monkeypatch):
    monkeypatch.chdir(QUICKSTART)
    return site


def test_rollout_prints_the_agent_tree_with_tool_calls_and_reward_one(in_quickstart, capsys):
    assert main(["rollout", "train.yaml", "--task", "train:train-41", "--policy", POLICY]) == 0
    out = capsys.readouterr().out.splitlines()
    # The tree is printed last, after whatever the environment's SDK logged to stdout on the way.
    lines = out[next(i for i, line in enumerate(out) if line.startswith("episode ")) :]
    tree = "\n".join(lines)
    assert lines[0].endswith("task guess train:train-41")  # the id as listed
    assert "harness example-guesser" in lines[1]
    guesses = [line.strip() for line in lines if line.strip().startswith("tool guess(")]
    assert guesses[0] == 'tool guess({"number": 50})'
    assert guesses[-1] == 'tool guess({"number": 41})'
    assert sum("prompt +" in line and "completion tokens" in line for line in lines) == len(guesses)
    assert "-> Correct! reward=1 finished" in tree
    assert lines[-2].startswith(f"finished: completed after {len(guesses)} model calls")
    assert lines[-1] == "reward: 1"

    run_dir = in_quickstart / "runs" / "quickstart" / "guess-rollout"
    events = list(read_events(run_dir))
    assert sum(isinstance(e, ModelCallFinished) for e in events) == len(guesses)
    assert sum(isinstance(e, ToolReturned) for e in events) == len(guesses)
    assert [e.reward for e in events if isinstance(e, EpisodeGraded)] == [1.0]
    assert (run_dir / "config.yaml").exists() and (run_dir / "lock.json").exists()


def test_eval_writes_a_report_with_pass_at_1_of_one(in_quickstart, capsys):
    assert main(["eval", "eval.yaml", "--policy", POLICY]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary == {"reward_mean": 1.0, "pass@k": {"1": 1.0, "2": 1.0}, "episodes": 40, "failures": {}}
    report = json.loads((in_quickstart / "runs" / "quickstart" / "guess-eval" / "eval.json").read_text())
    assert report["pass_at_k"]["1"] == 1.0
    assert (report["episodes"], report["graded"], report["failures"]) == (40, 40, {})
    assert len(report["tasks"]) == 20 and all(t["rewards"] == [1.0, 1.0] for t in report["tasks"])
    assert report["tokens"]["calls"] >= 40 * 2  # binary search over 1..100: several guesses each


@pytest.mark.learning
@pytest.mark.slow
@pytest.mark.torch
def test_train_local_learns_with_metrics_checkpoints_and_a_summary(site, monkeypatch, capsys):
    """The README's main job: the tiny model built on the spot, trained on CPU, gets better."""
    monkeypatch.chdir(ROOT)
    assert main(["train", "examples/quickstart/train-local.yaml"]) == 0
    run_dir = site / "runs" / "quickstart" / "vowels-local"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 16))
    assert all(m["episodes/total"] == 32 for m in metrics)  # batch_size 4 x group_size 8
    rewards = [m["reward/mean"] for m in metrics]
    assert sum(rewards[-3:]) / 3 >= sum(rewards[:3]) / 3 + 0.3, rewards
    checkpoints = [json.loads(line) for line in (run_dir / "checkpoints.jsonl").read_text().splitlines()]
    assert [c["step"] for c in checkpoints][:3] == [5, 10, 15]  # save_every: 5
    assert (site / "cache" / "models" / "platoon-tiny-qwen3" / "config.json").exists()
    out = capsys.readouterr().out
    assert "trained 15 steps in" in out and f"run     {run_dir}" in out
    assert "first 3 steps" in out and "last 3 steps" in out

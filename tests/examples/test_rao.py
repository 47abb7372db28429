"""examples/rao: every config loads and says what its README says; one trains end to end for
two steps on the embedded backend with the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import msgspec
import pytest

from platoon.api import train
from platoon.assembly import credit_settings as _credit
from platoon.config import load_config

RAO = Path(__file__).resolve().parents[2] / "examples" / "rao"
RUNS = ["single", "recursive", "child-reward-own", "child-reward-mix", "depth-weighting"]


@pytest.mark.parametrize("run", RUNS)
def test_each_run_is_the_comparison_it_names(run):
    local, tinker = load_config(RAO / f"{run}.yaml"), load_config(RAO / f"{run}-tinker.yaml")
    # The same experiment on both services: only the scale and the service differ (the tiny
    # runs keep all-equal groups so that their few steps train at all).
    assert local.environments == tinker.environments
    assert msgspec.structs.replace(_credit(local), remove_constant_groups=True) == _credit(tinker)
    assert (local.train.backend, local.train.model_name) == ("local", "platoon-tiny-qwen3")
    assert (tinker.train.backend, tinker.train.model_name) == ("tinker", "Qwen/Qwen3-4B-Instruct-2507")
    [entry] = local.environments
    assert entry.env == "textcraft-synth"
    credit = _credit(local)
    expected = {
        "single": ("single", "root", "none"),
        "recursive": ("recursive", "root", "none"),
        "child-reward-own": ("recursive", "own", "none"),
        "child-reward-mix": ("recursive", "mix", "none"),
        "depth-weighting": ("recursive", "own", "inverse_count"),
    }[run]
    assert (entry.program, credit.subagent_reward, credit.depth_weighting) == expected
    if entry.program == "recursive":
        assert (entry.agents.max_depth, entry.agents.fork) == (2, "shared")


@pytest.mark.slow
@pytest.mark.torch
def test_a_rao_config_trains_two_steps_on_the_embedded_backend(tmp_path, monkeypatch):
    pytest.importorskip("peft")
    site = tmp_path / "site.yaml"
    site.write_text(f"runs: {tmp_path / 'runs'}\ncache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    config = load_config(RAO / "depth-weighting.yaml", ["train.max_training_steps=2"])
    run_dir = tmp_path / "run"
    anyio.run(lambda: train(config, run_dir=run_dir, console=False))
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    # 2 tasks x 4 rollouts, every episode graded and trained on.
    assert all(m["episodes/graded"] == 8 and m["train/datums"] >= 8 for m in metrics)
    assert metrics[-1]["policy/version"] == 2


@pytest.mark.learning
@pytest.mark.slow
@pytest.mark.torch
def test_the_cpu_config_grows_real_subagents_and_both_depths_learn(train_example):
    """cpu.yaml as written: the root delegates all but one word of its line to subagents the
    tiny model plays, graded on their own words; the root's and the subagents' calls train at
    their depths, and the mean reward of each depth rises."""
    from platoon.bus.events import AgentSpawned, ModelCallFinished

    config, run_dir, events = train_example(RAO / "cpu.yaml")
    assert config.environments[0].agents.child_reward == "own"
    spawned = {e.agent_id: e for e in events if isinstance(e, AgentSpawned)}
    assert {e.harness for e in spawned.values() if e.depth == 1} == {"rao-cpu-word"}
    sampled_depths = {spawned[e.agent_id].depth for e in events if isinstance(e, ModelCallFinished)}
    assert sampled_depths == {0, 1}
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == config.train.max_training_steps
    assert all(m["credit/depth/0/agents"] == 32 and m["credit/depth/1/agents"] >= 32 for m in metrics)
    for depth in (0, 1):
        rewards = [m[f"credit/depth/{depth}/reward_mean"] for m in metrics]
        first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
        assert last > first + 0.3, (depth, rewards)

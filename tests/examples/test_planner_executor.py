"""examples/planner-executor: two policies trained together in one run, each improving at its
own role; the Tinker config is the same experiment on hosted models."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import msgspec
import pytest

from platoon.api import train
from platoon.config import load_config
from platoon.config.policies import resolve_policies

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "planner-executor"


def test_the_tinker_config_is_the_same_experiment_on_hosted_models():
    cpu, tinker = load_config(EXAMPLE / "cpu.yaml"), load_config(EXAMPLE / "tinker.yaml")
    assert cpu.environments == tinker.environments
    assert list(cpu.policies) == list(tinker.policies) == ["planner", "executor"]
    local, hosted = resolve_policies(cpu), resolve_policies(tinker)
    assert {s.train.backend for s in local.values()} == {"local"}
    assert {s.train.model_name for s in local.values()} == {"platoon-tiny-qwen3"}
    assert {n: (s.train.backend, s.train.model_name) for n, s in hosted.items()} == {
        "planner": ("tinker", "Qwen/Qwen3-4B-Instruct-2507"),
        "executor": ("tinker", "Qwen/Qwen3-1.7B"),
    }
    assert not any(s.frozen for s in [*local.values(), *hosted.values()])
    # the schedule and the loss are the same; the scale and the service differ
    scale = {"batch_size", "max_training_steps", "save_every", "backend", "model_name", "workflow_config"}
    local_train, hosted_train = (
        {k: v for k, v in msgspec.structs.asdict(c.train).items() if k not in scale} for c in (cpu, tinker)
    )
    assert local_train == hosted_train


@pytest.mark.learning
@pytest.mark.slow
@pytest.mark.torch
def test_two_tiny_policies_trained_together_each_improve_at_their_role(train_example):
    """cpu.yaml, its first 10 of 15 steps: the planner (every episode's root) is sampled from one
    LoRA adapter, the executor it delegates to (opened with the role "executor") from another;
    each policy's calls train only its own adapter, and each one's own reward rises. Measured
    (reproducible): planner 0.34 -> 0.65 over steps 8-10, executor 0.64 -> 0.98."""
    from platoon.bus.events import AgentSpawned, BatchReady, ModelCallFinished, PolicyUpdated

    config, run_dir, events = train_example(EXAMPLE / "cpu.yaml", ["train.max_training_steps=10"])
    spawned = {e.agent_id: e for e in events if isinstance(e, AgentSpawned)}
    assert {(e.depth, e.harness, e.policy) for e in spawned.values()} == {
        (0, "duet-planner", "planner"),
        (1, "duet-executor", "executor"),
    }
    # every call was sampled by the policy of the agent that made it, and trains only that policy
    calls = [e for e in events if isinstance(e, ModelCallFinished)]
    assert all(call.policy == spawned[call.agent_id].policy for call in calls)
    batches = [e for e in events if isinstance(e, BatchReady)]
    assert {b.policy for b in batches} == {"planner", "executor"}
    for batch in batches:
        assert {spawned[d.agent_id].policy for d in batch.datums} <= {batch.policy}
    # each policy's weights move on their own
    updates = [e for e in events if isinstance(e, PolicyUpdated)]
    assert {u.policy for u in updates} == {"planner", "executor"}
    assert len({u.sampler_path.split("/sampler_weights/")[0] for u in updates}) == 2

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, config.train.max_training_steps + 1))
    curves = {}
    for policy in ("planner", "executor"):
        rewards = curves[policy] = [m[f"{policy}/reward/mean"] for m in metrics]
        first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
        assert last > first + 0.1, (policy, rewards)
        assert metrics[-1][f"{policy}/policy/version"] >= 1
        saved = (run_dir / "checkpoints" / policy / "checkpoints.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in saved] == [config.train.max_training_steps]
    print("reward curves:", json.dumps({p: [round(r, 3) for r in c] for p, c in curves.items()}))


@pytest.mark.slow
@pytest.mark.torch
def test_each_policy_checkpoints_on_its_own_and_a_resume_goes_on_from_the_step_they_all_saved(
    tmp_path, monkeypatch
):
    pytest.importorskip("peft")
    from platoon.assembly import import_packages
    from platoon.train.checkpoints import ResumeError

    site = tmp_path / "site.yaml"
    site.write_text(f"runs: {tmp_path / 'runs'}\ncache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    small = [
        "train.save_every=1",
        "train.batch_size=1",
        "train.workflow_config.group_size=4",
        "train.workflow_config.remove_constant_reward_groups=false",  # every step trains both
    ]
    config = load_config(EXAMPLE / "cpu.yaml", [*small, "train.max_training_steps=2"])
    import_packages(config, EXAMPLE)
    run_dir = tmp_path / "run"
    anyio.run(lambda: train(config, run_dir=run_dir, console=False))

    def saved(policy: str) -> list[dict]:
        path = run_dir / "checkpoints" / policy / "checkpoints.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    assert [c["step"] for c in saved("planner")] == [c["step"] for c in saved("executor")] == [1, 2]
    assert not (run_dir / "checkpoints.jsonl").exists()
    # The run is what its policies are: a resume that changes one is refused before anything runs.
    changed = load_config(EXAMPLE / "cpu.yaml", [*small, "policies.executor.lora_rank=4"])
    with pytest.raises(ResumeError, match="policies"):
        anyio.run(lambda: train(changed, run_dir=run_dir, resume=True, console=False))

    longer = load_config(EXAMPLE / "cpu.yaml", [*small, "train.max_training_steps=3"])
    anyio.run(lambda: train(longer, run_dir=run_dir, resume=True, console=False))
    assert json.loads((run_dir / "lock.json").read_text())["resumed_from_step"] == 2
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]  # each step once
    for policy in ("planner", "executor"):
        assert [c["step"] for c in saved(policy)] == [1, 2, 3]
        assert [m[f"{policy}/policy/version"] for m in metrics] == [1.0, 2.0, 3.0]

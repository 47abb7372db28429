"""The training loop, read top to bottom.

    for step in steps:
        wait until the trainer is at most `max_staleness` steps behind
        request `batch_size` tasks x `group_size` rollouts for this step
        (episodes play, get graded; the credit assigner makes a batch; the trainer trains
         on it and publishes new sampler weights, which the gateway switches to)
        evaluate every `eval.every` steps

The loop is the `Scheduler` component; everything between requesting rollouts and the new
policy happens in the other components on the bus (built by `platoon.assembly`), which is why
the loop itself is this short. The scheduler learns the policy version from `PolicyUpdated`,
that a rollout worker is there from `WorkerStatus`, and asks the evaluator with
`EvalRequested`. With `max_staleness: 0` a step's rollouts start only after the previous step
trained (strictly on-policy); with 1, the rollouts of step s run while step s-1 trains.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import structlog

from platoon.bus import Bus, ComponentBase, Stream
from platoon.bus.events import (
    EpisodeRequested,
    EvalRequested,
    Evaluated,
    Event,
    PolicyUpdated,
    RunFinished,
    TaskRef,
    TasksListed,
    TasksRequested,
    TrainStepFinished,
    WorkerStatus,
    derive_seed,
    new_id,
)
from platoon.errors import sole_error
from platoon.train.evaluate import list_tasks

__all__ = ["NothingGraded", "Scheduler", "SchedulerSettings", "TaskOrder"]

log = structlog.get_logger("platoon.train")


class TaskOrder:
    """Which tasks each step trains on: a pure function of the seed and the step.

    Each environment entry's tasks are shuffled per epoch with the seed; each slot of a step
    draws an entry by weight. Resuming at step s therefore requests exactly the tasks the
    interrupted run would have, without storing more than the step.
    """

    def __init__(
        self, tasks: dict[str, list[TaskRef]], weights: dict[str, float], batch_size: int, seed: int
    ):
        self.tasks = {name: list(found) for name, found in tasks.items() if found}
        if not self.tasks:
            raise ValueError("no training tasks: every environment's train split is empty")
        self.weights = {name: weights.get(name, 1.0) for name in self.tasks}
        self.batch_size = batch_size
        self.seed = seed
        self._drawn: list[str] = []
        # One generator for the whole sequence of draws, however the steps are asked for.
        self._rng = random.Random(f"{seed}:entries")

    def for_step(self, step: int) -> list[TaskRef]:
        names = list(self.tasks)
        while len(self._drawn) < (step + 1) * self.batch_size:
            self._drawn.append(
                self._rng.choices(names, [self.weights[n] for n in names])[0] if len(names) > 1 else names[0]
            )
        counts: dict[str, int] = dict.fromkeys(names, 0)
        for name in self._drawn[: step * self.batch_size]:
            counts[name] += 1
        out = []
        for name in self._drawn[step * self.batch_size : (step + 1) * self.batch_size]:
            out.append(self._task(name, counts[name]))
            counts[name] += 1
        return out

    def _task(self, name: str, position: int) -> TaskRef:
        tasks = self.tasks[name]
        epoch, index = divmod(position, len(tasks))
        order = list(range(len(tasks)))
        random.Random(f"{self.seed}:{name}:{epoch}").shuffle(order)
        return tasks[order[index]]


@dataclass(frozen=True)
class SchedulerSettings:
    """The training loop's: which tasks, how many, how far ahead of the trainer."""

    splits: dict[str, str]  # entry name -> its train split
    weights: dict[str, float]
    batch_size: int
    group_size: int
    seed: int
    total_steps: int | None
    max_staleness: int
    eval_every: int | None = None  # None: no evaluation during training
    eval_at_start: bool = False
    wait_for_workers: bool = False  # NATS: no rollouts until a worker is heard from
    policies: tuple[str, ...] = ("default",)  # the trained policies: each episode asks each for its version


class Scheduler(ComponentBase):
    """The loop of the module docstring, as a component.

    Its settings (`SchedulerSettings`, resolved by `platoon.assembly`) say which tasks and how many; it starts
    at `start_step` with the policy at `version` (a resumed run's checkpoint). Once every step
    has trained and every evaluation is done it publishes `RunFinished` and sets `done`."""

    name = "scheduler"
    subscribes: tuple[type[Event], ...] = (
        PolicyUpdated,
        TrainStepFinished,
        WorkerStatus,
        TasksListed,
        Evaluated,
    )
    publishes: tuple[type[Event], ...] = (TasksRequested, EpisodeRequested, EvalRequested, RunFinished)

    def __init__(
        self,
        settings: SchedulerSettings,
        *,
        start_step: int = 0,
        version: int = 0,
        versions: dict[str, int] | None = None,
    ) -> None:
        self.settings = settings
        self.start_step = start_step
        # each trained policy's newest version heard of (RFC 0001); `version` is the oldest
        self.versions = dict(versions) if versions is not None else dict.fromkeys(settings.policies, version)
        self.version = min(self.versions.values(), default=version)
        self.trained = start_step  # steps whose TrainStepFinished we have seen
        self.last: dict[str, Any] = {}  # the last step's metrics
        self.done = anyio.Event()
        self._changed = anyio.Event()
        self._worker = anyio.Event()
        self._events: Stream[Event] | None = None

    def on_attach(self, bus: Bus) -> None:
        # One subscription, so that a step's PolicyUpdated is always seen before its
        # TrainStepFinished (the trainer publishes them in that order).
        heard = (PolicyUpdated, TrainStepFinished, WorkerStatus)
        self._events = bus.stream(heard, name=self.name).open()

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        try:
            async with anyio.create_task_group() as follow:
                async with anyio.create_task_group() as evals:
                    follow.start_soon(self._follow, bus, evals)
                    await self._schedule(bus, evals)
                await bus.publish(RunFinished(status="completed"))
                self.done.set()
                follow.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            error = sole_error(group)
            if isinstance(error, BaseExceptionGroup) or not isinstance(error, Exception):
                raise  # several errors, or a cancellation: as they are
            raise error from None  # the run fails with what failed (NothingGraded, say) itself

    async def _schedule(self, bus: Bus, evals: anyio.abc.TaskGroup) -> None:
        s = self.settings
        tasks = {name: await list_tasks(bus, name, split) for name, split in s.splits.items()}
        order = TaskOrder(tasks, s.weights, s.batch_size, s.seed)
        steps = (
            s.total_steps
            if s.total_steps is not None
            else -(-sum(map(len, order.tasks.values())) // s.batch_size)
        )
        if s.wait_for_workers and not self._worker.is_set():
            log.info("waiting for a rollout worker (platoon worker CONFIG)")
            await self._worker.wait()
        if s.eval_at_start and self.start_step == 0:
            await self._evaluate(bus, 0)
        for step in range(self.start_step, steps):
            while self.trained < step - s.max_staleness:
                await self._step_trained()
            for slot, task in enumerate(order.for_step(step)):
                group_id = new_id()
                for attempt in range(s.group_size):
                    await bus.publish(
                        EpisodeRequested(
                            episode_id=new_id(),
                            group_id=group_id,
                            task=task,
                            purpose="train",
                            step=step,
                            policy_version=self.version,
                            policy_versions=dict(self.versions),
                            seed=derive_seed(s.seed, "train", step, slot, attempt),
                        )
                    )
        while self.trained < steps:
            await self._step_trained()

    async def _step_trained(self) -> None:
        await self._changed.wait()
        self._changed = anyio.Event()

    async def _follow(self, bus: Bus, evals: anyio.abc.TaskGroup) -> None:
        """What the scheduler hears: new policies, finished steps, workers."""
        assert self._events is not None
        with self._events as events:
            async for event in events:
                match event:
                    case PolicyUpdated() if self.versions:
                        if event.policy in self.versions:
                            self.versions[event.policy] = max(self.versions[event.policy], event.version)
                            self.version = min(self.versions.values())
                    case PolicyUpdated():
                        self.version = max(self.version, event.version)
                    case TrainStepFinished():
                        self.trained = event.step + 1
                        self.last = event.metrics
                        if event.step == self.start_step:
                            _check_graded(event.metrics)
                        every = self.settings.eval_every
                        if every and self.trained % every == 0:
                            evals.start_soon(self._evaluate, bus, self.trained)
                        self._changed.set()
                    case WorkerStatus(refused=None):
                        self._worker.set()

    async def _evaluate(self, bus: Bus, step: int) -> None:
        await bus.request(EvalRequested(step=step, policy_version=self.version), timeout=None)


class NothingGraded(RuntimeError):
    """The first step graded none of its episodes: training on would learn nothing."""


def _check_graded(metrics: dict[str, Any]) -> None:
    if metrics.get("episodes/graded", 0) or not metrics.get("episodes/total", 0):
        return
    failed = {
        k.removeprefix("episodes/failed/"): int(v)
        for k, v in metrics.items()
        if k.startswith("episodes/failed/")
    }
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(failed.items())) or "no reason recorded"
    if set(failed) <= {"no_reward", "other"}:  # ended well, yet carried no reward: how to give one
        advice = (
            "an ORS environment grades an episode by the reward of the tool result that finished it "
            "(give that result a reward), or by the sum of its rewards (platoon_reward = 'sum' on the "
            "class, or service_kwargs: {reward: sum}); "
        )
    else:  # they failed: the warnings above and each episode's reason say where
        advice = "each failed before it could be graded (the lines above say where); "
    raise NothingGraded(
        f"no episode of the first step was graded ({why}), so there is nothing to learn from; {advice}"
        "`platoon events RUN_DIR --type EpisodeGraded` shows each episode's reason"
    )

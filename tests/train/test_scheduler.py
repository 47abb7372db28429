"""The scheduler and the evaluator are components: they learn the policy version from
`PolicyUpdated`, that a worker is there from `WorkerStatus`, and evaluate on `EvalRequested`,
with no reference to another component."""

from __future__ import annotations

import anyio
import pytest

from platoon.assembly import EvalSettings, SchedulerSettings
from platoon.bus import Bus, running
from platoon.bus.events import (
    EpisodeGraded,
    EpisodeRequested,
    EvalFinished,
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
)
from platoon.train.evaluate import Evaluator
from platoon.train.loop import NothingGraded, Scheduler

pytestmark = pytest.mark.anyio

TASKS = {"train": [TaskRef(env="e", split="train", task_id=f"t{i}") for i in range(4)]}


def settings(**overrides) -> SchedulerSettings:
    values = {
        "splits": {"e": "train"},
        "weights": {},
        "batch_size": 2,
        "group_size": 2,
        "seed": 0,
        "total_steps": 3,
        "max_staleness": 0,
    }
    return SchedulerSettings(**(values | overrides))


class Tasks:
    """An env service that only lists tasks."""

    async def run(self, bus: Bus) -> None:
        async with bus.stream(TasksRequested) as requests:
            async for request in requests:
                tasks = TASKS.get(request.split, [])
                await bus.publish(TasksListed(reply_to=request.request_id, tasks=tasks))


class Trains:
    """A trainer that steps once a step's episodes are all requested: a new policy, then the step."""

    def __init__(self, per_step: int, graded: int = 1) -> None:
        self.per_step = per_step
        self.graded = graded
        self.version = 0

    async def run(self, bus: Bus) -> None:
        counts: dict[int, int] = {}
        async with bus.stream(EpisodeRequested) as requests:
            async for request in requests:
                if request.purpose != "train":
                    continue
                counts[request.step] = counts.get(request.step, 0) + 1
                if counts[request.step] == self.per_step:
                    self.version += 1
                    await bus.publish(PolicyUpdated(version=self.version, sampler_path=f"s{self.version}"))
                    metrics = {"episodes/total": float(self.per_step), "episodes/graded": float(self.graded)}
                    await bus.publish(TrainStepFinished(step=request.step, metrics=metrics))


class Evaluates:
    """An evaluator that answers at once, noting each request."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []

    async def run(self, bus: Bus) -> None:
        async with bus.stream(EvalRequested) as requests:
            async for request in requests:
                self.asked.append((request.step, request.policy_version))
                await bus.publish(Evaluated(reply_to=request.request_id, step=request.step))


async def play(components, *, until=RunFinished, before=None) -> list[Event]:
    seen: list[Event] = []
    async with Bus() as bus:
        async with bus.stream(Event) as events, running(bus, components):
            if before is not None:
                await before(bus)
            async for event in events:
                seen.append(event)
                if isinstance(event, until):
                    break
            events.close()  # nothing reads it any more: the run need not wait for it to drain
    return seen


async def test_each_step_is_requested_on_the_policy_the_last_step_made():
    scheduler = Scheduler(settings(), version=0)
    seen = await play([Tasks(), Trains(per_step=4), scheduler])
    requests = [e for e in seen if isinstance(e, EpisodeRequested)]
    assert [(r.step, r.policy_version) for r in requests] == [(s, s) for s in range(3) for _ in range(4)]
    # group_size rollouts of each task share a group.
    assert len({r.group_id for r in requests}) == 6
    assert scheduler.done.is_set() and scheduler.trained == 3
    assert scheduler.last == {"episodes/total": 4.0, "episodes/graded": 1.0}


async def test_each_episode_gets_a_sampling_seed_that_only_the_run_seed_step_and_place_decide():
    async def seeds(seed: int) -> list[int | None]:
        seen = await play([Tasks(), Trains(per_step=4), Scheduler(settings(seed=seed))])
        return [e.seed for e in seen if isinstance(e, EpisodeRequested)]

    first = await seeds(0)
    assert len(set(first)) == 12 and None not in first  # 3 steps x 2 tasks x 2 attempts, all distinct
    assert await seeds(0) == first  # a rerun draws the same samples
    assert set(await seeds(1)).isdisjoint(first)


async def test_a_resumed_run_starts_at_its_step_and_version():
    scheduler = Scheduler(settings(), start_step=2, version=7)
    trainer = Trains(per_step=4)
    trainer.version = 7
    seen = await play([Tasks(), trainer, scheduler])
    requests = [e for e in seen if isinstance(e, EpisodeRequested)]
    assert {(r.step, r.policy_version) for r in requests} == {(2, 7)}


async def test_evaluations_come_at_the_start_and_every_few_steps_and_end_the_run_only_when_done():
    evaluator = Evaluates()
    scheduler = Scheduler(settings(total_steps=4, eval_every=2, eval_at_start=True))
    seen = await play([Tasks(), Trains(per_step=4), evaluator, scheduler])
    assert evaluator.asked == [(0, 0), (2, 2), (4, 4)]
    kinds = [type(e) for e in seen if isinstance(e, (EvalRequested, EpisodeRequested, RunFinished))]
    assert kinds[0] is EvalRequested and kinds[1] is EpisodeRequested  # the first eval, then training
    answered = [i for i, e in enumerate(seen) if isinstance(e, Evaluated)]
    assert len(answered) == 3 and answered[-1] < len(seen) - 1  # RunFinished after the last answer


async def test_a_distributed_run_waits_for_a_worker_before_it_requests_anything():
    scheduler = Scheduler(settings(total_steps=1, wait_for_workers=True))
    requested = anyio.Event()

    async def watch(bus: Bus) -> None:
        async def note(_: EpisodeRequested) -> None:
            requested.set()

        bus.subscribe(EpisodeRequested, note)
        with anyio.move_on_after(0.2):
            await requested.wait()
        assert not requested.is_set()  # no worker yet: nothing is requested
        await bus.publish(WorkerStatus(worker="w1"))

    seen = await play([Tasks(), Trains(per_step=4), scheduler], before=watch)
    assert sum(isinstance(e, EpisodeRequested) for e in seen) == 4


async def test_a_first_step_with_nothing_graded_stops_the_run():
    with pytest.raises(BaseExceptionGroup) as stopped:
        await play([Tasks(), Trains(per_step=4, graded=0), Scheduler(settings())])
    assert stopped.group_contains(NothingGraded, depth=3)


def evaluator_settings(**overrides) -> EvalSettings:
    values = {
        "splits": {"e": "eval"},
        "max_tasks": None,
        "group_size": 1,
        "concurrency": 2,
        "report": "evals/step-{step:06d}.json",
        "optional": True,
    }
    return EvalSettings(**(values | overrides))


class Grades:
    """A runner and grader in one: every episode gets reward 1."""

    async def run(self, bus: Bus) -> None:
        async with bus.stream(EpisodeRequested) as requests:
            async for r in requests:
                await bus.publish(
                    EpisodeGraded(episode_id=r.episode_id, group_id=r.group_id, task=r.task, reward=1.0)
                )


async def test_the_evaluator_answers_a_request_with_its_report(tmp_path):
    TASKS["eval"] = [TaskRef(env="e", split="eval", task_id="q")]
    try:
        evaluator = Evaluator(evaluator_settings(), run_dir=tmp_path)
        async with Bus() as bus, running(bus, [Tasks(), Grades(), evaluator]):
            async with bus.stream(EvalFinished) as finished:
                reply = await bus.request(EvalRequested(step=3, policy_version=2), timeout=None)
                metrics = await finished.receive()
        assert isinstance(reply, Evaluated) and reply.step == 3
        assert reply.report_path == str(tmp_path / "evals" / "step-000003.json")
        assert metrics.step == 3 and metrics.metrics["eval/reward_mean"] == 1.0
    finally:
        TASKS.pop("eval")


async def test_a_seeded_evaluation_seeds_each_episode_by_step_task_and_attempt(tmp_path):
    TASKS["eval"] = [TaskRef(env="e", split="eval", task_id=f"q{i}") for i in range(2)]
    try:

        async def seeds(step: int) -> list[int | None]:
            evaluator = Evaluator(evaluator_settings(group_size=2, seed=3), run_dir=tmp_path)
            async with Bus() as bus, running(bus, [Tasks(), Grades(), evaluator]):
                async with bus.stream(EpisodeRequested) as requested:
                    await bus.request(EvalRequested(step=step), timeout=None)
                    return [(await requested.receive()).seed for _ in range(4)]

        at_one = await seeds(1)
        assert sorted(at_one) == sorted(await seeds(1)) and len(set(at_one)) == 4
        assert set(await seeds(2)).isdisjoint(at_one)
    finally:
        TASKS.pop("eval")


async def test_during_training_an_empty_eval_split_evaluates_nothing(tmp_path):
    evaluator = Evaluator(evaluator_settings(), run_dir=tmp_path)
    async with Bus() as bus, running(bus, [Tasks(), evaluator]):
        reply = await bus.request(EvalRequested(step=1), timeout=None)
    assert isinstance(reply, Evaluated) and reply.report_path is None
    assert not (tmp_path / "evals").exists()

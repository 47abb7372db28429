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
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import msgspec
import structlog

from platoon import system
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
from platoon.config import Config, load_config, load_site, run_dir
from platoon.train.checkpoints import CheckpointStore, ResumeError
from platoon.train.evaluate import evaluate_config, list_tasks

__all__ = ["Scheduler", "SchedulerSettings", "TaskOrder", "run", "train", "train_command"]

log = structlog.get_logger("platoon.train")


def __getattr__(name: str) -> Any:
    if name == "_credit":  # its old name, for callers; imported late, as assembly imports this module
        from platoon.assembly import credit_settings

        return credit_settings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


TINY_MODEL = system.TINY_MODEL


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
    policies: tuple[str, ...] = ("default",)  # the trained policies, whose versions episodes ask for
    several: bool = False  # `policies:`: each episode asks each policy for its own version


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
        self.version = version  # the newest policy version heard of
        # several policies (RFC 0001): each trained one's newest version; `version` is the oldest
        if versions is None and settings.several:
            versions = dict.fromkeys(settings.policies, version)
        self.versions = dict(versions or {})
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
            error: BaseException = group
            while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
                error = error.exceptions[0]
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
                    case WorkerStatus():
                        self._worker.set()

    async def _evaluate(self, bus: Bus, step: int) -> None:
        await bus.request(EvalRequested(step=step, policy_version=self.version), timeout=None)


async def train(
    config: Config,
    *,
    run_dir: Path,
    resume: bool = False,
    console: bool = True,
    sampler_factory: Any = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Train as `config` says, writing into `run_dir`; returns the last step's metrics.

    `sampler_factory` replaces the training service's sampler for rollouts (a scripted policy
    in tests and demos). With `nats:` in the config the trainer plays no rollouts: workers
    (`platoon worker`) do, see `platoon.train.distributed`."""
    from platoon.assembly import assemble

    if config.train is None:
        raise ValueError("the config has no train: section")
    run = assemble(
        config,
        "train",
        run_dir=run_dir,
        resume=resume,
        console=console,
        live=progress,
        sampler_factory=sampler_factory,
    )
    async with run.running():
        scheduler = run.component(Scheduler)
        await scheduler.done.wait()
    return scheduler.last


class RunStopped(RuntimeError):
    """A training run ended by an error it could not go on past; the message says how to resume."""


def how_to_resume(args: Any, directory: Path) -> str:
    """Where a stopped run stands and the command that goes on with it (secrets left out)."""
    import shlex

    from platoon.config.redact import redact_text

    try:
        stores = [CheckpointStore(d) for d in sorted((directory / "checkpoints").glob("*")) if d.is_dir()]
        found = [store.latest() for store in stores or [CheckpointStore(directory)]]
        # several policies: a resume starts from the newest step all of them saved
        latest = None if None in found else min(found, key=lambda c: c.step)  # type: ignore[union-attr]
    except ResumeError:
        latest = None
    command = " ".join(
        [
            "platoon train",
            shlex.quote(str(args.config)),
            *(shlex.quote(o) for o in getattr(args, "overrides", None) or ()),
            "--resume",
            shlex.quote(str(directory)),
        ]
    )
    where = (
        f"its last checkpoint is after step {latest.step + 1}, so a resume trains from step {latest.step + 2}"
        if latest
        else "it has no checkpoint yet, so a resume starts it again from step 1"
    )
    return f"the run stopped; {where}: {redact_text(command)}"


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
    raise NothingGraded(
        f"no episode of the first step was graded ({why}), so there is nothing to learn from; "
        "an ORS environment grades an episode by the reward of the tool result that finished it "
        "(give that result a reward), or by the sum of its rewards (platoon_reward = 'sum' on the "
        "class, or service_kwargs: {reward: sum}); `platoon events RUN_DIR --type EpisodeGraded` "
        "shows each episode's reason"
    )


# What a training run leaves (a rollout or an eval of the same config shares the directory).
_RUN_FILES = ("identity.json", "metrics.jsonl", "checkpoints.jsonl")


def _holds_run(directory: Path) -> bool:
    return any((directory / name).exists() for name in _RUN_FILES)


def _claimed(config: Config, directory: Path, *, new_trial: bool, overwrite: bool) -> tuple[Config, Path]:
    """The config and directory a new run writes to, when its directory may hold a run already:
    refused with the three ways on, or a numbered new trial beside it, or the old run deleted."""
    if not _holds_run(directory):
        return config, directory
    n = 2
    while _holds_run(directory.with_name(f"{directory.name}-{n}")):
        n += 1
    beside = directory.with_name(f"{directory.name}-{n}")
    if new_trial:
        stats = msgspec.structs.replace(config.stats, trial_name=beside.name)
        return msgspec.structs.replace(config, stats=stats), beside
    if overwrite:
        import shutil

        shutil.rmtree(directory)
        return config, directory
    from platoon.cli import CommandError

    raise CommandError(
        f"{directory} already holds a run: pass --resume {directory} to continue it, --new-trial to "
        f"train as {beside.name} beside it, or --overwrite to delete it and start over"
    )


def train_command(args: Any) -> int:
    """`platoon train CONFIG [KEY=VALUE ...] [--resume RUN_DIR]`."""
    path = Path(args.config)
    config = load_config(path, args.overrides)
    system.import_packages(config, path.resolve().parent)
    system.check_training_service(config)
    if getattr(args, "resume", None):
        directory = Path(args.resume)
    else:
        directory = run_dir(config, load_site())
        config, directory = _claimed(
            config,
            directory,
            new_trial=getattr(args, "new_trial", False),
            overwrite=getattr(args, "overwrite", False),
        )
    started = time.monotonic()
    live = sys.stderr.isatty() and not getattr(args, "quiet", False)
    resume = bool(getattr(args, "resume", None))
    from platoon.cli.run import run_async

    try:
        run_async(lambda: train(config, run_dir=directory, resume=resume, progress=live))
    except KeyboardInterrupt:
        if (directory / "identity.json").exists():
            print(f"platoon: {how_to_resume(args, directory)}", file=sys.stderr)
        raise
    except (ResumeError, NothingGraded):
        raise  # their messages say what to do
    except Exception as exc:
        if not (directory / "identity.json").exists():
            raise  # it failed before the run was set up: there is nothing to resume
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]  # type: ignore[assignment]
        why = str(exc) or type(exc).__name__
        raise RunStopped(f"{why}\n{how_to_resume(args, directory)}") from exc
    from platoon.stats.summary import train_summary

    print(train_summary(directory, time.monotonic() - started))
    return 0


async def run(
    config: Config | str | Path,
    *overrides: str,
    run_dir_path: str | Path | None = None,
    policy: str | None = None,
) -> Any:
    """Run what a config describes from your own async application: train (with its evals)
    when it has `train:`, else evaluate (`policy="scripted:MODULE:ATTR"` evaluates a scripted
    policy). Returns the last step's metrics, or the eval report."""
    if not isinstance(config, Config):
        path = anyio.Path(config)
        config = load_config(Path(config), overrides)
        system.import_packages(config, Path(await path.resolve()).parent)
    directory = Path(run_dir_path) if run_dir_path else run_dir(config, load_site())
    if config.train is not None:
        if policy is not None:
            raise ValueError(
                "policy= plays a scripted policy in an evaluation; this config trains (it has "
                "train:), and training samples the policy it trains"
            )
        return await train(config, run_dir=directory)
    return await evaluate_config(config, directory, policy=policy)

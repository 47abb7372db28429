"""Evaluation: every task of a split, `group_size` attempts each, `concurrency` at a time.

`evaluate` runs on a bus whose env services, gateway, runner and grader are running; it only
publishes `EpisodeRequested` and reads what comes back, so the same code evaluates in
process or through rollout workers on other machines. The `Evaluator` component runs it for
each `EvalRequested` (the scheduler's every `eval.every` steps, or `platoon eval`'s one).
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
import structlog

from platoon.bus import Bus, ComponentBase, Stream
from platoon.bus.events import (
    AgentFinished,
    AgentSpawned,
    EpisodeAbandoned,
    EpisodeGraded,
    EpisodeRequested,
    EvalFinished,
    EvalRequested,
    Evaluated,
    Event,
    ModelCallFinished,
    TaskRef,
    TasksListed,
    TasksRequested,
    derive_seed,
    new_id,
)
from platoon.config.rundir import make_private_dir, write_private
from platoon.stats.failures import failure_kind

__all__ = [
    "EvalReport",
    "EvalSettings",
    "Evaluator",
    "TaskResult",
    "evaluate",
    "list_tasks",
    "pass_at_k",
]

log = structlog.get_logger("platoon.eval")


class TaskResult(msgspec.Struct, kw_only=True):
    env: str
    split: str
    task_id: str
    rewards: list[float | None]
    failures: list[str] = []
    # each graded episode's named rewards (a verifier's side metrics such as `exact`, each rule's
    # part), in the order of `rewards`' graded entries
    parts: list[dict[str, float]] = []


class EvalReport(msgspec.Struct, kw_only=True):
    """What `platoon eval` writes as JSON."""

    step: int
    episodes: int
    graded: int
    reward_mean: float | None
    reward_std: float | None
    pass_at_k: dict[str, float]
    success_threshold: float
    tokens: dict[str, int]
    seconds: float
    failures: dict[str, int]
    by_env: dict[str, dict[str, float]]
    by_depth: dict[str, dict[str, float]]
    tasks: list[TaskResult]
    # several policies: per policy, its agents, their calls and own rewards (as by_depth's)
    by_policy: dict[str, dict[str, float]] = {}
    # the mean of each named reward over the graded episodes that reported it (`exact`, `rule/x`)
    reward_parts: dict[str, float] = {}

    def metrics(self, prefix: str = "eval") -> dict[str, float]:
        out = {f"{prefix}/episodes": float(self.episodes), f"{prefix}/graded": float(self.graded)}
        if self.reward_mean is not None:
            out[f"{prefix}/reward_mean"] = self.reward_mean
        for name, value in self.reward_parts.items():
            out[f"{prefix}/reward/{name}/mean"] = value
        for k, v in self.pass_at_k.items():
            out[f"{prefix}/pass@{k}"] = v
        for env, stats in self.by_env.items():
            for key, value in stats.items():
                out[f"{prefix}/{env}/{key}"] = value
        if len(self.by_depth) > 1:  # a single-agent run has nothing to break down
            for depth, stats in self.by_depth.items():
                for key, value in stats.items():
                    out[f"{prefix}/depth{depth}/{key}"] = value
        if self.by_policy:
            for policy, stats in self.by_policy.items():
                for key, value in stats.items():
                    out[f"{prefix}/{policy}/{key}"] = value
        return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from n attempts with c successes (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


async def list_tasks(bus: Bus, env: str, split: str, *, timeout: float | None = 120.0) -> list[TaskRef]:
    reply = await bus.request(TasksRequested(env=env, split=split), timeout=timeout)
    if reply.error is not None:
        raise ValueError(f"cannot list the tasks of {env!r} split {split!r}: {reply.error}")
    return list(reply.tasks)


@dataclass
class _Tally:
    """What an evaluation counts of its own episodes, as their events come: their tokens and
    agents, then their grades (each frees a place for the next request)."""

    total: int
    limiter: anyio.Semaphore
    progress: Callable[[int, int], None] | None
    graded: dict[str, EpisodeGraded] = field(default_factory=dict)
    mine: dict[str, TaskRef] = field(default_factory=dict)
    tokens: Counter[str] = field(default_factory=Counter)
    agents: _AgentStats = field(default_factory=lambda: _AgentStats())
    all_done: anyio.Event = field(default_factory=anyio.Event)

    async def collect(self, events: AsyncIterator[Event]) -> None:
        mine, agents = self.mine, self.agents
        async for event in events:
            match event:
                case ModelCallFinished() if event.episode_id in mine:
                    self.tokens["prompt"] += len(event.prompt_tokens)
                    self.tokens["completion"] += len(event.completion_tokens)
                    self.tokens["calls"] += 1
                    agents.calls[event.agent_id] += 1
                case AgentSpawned() if event.episode_id in mine:
                    agents.depth[event.agent_id] = (event.episode_id, event.depth)
                    agents.policy[event.agent_id] = event.policy
                case AgentFinished(reward=float(reward)) if event.episode_id in mine:
                    agents.reward[event.agent_id] = reward
                case EpisodeAbandoned(replaced_by=str(replaced_by)) if event.episode_id in mine:
                    # Re-requested under a new id (its worker went silent): wait for that
                    # one, and count nothing more of the old attempt, should it come back.
                    mine[replaced_by] = mine.pop(event.episode_id)
                    agents.forget(event.episode_id)
                case EpisodeGraded() if event.episode_id in mine and event.episode_id not in self.graded:
                    self.graded[event.episode_id] = event
                    self.limiter.release()
                    if self.progress:
                        self.progress(len(self.graded), self.total)
                    if len(self.graded) == self.total:
                        self.all_done.set()
                        return


@dataclass(frozen=True)
class EvalSettings:
    """The evaluator's: which tasks, how often each, how many at once, where the report goes and
    what counts as solved (`evaluate` takes it whole)."""

    splits: dict[str, str] = field(default_factory=dict)  # entry name -> its eval split
    max_tasks: int | None = None
    group_size: int = 1  # episodes per task
    concurrency: int = 16  # episodes in flight at once
    report: str = "eval.json"  # the report's path in the run directory; {step} is the step
    optional: bool = False  # no tasks found is a warning, not an error (evals during training)
    progress: Callable[[int, int], None] | None = None  # (episodes done, episodes in all)
    seed: int | None = None  # the sampling seeds derive from it (None: unseeded)
    success_threshold: float = 1.0  # an episode whose reward reaches it solved its task


async def evaluate(
    bus: Bus,
    tasks: Sequence[TaskRef],
    settings: EvalSettings | None = None,
    *,
    step: int = 0,
    policy_version: int = 0,
    publish: bool = True,
) -> EvalReport:
    """Run every task `settings.group_size` times and summarise; publishes `EvalFinished` unless
    `publish` is False. `settings`: the evaluator's (None: its defaults).

    With a `seed`, each episode samples with seeds derived from it, the step, the task's place
    and the attempt: the same policy evaluates to the same report."""
    s = settings or EvalSettings()
    group_size, seed = s.group_size, s.seed
    t = _Tally(total=len(tasks) * group_size, limiter=anyio.Semaphore(s.concurrency), progress=s.progress)
    started = time.monotonic()
    # One subscription for everything, so an episode's calls and agents are counted before
    # its grade arrives (events reach one subscriber in publish order).
    async with bus.stream(Event, name="eval") as events, anyio.create_task_group() as tg:
        tg.start_soon(t.collect, events)
        for index, task in enumerate(tasks):
            group_id = new_id()
            for attempt in range(group_size):
                await t.limiter.acquire()
                episode_id = new_id()
                t.mine[episode_id] = task
                await bus.publish(
                    EpisodeRequested(
                        episode_id=episode_id,
                        group_id=group_id,
                        task=task,
                        purpose="eval",
                        step=step,
                        policy_version=policy_version,
                        seed=None if seed is None else derive_seed(seed, "eval", step, index, attempt),
                    )
                )
        if t.total:
            await t.all_done.wait()
        tg.cancel_scope.cancel()
    graded, mine, tokens, agents = t.graded, t.mine, t.tokens, t.agents
    report = _report(
        tasks, graded, mine, group_size, step, s.success_threshold, tokens, time.monotonic() - started
    )
    report.by_depth = agents.by_depth(graded)
    if len(set(agents.policy.values())) > 1:  # one policy: nothing to split
        report.by_policy = agents.by_policy(graded)
    if publish:
        await bus.publish(EvalFinished(step=step, metrics=report.metrics()))
    return report


def _report(
    tasks: Sequence[TaskRef],
    graded: dict[str, EpisodeGraded],
    mine: dict[str, TaskRef],
    group_size: int,
    step: int,
    threshold: float,
    tokens: Counter[str],
    seconds: float,
) -> EvalReport:
    per_task: dict[tuple[str, str, str], TaskResult] = {}
    for task in tasks:
        key = (task.env, task.split, task.task_id)
        per_task.setdefault(key, TaskResult(env=task.env, split=task.split, task_id=task.task_id, rewards=[]))
    failures: Counter[str] = Counter()
    for episode_id, event in graded.items():
        task = mine[episode_id]
        result = per_task[(task.env, task.split, task.task_id)]
        finite = event.reward is not None and math.isfinite(event.reward)
        result.rewards.append(event.reward if finite else None)  # eval.json stays valid JSON
        if finite:
            result.parts.append({k: v for k, v in event.rewards.items() if math.isfinite(v)})
        if not finite:
            reason = (
                failure_kind(event.reason or event.status) if event.reward is None else "non_finite_reward"
            )
            failures[reason] += 1
            result.failures.append(event.reason or event.status)
    rewards = [r for t in per_task.values() for r in t.rewards if r is not None]
    mean = sum(rewards) / len(rewards) if rewards else None
    std = (
        math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        if rewards and mean is not None
        else None
    )
    named: defaultdict[str, list[float]] = defaultdict(list)
    for t in per_task.values():
        for part in t.parts:
            for name, value in part.items():
                named[name].append(value)
    pass_k: dict[str, float] = {}
    for k in sorted({1, group_size}):
        scores = []
        for t in per_task.values():
            n = len(t.rewards)
            if n >= k:
                c = sum(1 for r in t.rewards if r is not None and r >= threshold)
                scores.append(pass_at_k(n, c, k))
        if scores:
            pass_k[str(k)] = sum(scores) / len(scores)
    by_env: dict[str, dict[str, float]] = defaultdict(dict)
    for env in sorted({t.env for t in per_task.values()}):
        env_rewards = [r for t in per_task.values() if t.env == env for r in t.rewards if r is not None]
        if env_rewards:
            by_env[env]["reward_mean"] = sum(env_rewards) / len(env_rewards)
            by_env[env]["episodes"] = float(len(env_rewards))
    return EvalReport(
        step=step,
        episodes=len(graded),
        graded=len(rewards),
        reward_mean=mean,
        reward_std=std,
        pass_at_k=pass_k,
        success_threshold=threshold,
        tokens=dict(tokens),
        seconds=seconds,
        failures=dict(failures),
        by_env=dict(by_env),
        by_depth={},
        tasks=list(per_task.values()),
        reward_parts={name: sum(values) / len(values) for name, values in sorted(named.items())},
    )


class _AgentStats:
    """The agents of the evaluated episodes, for the report's breakdown by depth."""

    def __init__(self) -> None:
        self.depth: dict[str, tuple[str, int]] = {}  # agent id -> (episode id, depth)
        self.calls: Counter[str] = Counter()
        self.reward: dict[str, float] = {}  # subagents' own grades
        self.policy: dict[str, str] = {}  # agent id -> the policy that played it

    def by_policy(self, graded: dict[str, EpisodeGraded]) -> dict[str, dict[str, float]]:
        """`by_depth`'s breakdown, per policy instead of per depth."""
        return self._breakdown(graded, lambda agent_id, depth: self.policy.get(agent_id, "default"))

    def forget(self, episode_id: str) -> None:
        """Drop the agents of an abandoned attempt (the model calls it made stay spent)."""
        for agent_id in [a for a, (episode, _) in self.depth.items() if episode == episode_id]:
            del self.depth[agent_id]

    def by_depth(self, graded: dict[str, EpisodeGraded]) -> dict[str, dict[str, float]]:
        """Per depth: `agents`, `model_calls` and `calls_per_agent`, and `own_reward_mean` over
        the agents with a reward (a root's is its episode's, a subagent's its own grade) with
        `own_rewards` saying how many that is."""
        return self._breakdown(graded, lambda agent_id, depth: str(depth), numeric=True)

    def _breakdown(
        self, graded: dict[str, EpisodeGraded], key_of: Callable[[str, int], str], *, numeric: bool = False
    ) -> dict[str, dict[str, float]]:
        agents: Counter[str] = Counter()
        calls: Counter[str] = Counter()
        rewards: defaultdict[str, list[float]] = defaultdict(list)
        for agent_id, (episode_id, depth) in self.depth.items():
            key = key_of(agent_id, depth)
            agents[key] += 1
            calls[key] += self.calls[agent_id]
            episode = graded.get(episode_id)
            reward = episode.reward if depth == 0 and episode is not None else self.reward.get(agent_id)
            if reward is not None:
                rewards[key].append(reward)
        report: dict[str, dict[str, float]] = {}
        for key in sorted(agents, key=lambda k: (len(k), k) if numeric else (0, k)):
            row = {
                "agents": float(agents[key]),
                "model_calls": float(calls[key]),
                "calls_per_agent": calls[key] / agents[key],
            }
            if rewards[key]:
                row["own_reward_mean"] = sum(rewards[key]) / len(rewards[key])
                row["own_rewards"] = float(len(rewards[key]))
            report[key] = row
        return report


def progress_printer(label: str = "eval", *, console: Any = None) -> Callable[[int, int], None]:
    """A live progress bar of graded episodes on stderr, with ETA (rich; only on a terminal,
    unless `console` is given)."""
    if console is None and not sys.stderr.isatty():
        return lambda done, total: None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

    bar = Progress(
        f"{label} episodes",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        "ETA",
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )
    task: list[Any] = []

    def show(done: int, total: int) -> None:
        if not task:
            bar.start()
            task.append(bar.add_task(label, total=total))
        bar.update(task[0], completed=done, total=total)
        if done >= total:
            bar.stop()

    return show


def as_json(report: Any) -> bytes:
    return msgspec.json.format(msgspec.json.encode(report), indent=2)


class Evaluator(ComponentBase):
    """The evaluator component: answers each `EvalRequested` with an evaluation of its tasks at
    that step (`evaluate`), writes the report into the run directory and replies `Evaluated`.

    It lists its tasks once, at the first request. During training (`settings.optional`) a
    split that cannot be listed, or has no tasks, is a warning and evaluates nothing."""

    name = "evaluator"
    subscribes: tuple[type[Event], ...] = (
        EvalRequested,
        TasksListed,
        ModelCallFinished,
        AgentSpawned,
        AgentFinished,
        EpisodeGraded,
        EpisodeAbandoned,
    )
    publishes: tuple[type[Event], ...] = (TasksRequested, EpisodeRequested, EvalFinished, Evaluated)

    def __init__(self, settings: EvalSettings, *, run_dir: Any) -> None:
        from pathlib import Path

        self.settings = settings
        self.run_dir = Path(run_dir)
        self._tasks: list[TaskRef] | None = None
        self._listing = anyio.Lock()
        self._requests: Stream[EvalRequested] | None = None

    def on_attach(self, bus: Bus) -> None:
        self._requests = bus.stream(EvalRequested, name=self.name).open()

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        assert self._requests is not None
        with self._requests as requests:
            async with anyio.create_task_group() as tg:
                async for request in requests:
                    tg.start_soon(self._answer, bus, request)

    async def tasks(self, bus: Bus) -> list[TaskRef]:
        """Each entry's eval split, up to `max_tasks` of each."""
        async with self._listing:
            if self._tasks is None:
                try:
                    self._tasks = await self._list(bus)
                except ValueError as exc:
                    if not self.settings.optional:
                        raise
                    log.warning("no eval tasks", error=str(exc))
                    self._tasks = []
            return self._tasks

    async def _list(self, bus: Bus) -> list[TaskRef]:
        tasks: list[TaskRef] = []
        for name, split in self.settings.splits.items():
            found = await list_tasks(bus, name, split)
            if self.settings.max_tasks:
                found = found[: self.settings.max_tasks]
            tasks += found
        return tasks

    async def _answer(self, bus: Bus, request: EvalRequested) -> None:
        s = self.settings
        tasks = await self.tasks(bus)
        path = None
        if tasks or not s.optional:
            report = await evaluate(bus, tasks, s, step=request.step, policy_version=request.policy_version)
            path = self.run_dir / s.report.format(step=request.step)
            make_private_dir(path.parent)
            write_private(path, as_json(report))
        await bus.publish(
            Evaluated(
                reply_to=request.request_id,
                step=request.step,
                report_path=str(path) if path is not None else None,
            )
        )

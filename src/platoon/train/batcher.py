"""The credit assigner: graded episodes in, one `BatchReady` of datums per training step out.

It records, for every training episode, the agent tree (`AgentSpawned`) and each agent's
model calls (`ModelCallFinished`, exact tokens and logprobs). When all `group_size` rollouts
of a task are graded, the group is complete (`GroupCompleted`); when a step's `batch_size`
groups are complete, `platoon.credit.assign_credit` turns them into datums and the batch is
published. Only episodes with a reward train; the others are counted by reason.

No single group ends the run: one whose credit cannot be assigned (a malformed agent tree, a
credit rule that raises or gives a non-finite advantage) is dropped from its batch, logged and
counted (`episodes/failed/credit_error`). Only when every group of `_CREDIT_FAILED_STEPS` steps
in a row fails is the fault taken to be systematic, and the run ends saying so.

An episode the system failed (an env session that did not open, an environment fault, the
sampler failing, a worker lost) has no reward: it is left out of its group's baseline and of the
reward statistics, and counted by cause. A group left with fewer than `min_group_share` of its
rollouts graded is dropped whole (`credit/groups_removed_too_few`), never trained on a few.

A group may close early: `straggler_timeout` seconds after its first grade, once a
`straggler_quorum` share of it is graded; the stragglers' results are then dropped and counted.

It reads every event from one subscription, in publish order, so an episode's calls are
always recorded before its grade is. Results from rollout workers (`sealed=True`, see
`platoon.train.distributed`) may arrive out of order: a grade then waits for the episode's
`EpisodeSealed` and for the calls and agents it counts. A second grade for an episode is
ignored, and so is whatever arrives for an abandoned (re-requested) episode.

Several policies (`policies`, RFC 0001): each agent's calls belong to the policy that sampled
them (`AgentSpawned.policy`), and each trained policy gets a `BatchReady` of its own per step,
its credit assigned over its own agents (own baselines, weights and normalisation). The
statistics of the episodes are the same in each; those of the policy's agents are prefixed
with its name (`planner/reward/mean`: the mean own reward of its agents).
"""

from __future__ import annotations

import functools
import math
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import anyio
import structlog

from platoon.bus import Bus, ComponentBase, Stream
from platoon.bus.events import (
    AgentFinished,
    AgentSpawned,
    BatchReady,
    EpisodeAbandoned,
    EpisodeGraded,
    EpisodeRequested,
    EpisodeSealed,
    EpisodeStarted,
    Event,
    GroupCompleted,
    ModelCallFinished,
    step_number,
)
from platoon.credit import (
    AgentTrace,
    Call,
    CreditConfig,
    CreditError,
    CreditResult,
    Rollout,
    assign_credit,
    own_reward,
)
from platoon.stats.failures import failure_kind

__all__ = ["CreditAssigner", "EpisodeRecord", "recorded_call"]

log = structlog.get_logger("platoon.credit")

_CREDIT_FAILED_STEPS = 3  # steps in a row with no group whose credit could be assigned


def recorded_call(event: ModelCallFinished) -> Call:
    """A model call as credit assignment reads it (the trainer's batcher and `platoon sft` both)."""
    return Call(
        prompt_tokens=event.prompt_tokens,
        completion_tokens=event.completion_tokens,
        logprobs=event.logprobs,
        policy_version=event.policy_version,
        kind=event.kind,
    )


@dataclass
class EpisodeRecord:
    """One training episode's agent tree and calls, as they arrive."""

    agents: dict[str, tuple[str | None, int]] = field(default_factory=dict)
    calls: dict[str, list[Call]] = field(default_factory=dict)
    rewards: dict[str, float] = field(default_factory=dict)  # subagents' own grades
    policies: dict[str, str] = field(default_factory=dict)  # agent id -> its policy
    worker: str = ""
    agents_finished: int = 0
    held: EpisodeGraded | None = None  # a grade waiting for its seal (sealed mode)
    seal: EpisodeSealed | None = None
    graded: bool = False
    order: int = 0  # its place among the run's requests: datums are in this order, whatever ended first
    replies: int = 0  # its policy's model calls (judges' left out)
    cut: int = 0  # of those, the ones `max_tokens` cut (stop reason `length`)

    def complete(self) -> bool:
        """Whether everything the seal counts has arrived."""
        seal = self.seal
        return seal is not None and (
            sum(map(len, self.calls.values())) >= seal.calls
            and len(self.agents) >= seal.agents
            and self.agents_finished >= seal.agents_finished
        )

    def rollout(self, graded: EpisodeGraded) -> Rollout:
        assert graded.reward is not None
        traces = [
            AgentTrace(
                agent_id=agent_id,
                parent_id=parent,
                depth=depth,
                calls=self.calls.get(agent_id, []),
                reward=self.rewards.get(agent_id, graded.agent_rewards.get(agent_id)),
                turn_rewards=list(graded.turn_rewards.get(agent_id, [])),
                policy=self.policies.get(agent_id, "default"),
            )
            for agent_id, (parent, depth) in sorted(self.agents.items(), key=lambda item: item[1][1])
        ]
        return Rollout(
            episode_id=graded.episode_id, group_id=graded.group_id, reward=graded.reward, agents=traces
        )


@dataclass
class _Group:
    group_id: str
    step: int
    order: int = 0  # the place of its first request
    graded: list[EpisodeGraded] = field(default_factory=list)
    closed: bool = False
    overdue: bool = False  # the straggler timeout passed before a quorum was in
    first_at: float | None = None


@dataclass(frozen=True)
class CreditSettings:
    """The credit assigner's: how advantages are computed, and what makes a step's batch."""

    credit: CreditConfig
    group_size: int
    batch_size: int
    straggler_timeout: float | None = None  # s after a group's first grade before it may close
    straggler_quorum: float = 1.0  # the share of a group graded by then that closes it
    # a group trains only when this share of its rollouts were graded: one that the system
    # failed more (a dead sandbox host, a flaky sampler) would train on a baseline of a few
    min_group_share: float = 0.5
    sealed: bool = False  # results come from workers, each episode sealed
    policies: tuple[str, ...] = ("default",)  # the trained policies: one BatchReady each per step


class CreditAssigner(ComponentBase):
    """The credit-assigner component (see the module docstring)."""

    name = "credit-assigner"
    # In one ordered subscription: the agent trees, model calls and grades of training episodes.
    subscribes = (
        EpisodeRequested,
        EpisodeStarted,
        AgentSpawned,
        AgentFinished,
        ModelCallFinished,
        EpisodeGraded,
        EpisodeSealed,
        EpisodeAbandoned,
    )
    publishes = (GroupCompleted, BatchReady)

    def __init__(self, settings: CreditSettings) -> None:
        self.settings = settings
        self.records: dict[str, EpisodeRecord] = {}
        self.groups: dict[str, _Group] = {}
        self.steps: dict[int, list[_Group]] = {}
        self.requested_at: dict[int, float] = {}
        self.closed: OrderedDict[str, None] = OrderedDict()
        self.abandoned: OrderedDict[str, None] = OrderedDict()
        self.dropped: Counter[str] = Counter()
        self._credit_failed_steps = 0
        # Whether a root ever delegated: then each step reports the share of episodes that did
        # (`agents/delegated`), what a recursive run's orchestration learns.
        self._delegating = False
        self._requests = 0
        self._events: Stream[Event] | None = None
        self._bus: Bus | None = None

    def on_attach(self, bus: Bus) -> None:
        self._bus = bus
        self._events = bus.stream(self.subscribes, name=self.name).open()

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        assert self._events is not None
        async with anyio.create_task_group() as tg:
            with self._events as events:
                async for event in events:
                    match event:
                        case EpisodeRequested(purpose="train"):
                            self._requests += 1
                            self.records[event.episode_id] = EpisodeRecord(order=self._requests)
                            self.groups.setdefault(
                                event.group_id, _Group(event.group_id, event.step, self._requests)
                            )
                            self.requested_at.setdefault(event.step, time.monotonic())
                        case EpisodeStarted() if event.episode_id in self.records:
                            self.records[event.episode_id].worker = event.worker
                        case AgentSpawned() if event.episode_id in self.records:
                            self.records[event.episode_id].agents[event.agent_id] = (
                                event.parent_id,
                                event.depth,
                            )
                            self.records[event.episode_id].policies[event.agent_id] = event.policy
                            await self._release(bus, tg, event.episode_id)
                        case AgentFinished() if event.episode_id in self.records:
                            record = self.records[event.episode_id]
                            record.agents_finished += 1
                            if event.reward is not None:
                                record.rewards[event.agent_id] = event.reward
                            await self._release(bus, tg, event.episode_id)
                        case ModelCallFinished() if event.episode_id in self.records:
                            record = self.records[event.episode_id]
                            record.calls.setdefault(event.agent_id, []).append(recorded_call(event))
                            if event.kind != "judge":
                                record.replies += 1
                                record.cut += event.stop_reason == "length"
                            await self._release(bus, tg, event.episode_id)
                        case EpisodeGraded(purpose="train") if event.episode_id in self.abandoned:
                            self.dropped["abandoned"] += 1
                        case EpisodeGraded(purpose="train") if event.group_id in self.groups:
                            held = self.records.get(event.episode_id)
                            if held is None or held.graded or held.held is not None:
                                self.dropped["duplicate"] += 1
                            elif self.settings.sealed:
                                held.held = event
                                await self._release(bus, tg, event.episode_id)
                            else:
                                held.graded = True
                                await self._graded(bus, tg, event)
                        case EpisodeGraded(purpose="train") if event.group_id in self.closed:
                            self.dropped["straggler"] += 1
                            self.records.pop(event.episode_id, None)
                        case EpisodeSealed() if event.episode_id in self.records:
                            self.records[event.episode_id].seal = event
                            await self._release(bus, tg, event.episode_id)
                        case EpisodeAbandoned(purpose="train") if event.episode_id in self.records:
                            await self._abandon(bus, tg, event)

    async def _release(self, bus: Bus, tg: anyio.abc.TaskGroup, episode_id: str) -> None:
        """Count a held grade once its episode is complete (sealed mode)."""
        record = self.records[episode_id]
        if record.held is not None and record.complete():
            graded, record.held, record.graded = record.held, None, True
            if graded.group_id in self.groups:
                await self._graded(bus, tg, graded)
            else:  # its group closed without it (the straggler timeout)
                self.dropped["straggler"] += 1
                self.records.pop(episode_id, None)

    async def _abandon(self, bus: Bus, tg: anyio.abc.TaskGroup, event: EpisodeAbandoned) -> None:
        record = self.records[event.episode_id]
        if record.graded:
            return  # its grade already counts: too late to abandon
        del self.records[event.episode_id]
        self.abandoned[event.episode_id] = None
        while len(self.abandoned) > 100_000:
            self.abandoned.popitem(last=False)
        self.dropped["abandoned_episodes"] += 1
        if event.replaced_by is None and event.group_id in self.groups:
            failed = EpisodeGraded(
                episode_id=event.episode_id,
                group_id=event.group_id,
                task=event.task,
                reward=None,
                status="error",
                reason=f"abandoned: {event.reason}",
                step=event.step,
            )
            await self._graded(bus, tg, failed)

    async def _graded(self, bus: Bus, tg: anyio.abc.TaskGroup, event: EpisodeGraded) -> None:
        group = self.groups[event.group_id]
        group.graded.append(event)
        if group.first_at is None:
            group.first_at = time.monotonic()
            if self.settings.straggler_timeout is not None and self.settings.group_size > 1:
                tg.start_soon(self._straggler_deadline, bus, event.group_id)
        if len(group.graded) >= self.settings.group_size or (group.overdue and self._quorate(group)):
            await self._close(bus, event.group_id)

    async def _straggler_deadline(self, bus: Bus, group_id: str) -> None:
        assert self.settings.straggler_timeout is not None
        await anyio.sleep(self.settings.straggler_timeout)
        group = self.groups.get(group_id)
        if group is not None and not group.closed:
            group.overdue = True
            if self._quorate(group):
                await self._close(bus, group_id)

    def _quorate(self, group: _Group) -> bool:
        return len(group.graded) >= math.ceil(self.settings.straggler_quorum * self.settings.group_size)

    async def _close(self, bus: Bus, group_id: str) -> None:
        group = self.groups.pop(group_id)
        group.closed = True
        # A step trains its groups, and each group its episodes, in the order they were requested,
        # not in the order they ended: the same seed then trains the same batch, summed alike.
        group.graded.sort(key=lambda g: getattr(self.records.get(g.episode_id), "order", 0))
        self.closed[group_id] = None
        while len(self.closed) > 100_000:
            self.closed.popitem(last=False)
        await bus.publish(
            GroupCompleted(
                group_id=group_id,
                step=group.step,
                episode_ids=[g.episode_id for g in group.graded],
                rewards=[g.reward for g in group.graded],
            )
        )
        done = self.steps.setdefault(group.step, [])
        done.append(group)
        if len(done) == self.settings.batch_size:
            done.sort(key=lambda g: g.order)
            for batch in self.batches(group.step):
                await bus.publish(batch)

    def batches(self, step: int) -> list[BatchReady]:
        """The step's batch, or one per trained policy when the run has several."""
        if self.settings.policies == ("default",):
            return [self.batch(step)]
        return self._policy_batches(step)

    def batch(self, step: int) -> BatchReady:
        """Assign credit over the step's groups and forget their episodes."""
        started = time.perf_counter()
        groups = self.steps.pop(step)
        failures: Counter[str] = Counter()
        rollouts: list[list[Rollout]] = []
        rewards: list[float] = []
        parts: dict[str, list[float]] = {}
        workers: Counter[str] = Counter()
        episodes = replies = cut = thin = 0
        for group in groups:
            kept = []
            for graded in group.graded:
                episodes += 1
                record = self.records.pop(graded.episode_id, EpisodeRecord())
                replies, cut = replies + record.replies, cut + record.cut
                if record.worker:
                    workers[record.worker] += 1
                if graded.reward is None:
                    failures[failure_kind(graded.reason or graded.status)] += 1
                    continue
                if not _finite(graded):  # a grader of another version, or a plugin's own events
                    log.warning("non-finite reward: episode dropped", episode=graded.episode_id)
                    failures["non_finite_reward"] += 1
                    continue
                rewards.append(graded.reward)
                for name, value in graded.rewards.items():
                    parts.setdefault(name, []).append(value)
                kept.append(record.rollout(graded))
            if kept and self._thin(kept):
                thin += 1
            elif kept:
                rollouts.append(kept)
        result, errors = self._assign(step, rollouts)
        failures["credit_error"] += sum(len(g) for g in rollouts if g[0].group_id in errors)
        if not failures["credit_error"]:
            del failures["credit_error"]
        stats = {f"credit/{k}": float(v) for k, v in result.stats.items()}
        if thin:
            stats["credit/groups_removed_too_few"] = float(thin)
        if errors:
            stats["credit/groups_failed"] = float(len(errors))
            rewards = [r.reward for g in rollouts if g[0].group_id not in errors for r in g]
        stats |= _reward_stats(rewards, parts)
        stats |= {
            "episodes/total": float(episodes),
            "episodes/graded": float(len(rewards)),
            "train/datums": float(len(result.datums)),
            "train/trained_tokens": float(sum(d.num_trained_tokens for d in result.datums)),
            "time/credit": time.perf_counter() - started,
            "time/rollout": time.monotonic() - self.requested_at.pop(step, time.monotonic()),
            "episodes/dropped_stragglers": float(self.dropped.pop("straggler", 0)),
        }
        trees = [rollout for group in rollouts for rollout in group]
        delegated = [any(agent.depth > 0 for agent in rollout.agents) for rollout in trees]
        self._delegating = self._delegating or any(delegated)
        if self._delegating and trees:  # once a tree grew, every step says how often (0 too)
            stats["agents/delegated"] = sum(delegated) / len(delegated)
        if replies:  # replies cut by max_tokens: their ends were never sampled, so never judged
            stats["replies/truncated_fraction"] = cut / replies
            stats["replies/count"] = float(replies)
        stats |= {f"episodes/failed/{reason}": float(count) for reason, count in failures.items()}
        for key, name in (
            ("abandoned_episodes", "episodes/abandoned"),
            ("abandoned", "episodes/dropped_abandoned"),
            ("duplicate", "episodes/dropped_duplicates"),
        ):
            if key in self.dropped:
                stats[name] = float(self.dropped.pop(key))
        if workers:
            stats["workers/count"] = float(len(workers))
            for worker, count in workers.items():
                stats[f"workers/{worker}/episodes"] = float(count)
                if stats["time/rollout"] > 0:
                    stats[f"workers/{worker}/episodes_per_s"] = count / stats["time/rollout"]
        return BatchReady(step=step, datums=result.datums, stats=stats)

    def _policy_batches(self, step: int) -> list[BatchReady]:
        """One batch per trained policy: the episodes' statistics as `batch` gives them, then per
        policy its own credit, datums and agents' rewards, prefixed with its name."""
        groups = self.steps[step]
        records = {g.episode_id: self.records.get(g.episode_id) for group in groups for g in group.graded}
        rollouts = [
            [
                records[g.episode_id].rollout(g)  # type: ignore[union-attr]
                for g in group.graded
                if g.reward is not None and _finite(g) and records[g.episode_id] is not None
            ]
            for group in groups
        ]
        rollouts = [group for group in rollouts if group and not self._thin(group)]
        shared = self.batch(step)  # the episodes' statistics (and forgets the step's episodes)
        common = {  # the episodes' (rewards, counts, failures, times): the same for every policy
            k: v for k, v in shared.stats.items() if not k.startswith(("credit/", "train/", "time/credit"))
        }
        out = []
        for policy in self.settings.policies:
            started = time.perf_counter()
            result, errors = self._assign(step, rollouts, policy, count=False)
            kept = [g for g in rollouts if g[0].group_id not in errors]
            own = [
                own_reward(rollout, agent)
                for group in kept
                for rollout in group
                for agent in rollout.agents
                if agent.policy == policy
            ]
            stats = dict(common)
            mine = {f"credit/{k}": float(v) for k, v in result.stats.items()}
            if errors:
                mine["credit/groups_failed"] = float(len(errors))
            if own:
                mean = sum(own) / len(own)
                mine |= {
                    "reward/mean": mean,
                    "reward/std": math.sqrt(sum((r - mean) ** 2 for r in own) / len(own)),
                    "reward/pass_rate": sum(1 for r in own if r >= 1.0) / len(own),
                    "agents": float(len(own)),
                }
            mine |= {
                "train/datums": float(len(result.datums)),
                "train/trained_tokens": float(sum(d.num_trained_tokens for d in result.datums)),
                "time/credit": time.perf_counter() - started,
            }
            stats |= {f"{policy}/{k}": v for k, v in mine.items()}
            out.append(BatchReady(step=step, datums=result.datums, stats=stats, policy=policy))
        return out

    def _thin(self, graded: list[Rollout]) -> bool:
        """Whether too few of a group's rollouts were graded for it to train (`min_group_share`)."""
        return len(graded) < math.ceil(self.settings.min_group_share * self.settings.group_size - 1e-9)

    def _assign(
        self, step: int, groups: list[list[Rollout]], policy: str | None = None, *, count: bool = True
    ) -> tuple[CreditResult, dict[str, str]]:
        """Credit for the step's groups, and the groups dropped because theirs failed (id -> why).
        `count`: whether this batch counts towards ending a run whose credit always fails."""
        credit = functools.partial(assign_credit, policy=policy) if policy is not None else assign_credit
        try:
            result = credit(groups, self.settings.credit)
        except Exception:
            result = None  # find the group(s) at fault, and assign the others
        errors: dict[str, str] = {}
        if result is None:
            kept = []
            for group in groups:
                try:
                    credit([group], self.settings.credit)
                except Exception as exc:
                    errors[group[0].group_id] = f"{type(exc).__name__}: {exc}"
                    log.warning(
                        "credit assignment failed: group dropped",
                        step=step_number(step),
                        group=group[0].group_id,
                        error=errors[group[0].group_id],
                    )
                else:
                    kept.append(group)
            try:
                result = credit(kept, self.settings.credit)
            except Exception as exc:  # groups fine alone, not together: none of them trains
                errors |= {group[0].group_id: f"{type(exc).__name__}: {exc}" for group in kept}
                log.warning("credit assignment failed: batch dropped", step=step_number(step), error=str(exc))
                result = credit([], self.settings.credit)
        if not count:
            pass
        elif errors and len(errors) == len(groups):
            self._credit_failed_steps += 1
            if self._credit_failed_steps >= _CREDIT_FAILED_STEPS:
                raise CreditError(
                    f"credit assignment failed for every group of {self._credit_failed_steps} steps in a "
                    f"row, so training learns nothing; the last error: {next(iter(errors.values()))}"
                )
        else:
            self._credit_failed_steps = 0
        return result, errors


def _finite(graded: EpisodeGraded) -> bool:
    values = [graded.reward, *graded.agent_rewards.values()]
    return all(v is not None and math.isfinite(v) for v in values)


def _reward_stats(rewards: list[float], parts: dict[str, list[float]]) -> dict[str, float]:
    """A step's reward statistics; none for a step without a reward ("not graded", never 0)."""
    n = len(rewards)
    if not n:
        return {}
    mean = sum(rewards) / n
    return {
        "reward/mean": mean,
        "reward/std": math.sqrt(sum((r - mean) ** 2 for r in rewards) / n),
        "reward/pass_rate": sum(1 for r in rewards if r >= 1.0) / n,
        # each named part of the reward (the environment's, each rule's), so a user sees which moved
        **{f"reward/{name}/mean": sum(values) / len(values) for name, values in parts.items()},
    }

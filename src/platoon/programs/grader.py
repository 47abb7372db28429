"""The grader: every `EpisodeFinished` becomes exactly one `EpisodeGraded`.

Episodes that ended in an error or were cancelled are not graded: their `EpisodeGraded` has
`reward=None` and the reason, so they are counted but never trained on (an infrastructure
failure must not look like a reward of 0). Others ask their env service for the root
session's grade, then pass it through the entry's reward processor, if any, and then through
the entry's reward rules and judges (`platoon.rewards`), whose parts go into `rewards` as
`rule/<name>` and whose reasoning into `notes`.

The grader watches every event of an episode in flight (model calls, tool calls and results) so
rules and judges can read the episode; the rewards tool results carry mid-episode go into
`EpisodeGraded.turn_rewards`, one sum per model call, for per-turn credit.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import structlog

from platoon import plugins
from platoon.bus import Bus, ComponentBase, NoResponder, RequestTimeout, Stream
from platoon.bus.events import (
    EpisodeAbandoned,
    EpisodeFinished,
    EpisodeGraded,
    EpisodeRequested,
    EpisodeStarted,
    Event,
    Graded,
    GradeRequested,
    ModelCallFailed,
    ModelCallFinished,
    ToolCalled,
    ToolReturned,
)
from platoon.rewards import Episode, EpisodeRecorder, RewardRules, RuleError
from platoon.rewards.pairwise import Pairings

__all__ = ["Grader", "RewardProcessor"]

log = structlog.get_logger("platoon.grader")

RewardProcessor = Callable[[EpisodeFinished, Graded], Any]


class Grader(ComponentBase):
    """The grader component. `reward_processors` maps an entry name to a processor ref."""

    name = "grader"
    # What an episode in flight does (for rules and judges), and its end; judges' calls are
    # published as `ModelCallFinished` of kind "judge".
    subscribes = (
        EpisodeRequested,
        EpisodeStarted,
        ModelCallFinished,
        ToolCalled,
        ToolReturned,
        EpisodeAbandoned,
        ModelCallFailed,
        EpisodeFinished,
        Graded,
    )
    publishes = (GradeRequested, ModelCallFinished, EpisodeGraded)

    def __init__(
        self,
        *,
        reward_processors: Mapping[str, str] | None = None,
        rules: Mapping[str, RewardRules] | None = None,
        grade_timeout: float | None = 900.0,
    ) -> None:
        self.processors: dict[str, RewardProcessor] = {
            env: plugins.load("reward_processors", ref) for env, ref in (reward_processors or {}).items()
        }
        self.rules = dict(rules or {})
        self.grade_timeout = grade_timeout
        self.recorder = EpisodeRecorder()
        self.pairings = Pairings()  # task groups in flight, for pairwise judges
        self._events: Stream[Event] | None = None
        self._sampler_faults: dict[str, str] = {}  # episodes in flight whose sampler failed -> how

    def on_attach(self, bus: Bus) -> None:
        taken = tuple(t for t in self.subscribes if t is not Graded)  # replies come to `request`
        self._events = bus.stream(taken, name="grader").open()

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        assert self._events is not None
        try:
            async with anyio.create_task_group() as tg:
                with self._events as events:
                    async for event in events:
                        if isinstance(event, EpisodeFinished):
                            fault = self._sampler_faults.pop(event.episode_id, None)
                            tg.start_soon(self._grade, bus, event, self.recorder.pop(event), fault)
                        elif isinstance(event, ModelCallFailed):
                            self._sampler_faults.setdefault(event.episode_id, event.error)
                        else:
                            if isinstance(event, EpisodeAbandoned):
                                self._sampler_faults.pop(event.episode_id, None)
                            self.recorder.see(event)
                            if isinstance(event, EpisodeRequested) and self._pairwise(event.task.env):
                                self.pairings.expect(event.group_id)
        finally:
            with anyio.CancelScope(shield=True):
                for rules in self.rules.values():
                    await rules.aclose()

    async def _grade(
        self, bus: Bus, finished: EpisodeFinished, episode: Episode | None = None, fault: str | None = None
    ) -> None:
        """Grade one episode; `fault`: a sampler failure during it (`ModelCallFailed`), which makes
        it the system's failure, never graded (its runner ends it too, when it hears in time)."""
        episode = episode or Episode(
            episode_id=finished.episode_id, group_id=finished.group_id, task=finished.task
        )
        notes: dict[str, str] = {}
        reward: float | None
        rewards: dict[str, float]
        reason: str | None
        if fault is not None:
            reason = finished.reason if finished.status == "error" and finished.reason else None
            reward, rewards, reason = None, {}, reason or f"the policy's sampler failed: {fault}"
        else:
            reward, rewards, reason = await self.grade(bus, finished, episode, notes)
        if reward is None and self._pairwise(finished.task.env):
            self.pairings.leave(finished.group_id, finished.episode_id)  # its group need not wait
        if reward is not None and not math.isfinite(reward):
            # NaN or inf would poison a whole group's advantages: this episode is not graded.
            log.warning("non-finite reward: the episode counts as not graded", episode=finished.episode_id)
            reward, reason = None, f"non-finite reward {reward!r} from the environment"
        rewards = {k: v for k, v in rewards.items() if math.isfinite(v)}
        await bus.publish(
            EpisodeGraded(
                episode_id=finished.episode_id,
                group_id=finished.group_id,
                task=finished.task,
                reward=reward,
                rewards=rewards,
                status=finished.status,
                reason=reason,
                turn_rewards={a: t for a, t in episode.turn_rewards.items() if any(t)}
                if reward is not None
                else {},
                notes=notes,
                purpose=finished.purpose,
                step=finished.step,
                policy_version=finished.policy_version,
            )
        )

    def _pairwise(self, env: str) -> bool:
        rules = self.rules.get(env)
        return rules is not None and rules.pairwise

    async def grade(
        self,
        bus: Bus,
        finished: EpisodeFinished,
        episode: Episode | None = None,
        notes: dict[str, str] | None = None,
    ) -> tuple[float | None, dict[str, float], str | None]:
        if finished.status in ("error", "cancelled", "timeout"):  # what it left is no answer to grade
            return None, {}, finished.reason or finished.status
        rules = self.rules.get(finished.task.env)
        try:
            graded = await bus.request(
                GradeRequested(
                    episode_id=finished.episode_id,
                    agent_id=finished.root_agent_id,
                    env=finished.task.env,
                    with_task=rules is not None and rules.needs_task_spec,
                    files=rules.files if rules is not None else [],
                ),
                timeout=self.grade_timeout,
            )
        except (NoResponder, RequestTimeout) as exc:
            return None, {}, f"grading failed: {exc}"
        if graded.error is not None:
            prefix = "" if graded.error.startswith("grading failed") else "grading failed: "
            return None, {}, prefix + graded.error
        reward, rewards, reason = graded.reward, dict(graded.rewards), graded.reason
        processor = self.processors.get(finished.task.env)
        if processor is not None and reward is not None:
            try:
                value = processor(finished, graded)
                if inspect.isawaitable(value):
                    value = await value
                reward = float(value)
                if not math.isfinite(reward):
                    log.warning(
                        "non-finite reward: the episode counts as not graded", episode=finished.episode_id
                    )
                    return None, rewards, f"non-finite reward {reward!r} from the reward processor"
                rewards["processed"] = reward
            except Exception as exc:
                log.warning("reward processor failed", episode=finished.episode_id, error=str(exc))
                return None, rewards, f"the reward processor raised {type(exc).__name__}: {exc}"
        if rules is None:
            return reward, rewards, reason
        episode = episode or Episode(
            episode_id=finished.episode_id, group_id=finished.group_id, task=finished.task
        )
        episode.final_answer = finished.final_message
        episode.root_agent_id = episode.root_agent_id or finished.root_agent_id
        episode.env_reward, episode.env_rewards = reward, dict(rewards)
        episode.task_spec = dict(graded.task or {})
        episode.files = dict(graded.files)
        try:
            outcome = await rules.evaluate(episode, bus, self.pairings)
        except RuleError as exc:
            log.warning("reward rules failed", episode=finished.episode_id, error=str(exc))
            reason = f"reward rules failed: {exc}" + (f" (the environment: {reason})" if reason else "")
            return None, rewards, reason
        if notes is not None:
            notes.update(outcome.notes)
        if outcome.turn_rewards:  # per-turn judges: each turn's score is that turn's reward
            turns = episode.turn_rewards.setdefault(episode.root_agent_id, [])
            turns += [0.0] * (max(outcome.turn_rewards) + 1 - len(turns))
            for turn, value in outcome.turn_rewards.items():
                turns[turn] += value
        rewards |= {f"rule/{name}": value for name, value in outcome.parts.items()}
        if reward is not None:
            rewards.setdefault("env", reward)
        return outcome.reward, rewards, reason

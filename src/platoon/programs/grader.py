"""The grader: every `EpisodeFinished` becomes exactly one `EpisodeGraded`.

Episodes that ended in an error or were cancelled are not graded: their `EpisodeGraded` has
`reward=None` and the reason, so they are counted but never trained on (an infrastructure
failure must not look like a reward of 0). Others ask their env service for the root
session's grade, then pass it through the entry's reward processor, if any.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import structlog

from platoon import plugins
from platoon.bus import Bus, NoResponder, RequestTimeout, Stream
from platoon.bus.events import EpisodeFinished, EpisodeGraded, Graded, GradeRequested

__all__ = ["Grader", "RewardProcessor"]

log = structlog.get_logger("platoon.grader")

RewardProcessor = Callable[[EpisodeFinished, Graded], Any]


class Grader:
    """The grader component. `reward_processors` maps an entry name to a processor ref."""

    name = "grader"

    def __init__(
        self, *, reward_processors: Mapping[str, str] | None = None, grade_timeout: float | None = 900.0
    ) -> None:
        self.processors: dict[str, RewardProcessor] = {
            env: plugins.load("reward_processors", ref) for env, ref in (reward_processors or {}).items()
        }
        self.grade_timeout = grade_timeout
        self._finished: Stream[EpisodeFinished] | None = None

    def attach(self, bus: Bus) -> None:
        if self._finished is not None:
            return
        self._finished = bus.stream(EpisodeFinished, name="grader").open()

    async def run(self, bus: Bus) -> None:
        if self._finished is None:
            self.attach(bus)
        assert self._finished is not None
        async with anyio.create_task_group() as tg:
            with self._finished as finished:
                async for event in finished:
                    tg.start_soon(self._grade, bus, event)

    async def _grade(self, bus: Bus, finished: EpisodeFinished) -> None:
        reward, rewards, reason = await self.grade(bus, finished)
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
                purpose=finished.purpose,
                step=finished.step,
                policy_version=finished.policy_version,
            )
        )

    async def grade(
        self, bus: Bus, finished: EpisodeFinished
    ) -> tuple[float | None, dict[str, float], str | None]:
        if finished.status in ("error", "cancelled"):
            return None, {}, finished.reason or finished.status
        try:
            graded = await bus.request(
                GradeRequested(
                    episode_id=finished.episode_id, agent_id=finished.root_agent_id, env=finished.task.env
                ),
                timeout=self.grade_timeout,
            )
        except (NoResponder, RequestTimeout) as exc:
            return None, {}, f"grading failed: {exc}"
        assert isinstance(graded, Graded)
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
        return reward, rewards, reason

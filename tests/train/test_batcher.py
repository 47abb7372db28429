"""The credit assigner on a bus: graded episodes in, one `BatchReady` per step out.

Events are published by hand, as the runner, gateway and grader would, so each rule (when a
batch is ready, what is excluded, the straggler timeout, per-agent calls) is checked alone.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from platoon.bus import Bus
from platoon.bus.events import (
    AgentSpawned,
    BatchReady,
    EpisodeGraded,
    EpisodeRequested,
    GroupCompleted,
    ModelCallFinished,
    TaskRef,
    new_id,
)
from platoon.credit import CreditConfig, CreditError, register_credit_rule
from platoon.train.batcher import CreditAssigner, CreditSettings

pytestmark = pytest.mark.anyio

TASK = TaskRef(env="toy", split="train", task_id="t")


class Feed:
    """A bus with a running credit assigner, and what it published."""

    def __init__(self, bus: Bus, assigner: CreditAssigner) -> None:
        self.bus = bus
        self.assigner = assigner
        self.batches: list[BatchReady] = []
        self.groups: list[GroupCompleted] = []

    async def request(self, episode: str, group: str, *, step: int = 0, purpose: str = "train") -> None:
        await self.bus.publish(
            EpisodeRequested(episode_id=episode, group_id=group, task=TASK, purpose=purpose, step=step)
        )

    async def agent(self, episode: str, agent: str, parent: str | None = None, depth: int = 0) -> None:
        await self.bus.publish(
            AgentSpawned(
                episode_id=episode, agent_id=agent, parent_id=parent, depth=depth, harness="h", instruction=""
            )
        )

    async def call(
        self,
        episode: str,
        agent: str,
        prompt: list[int],
        completion: list[int],
        *,
        version: int = 0,
        stop_reason: str = "stop",
    ) -> None:
        await self.bus.publish(
            ModelCallFinished(
                call_id=new_id(),
                episode_id=episode,
                agent_id=agent,
                prompt_tokens=prompt,
                completion_tokens=completion,
                logprobs=[-0.5] * len(completion),
                stop_reason=stop_reason,
                policy_version=version,
            )
        )

    async def grade(
        self,
        episode: str,
        group: str,
        reward: float | None,
        *,
        step: int = 0,
        reason: str | None = None,
        purpose: str = "train",
    ) -> None:
        await self.bus.publish(
            EpisodeGraded(
                episode_id=episode,
                group_id=group,
                task=TASK,
                reward=reward,
                status="completed" if reward is not None else "error",
                reason=reason,
                step=step,
                purpose=purpose,
            )
        )

    async def episode(
        self, episode: str, group: str, reward: float | None, *, step: int = 0, reason: str | None = None
    ) -> None:
        """A one-agent episode with one call, from request to grade."""
        await self.request(episode, group, step=step)
        await self.agent(episode, f"{episode}/root")
        await self.call(episode, f"{episode}/root", [1, 2, 3], [4, 5])
        await self.grade(episode, group, reward, step=step, reason=reason)

    async def until(self, condition: Callable[[], bool], timeout: float = 2.0) -> None:
        with anyio.fail_after(timeout):
            while not condition():  # noqa: ASYNC110 - the state of another component
                await anyio.sleep(0.005)

    async def settle(self) -> None:
        """Let the assigner handle everything published so far."""
        await self.bus.drained()
        await anyio.sleep(0.02)


@asynccontextmanager
async def assigner(**options: Any) -> AsyncIterator[Feed]:
    options = {"group_size": 2, "batch_size": 1, "credit": CreditConfig(), **options}
    credit = CreditAssigner(CreditSettings(**options))
    async with Bus() as bus:
        harness = Feed(bus, credit)
        bus.subscribe(BatchReady, harness.batches.append)
        bus.subscribe(GroupCompleted, harness.groups.append)
        credit.attach(bus)
        bus.start_soon(credit.run, bus)
        yield harness


async def test_a_batch_is_published_once_batch_size_groups_of_group_size_are_graded():
    async with assigner(group_size=2, batch_size=2) as h:
        await h.episode("a1", "A", 1.0)
        await h.episode("a2", "A", 0.0)
        await h.episode("b1", "B", 1.0)
        await h.settle()
        assert [g.group_id for g in h.groups] == ["A"]
        assert h.batches == []  # group B is one grade short
        await h.episode("b2", "B", 1.0)
        await h.until(lambda: len(h.batches) == 1)
    (batch,) = h.batches
    assert batch.step == 0
    stats = batch.stats
    assert stats["episodes/total"] == stats["episodes/graded"] == 4
    assert stats["reward/mean"] == 0.75
    assert stats["reward/pass_rate"] == 0.75
    # Group B's rewards are all equal: removed by default, so only group A's two episodes train,
    # with mean-baseline advantages +0.5 and -0.5 on the sampled tokens.
    assert stats["credit/groups_removed_constant"] == 1
    by_episode = {d.episode_id: d for d in batch.datums}
    assert set(by_episode) == {"a1", "a2"}
    assert by_episode["a1"].advantages == [0.0, 0.0, 0.5, 0.5]
    assert by_episode["a2"].advantages == [0.0, 0.0, -0.5, -0.5]
    assert stats["train/datums"] == 2 and stats["train/trained_tokens"] == 4


async def test_a_batch_trains_in_the_order_episodes_were_requested_not_the_order_they_ended():
    """So that a rerun with the same seed sums the same datums in the same order."""
    async with assigner(group_size=2, batch_size=2) as h:
        for episode, group in [("a1", "A"), ("a2", "A"), ("b1", "B"), ("b2", "B")]:
            await h.request(episode, group)
        for episode, group, reward in [
            ("b2", "B", 0.0),
            ("a2", "A", 1.0),
            ("b1", "B", 1.0),
            ("a1", "A", 0.0),
        ]:
            await h.agent(episode, f"{episode}/root")
            await h.call(episode, f"{episode}/root", [1, 2, 3], [4, 5])
            await h.grade(episode, group, reward)
        await h.until(lambda: len(h.batches) == 1)
    assert [g.episode_ids for g in h.groups] == [["b1", "b2"], ["a1", "a2"]]  # B was complete first
    assert [d.episode_id for d in h.batches[0].datums] == ["a1", "a2", "b1", "b2"]


async def test_each_step_gets_its_own_batch():
    async with assigner(group_size=1, batch_size=1) as h:
        await h.episode("s1", "G1", 1.0, step=1)
        await h.episode("s0", "G0", 0.0, step=0)
        await h.until(lambda: len(h.batches) == 2)
    assert [b.step for b in h.batches] == [1, 0]


async def test_failed_episodes_are_excluded_and_counted_by_reason():
    async with assigner(group_size=3, batch_size=2) as h:
        await h.episode("a1", "A", 1.0)
        await h.episode("a2", "A", 0.0)
        await h.episode("a3", "A", None, reason="the harness raised ValueError: nope")
        await h.episode("b1", "B", 1.0)
        await h.episode("b2", "B", None, reason="the episode passed its 5 s timeout")
        await h.episode("b3", "B", None, reason="the env session failed to open: no image")
        await h.until(lambda: len(h.batches) == 1)
    (batch,) = h.batches
    assert batch.stats["episodes/total"] == 6
    assert batch.stats["episodes/graded"] == 3
    assert batch.stats["reward/mean"] == pytest.approx(2 / 3)
    assert {k: v for k, v in batch.stats.items() if k.startswith("episodes/failed/")} == {
        "episodes/failed/harness_raised": 1.0,
        "episodes/failed/timeout": 1.0,
        "episodes/failed/env_session": 1.0,
    }
    # Never a reward of 0: the failed episodes contribute no datums at all.
    assert {d.episode_id for d in batch.datums} == {"a1", "a2"}
    # The group's rewards (None included) are published as they came.
    assert [g.rewards for g in h.groups] == [[1.0, 0.0, None], [1.0, None, None]]


async def test_the_share_of_replies_cut_by_max_tokens_is_counted_per_step():
    async with assigner(group_size=2, batch_size=1) as h:
        for episode, reward, cuts in (("a1", 1.0, ["stop", "length"]), ("a2", 0.0, ["length", "length"])):
            await h.request(episode, "A")
            await h.agent(episode, f"{episode}/root")
            for i, reason in enumerate(cuts):
                await h.call(
                    episode, f"{episode}/root", [1, 2, 3, *range(10, 10 + 2 * i)], [4, 5], stop_reason=reason
                )
            await h.grade(episode, "A", reward)
        await h.until(lambda: len(h.batches) == 1)
    assert h.batches[0].stats["replies/truncated_fraction"] == 0.75
    assert h.batches[0].stats["replies/count"] == 4


async def test_a_non_finite_reward_drops_its_episode_not_the_run():
    async with assigner(group_size=2, batch_size=2) as h:
        await h.episode("a1", "A", 1.0)
        await h.episode("a2", "A", float("nan"))
        await h.episode("b1", "B", float("inf"))
        await h.episode("b2", "B", 0.0)
        await h.until(lambda: len(h.batches) == 1)
    (batch,) = h.batches
    assert batch.stats["episodes/failed/non_finite_reward"] == 2.0
    assert batch.stats["reward/mean"] == 0.5
    assert {d.episode_id for d in batch.datums} <= {"a1", "b2"}
    assert all(math.isfinite(a) for d in batch.datums for a in d.advantages)


@register_credit_rule("test-fails-on-half")
def fails_on_half(rewards: list[float]) -> list[float]:
    """A plugin's credit rule with a bug: a group holding a reward of 0.5 gets a NaN advantage."""
    mean = sum(rewards) / len(rewards)
    return [math.nan if 0.5 in rewards else r - mean for r in rewards]


async def test_a_group_whose_credit_fails_is_dropped_and_counted_not_the_run():
    async with assigner(group_size=2, batch_size=2, credit=CreditConfig(baseline="test-fails-on-half")) as h:
        await h.episode("a1", "A", 1.0)
        await h.episode("a2", "A", 0.5)
        await h.episode("b1", "B", 1.0)
        await h.episode("b2", "B", 0.0)
        await h.until(lambda: len(h.batches) == 1)
        # The next step trains as usual: the assigner is still running.
        await h.episode("c1", "C", 1.0, step=1)
        await h.episode("c2", "C", 0.0, step=1)
        await h.episode("d1", "D", 0.0, step=1)
        await h.episode("d2", "D", 1.0, step=1)
        await h.until(lambda: len(h.batches) == 2)
    first, second = h.batches
    assert {d.episode_id for d in first.datums} == {"b1", "b2"}
    assert first.stats["episodes/failed/credit_error"] == 2.0
    assert first.stats["credit/groups_failed"] == 1.0
    assert (first.stats["episodes/graded"], first.stats["reward/mean"]) == (2.0, 0.5)
    assert {d.episode_id for d in second.datums} == {"c1", "c2", "d1", "d2"}
    assert "episodes/failed/credit_error" not in second.stats


async def test_credit_that_fails_for_every_group_step_after_step_ends_the_run_saying_why():
    credit = CreditAssigner(
        CreditSettings(group_size=2, batch_size=1, credit=CreditConfig(baseline="test-fails-on-half"))
    )
    batches: list[BatchReady] = []
    with pytest.raises(BaseExceptionGroup) as raised:  # the assigner's own failure, in its task group
        async with Bus() as bus:
            bus.subscribe(BatchReady, batches.append)
            credit.attach(bus)
            with anyio.fail_after(10):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(credit.run, bus)
                    feed = Feed(bus, credit)
                    for step in range(3):
                        await feed.episode(f"e{step}", f"G{step}", 0.5, step=step)
                        await feed.episode(f"f{step}", f"G{step}", 1.0, step=step)
    error: BaseException = raised.value
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    assert isinstance(error, CreditError)
    assert "every group of 3 steps in a row" in str(error)
    assert "credit rule returned a non-finite advantage" in str(error)
    assert [b.stats["episodes/failed/credit_error"] for b in batches] == [2.0, 2.0]


async def test_the_straggler_timeout_closes_a_group_with_a_quorum_and_drops_late_results():
    async with assigner(group_size=4, batch_size=1, straggler_timeout=0.2, straggler_quorum=0.5) as h:
        for episode in ("a1", "a2", "a3", "a4"):
            await h.request(episode, "A")
        await h.episode("a1", "A", 1.0)
        await h.settle()
        await anyio.sleep(0.3)  # past the timeout, but one grade of four is no quorum
        assert h.groups == []
        await h.episode("a2", "A", 0.0)  # the quorum: the overdue group closes at once
        await h.until(lambda: len(h.batches) == 1)
        assert h.groups[0].episode_ids == ["a1", "a2"]
        assert {d.episode_id for d in h.batches[0].datums} == {"a1", "a2"}

        # The stragglers arrive late: dropped, and counted in the next batch's stats.
        await h.grade("a3", "A", 1.0)
        await h.grade("a4", "A", 0.0)
        await h.episode("b1", "B", 1.0, step=1)
        await h.episode("b2", "B", 0.0, step=1)
        await h.until(lambda: len(h.batches) == 2)
    assert h.batches[0].stats["episodes/dropped_stragglers"] == 0
    assert h.batches[1].stats["episodes/dropped_stragglers"] == 2
    assert {d.episode_id for d in h.batches[1].datums} == {"b1", "b2"}


async def test_a_quorate_group_closes_when_the_straggler_timeout_passes():
    async with assigner(group_size=4, batch_size=1, straggler_timeout=0.15, straggler_quorum=0.5) as h:
        await h.episode("a1", "A", 1.0)
        await h.episode("a2", "A", 0.0)
        await h.settle()
        assert h.batches == []
        await h.until(lambda: len(h.batches) == 1, timeout=2)
    assert h.groups[0].episode_ids == ["a1", "a2"]


async def test_calls_are_recorded_per_agent_and_merged_by_prefix():
    async with assigner(group_size=2, batch_size=1) as h:
        for episode, reward in (("e1", 1.0), ("e2", 0.0)):
            await h.request(episode, "G")
            await h.agent(episode, f"{episode}/root")
            await h.agent(episode, f"{episode}/child", parent=f"{episode}/root", depth=1)
            # Interleaved, as concurrent agents' calls arrive; each agent's second call extends
            # its first prompt + completion with a tool result (6, 7), so one datum per agent.
            await h.call(episode, f"{episode}/root", [1, 2, 3], [4, 5], version=3)
            await h.call(episode, f"{episode}/child", [9, 9], [10], version=3)
            await h.call(episode, f"{episode}/root", [1, 2, 3, 4, 5, 6, 7], [8], version=3)
            await h.call(episode, f"{episode}/child", [9, 9, 10, 11], [12], version=3)
            await h.grade(episode, "G", reward)
        await h.until(lambda: len(h.batches) == 1)
    datums = {(d.episode_id, d.agent_id): d for d in h.batches[0].datums}
    assert set(datums) == {(e, f"{e}/{a}") for e in ("e1", "e2") for a in ("root", "child")}
    root = datums["e1", "e1/root"]
    assert root.model_input == [1, 2, 3, 4, 5, 6, 7]
    assert root.target_tokens == [2, 3, 4, 5, 6, 7, 8]
    assert root.weights == [0, 0, 1, 1, 0, 0, 1]
    assert root.logprobs == [0, 0, -0.5, -0.5, 0, 0, -0.5]
    assert root.advantages == [0, 0, 0.5, 0.5, 0, 0, 0.5]
    assert (root.depth, root.policy_version) == (0, 3)
    child = datums["e2", "e2/child"]
    assert (child.model_input, child.target_tokens, child.weights) == (
        [9, 9, 10, 11],
        [9, 10, 11, 12],
        [0, 1, 0, 1],
    )
    assert child.depth == 1 and child.advantages[1] == -0.5


async def test_each_step_says_how_often_the_root_delegated_once_a_tree_grew():
    """`agents/delegated`: the share of a step's graded episodes whose root spawned a subagent;
    absent while no tree grew, then reported every step, 0 included (delegation may die out)."""
    async with assigner(group_size=2, batch_size=1) as h:
        for step, spawns in enumerate([(False, False), (True, False), (False, False)]):
            for n, spawned in enumerate(spawns):
                episode = f"s{step}e{n}"
                await h.request(episode, f"G{step}", step=step)
                await h.agent(episode, f"{episode}/root")
                await h.call(episode, f"{episode}/root", [1, 2, 3], [4, 5])
                if spawned:
                    await h.agent(episode, f"{episode}/child", parent=f"{episode}/root", depth=1)
                    await h.call(episode, f"{episode}/child", [9, 9], [10])
                await h.grade(episode, f"G{step}", float(n), step=step)
            await h.until(lambda step=step: len(h.batches) == step + 1)
    assert [b.stats.get("agents/delegated") for b in h.batches] == [None, 0.5, 0.0]


async def test_eval_and_rollout_episodes_are_ignored():
    async with assigner(group_size=1, batch_size=1) as h:
        for purpose in ("eval", "rollout"):
            await h.request(f"{purpose}-1", purpose, purpose=purpose)
            await h.agent(f"{purpose}-1", "root")
            await h.call(f"{purpose}-1", "root", [1], [2])
            await h.grade(f"{purpose}-1", purpose, 1.0, purpose=purpose)
        await h.settle()
        assert (h.groups, h.batches, h.assigner.records) == ([], [], {})
        await h.episode("t1", "T", 1.0)
        await h.until(lambda: len(h.batches) == 1)
    assert h.batches[0].stats["episodes/total"] == 1

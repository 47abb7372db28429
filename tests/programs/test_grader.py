"""The grader: failed episodes are never rewards of 0, reward processors change rewards, and a
processor that raises leaves the episode ungraded with the reason."""

# ruff: noqa: F811 - pytest fixtures imported by name

from __future__ import annotations

import pytest
from programs_helpers import ToyBackend, entry, toy_system

from platoon.bus import Bus
from platoon.bus.events import EpisodeFinished, EpisodeGraded, TaskRef
from platoon.programs import Grader
from tokenizer_fixtures import toy_tokenizer  # noqa: F401

pytestmark = pytest.mark.anyio

TASK = TaskRef(env="toy", split="train", task_id="train-0")


def graded(events) -> EpisodeGraded:
    (event,) = [e for e in events if isinstance(e, EpisodeGraded)]
    return event


@pytest.mark.parametrize("status", ["error", "cancelled"])
async def test_error_and_cancelled_episodes_are_not_graded(status):
    event = EpisodeFinished(episode_id="e", group_id="g", task=TASK, status=status, reason="it broke")
    async with Bus() as bus:
        # No env service on this bus: the grader must not even ask for a grade.
        assert await Grader().grade(bus, event) == (None, {}, "it broke")
        bare = EpisodeFinished(episode_id="e", group_id="g", task=TASK, status=status)
        assert await Grader().grade(bus, bare) == (None, {}, status)


async def test_a_missing_env_service_is_a_grading_failure_not_a_reward():
    event = EpisodeFinished(episode_id="e", group_id="g", task=TASK, status="completed")
    async with Bus() as bus:
        reward, _, reason = await Grader().grade(bus, event)
    assert reward is None
    assert reason == "grading failed: nothing on the bus answers GradeRequested"


async def test_failed_episodes_keep_their_reason_through_grading(toy_tokenizer):
    async with toy_system(toy_tokenizer, entry("prog-raises")) as toy:
        event = graded(await toy.play())
    assert (event.status, event.reward, event.rewards) == ("error", None, {})
    assert event.reason == "the harness raised ValueError: the harness tripped"


async def test_an_env_whose_grading_raises_leaves_the_episode_ungraded(toy_tokenizer):
    async with toy_system(toy_tokenizer, backend=ToyBackend(grade_error="the checker crashed")) as toy:
        event = graded(await toy.play())
        assert await toy.all_closed()
    assert (event.status, event.reward) == ("completed", None)
    assert event.reason == "grading failed: RuntimeError: the checker crashed"


@pytest.mark.parametrize(
    ("processor", "reward"), [("programs_helpers:halve", 0.5), ("programs_helpers:add_bonus", 1.25)]
)
async def test_a_reward_processor_changes_the_reward(toy_tokenizer, processor, reward):
    async with toy_system(toy_tokenizer, reward_processors={"toy": processor}) as toy:
        event = graded(await toy.play())
    assert event.reward == reward
    assert event.rewards["processed"] == reward
    assert event.reason is None


async def test_a_reward_processor_applies_only_to_its_environment(toy_tokenizer):
    async with toy_system(toy_tokenizer, reward_processors={"elsewhere": "programs_helpers:halve"}) as toy:
        assert graded(await toy.play()).reward == 1.0


async def test_a_raising_reward_processor_leaves_the_episode_ungraded_with_the_reason(toy_tokenizer):
    async with toy_system(toy_tokenizer, reward_processors={"toy": "programs_helpers:broken"}) as toy:
        event = graded(await toy.play())
        # The run goes on, and the sessions were closed all the same.
        assert await toy.all_closed()
    assert event.reward is None
    assert event.reason == "the reward processor raised KeyError: 'no such field'"


def test_an_unknown_reward_processor_fails_when_the_grader_is_built():
    with pytest.raises(Exception, match=r"programs_helpers.*no_such_function"):
        Grader(reward_processors={"toy": "programs_helpers:no_such_function"})


async def test_a_non_finite_reward_leaves_the_episode_ungraded(toy_tokenizer):
    """NaN would poison the whole group's advantages: the episode counts as not graded."""
    async with toy_system(toy_tokenizer, reward_processors={"toy": "programs_helpers:not_a_number"}) as toy:
        event = graded(await toy.play())
    assert event.reward is None
    assert event.reason == "non-finite reward nan from the reward processor"
    assert "processed" not in event.rewards

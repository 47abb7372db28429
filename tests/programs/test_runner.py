"""The episode runner: every way an episode can end is recorded with its reason, the run goes
on, and no env session or gateway key is left open afterwards."""

# ruff: noqa: F811 - pytest fixtures imported by name

from __future__ import annotations

import anyio
import pytest
from programs_helpers import ToyBackend, entry, toy_system

from platoon.bus.events import (
    AgentSpawned,
    EpisodeFinished,
    EpisodeGraded,
    EpisodeRequested,
    EpisodeStarted,
    Event,
    ModelCallFinished,
    TaskRef,
    ToolReturned,
)
from platoon.harness import HarnessError, choose_harness
from platoon.programs import EpisodeRunner
from tokenizer_fixtures import toy_tokenizer  # noqa: F401

pytestmark = pytest.mark.anyio


def only(events: list[Event], kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


def finished(events: list[Event]) -> EpisodeFinished:
    (event,) = only(events, EpisodeFinished)
    return event


async def test_a_completed_episode_is_graded_and_closes_everything(toy_tokenizer):
    async with toy_system(toy_tokenizer) as toy:
        events = await toy.play("train-5")
        assert await toy.all_closed()
    done = finished(events)
    assert (done.status, done.reason) == ("completed", None)
    calls = only(events, ModelCallFinished)
    assert done.num_model_calls == len(calls) == len(only(events, ToolReturned)) >= 2
    assert only(events, EpisodeGraded)[0].reward == 1.0
    assert toy.backend.opened == toy.backend.closed == 1


async def test_a_harness_that_raises_is_an_error_with_its_reason(toy_tokenizer):
    async with toy_system(toy_tokenizer, entry("prog-raises")) as toy:
        events = await toy.play()
        assert await toy.all_closed()
        # The run goes on: the next episode plays normally.
        assert finished(await toy.play()).status == "error"
    done = finished(events)
    assert done.status == "error"
    assert done.reason == "the harness raised ValueError: the harness tripped"
    graded = only(events, EpisodeGraded)[0]
    assert (graded.reward, graded.reason) == (None, done.reason)


async def test_an_env_session_that_fails_to_open_is_an_error(toy_tokenizer):
    backend = ToyBackend(open_error="the sandbox image is missing")
    async with toy_system(toy_tokenizer, backend=backend) as toy:
        events = await toy.play()
        assert await toy.all_closed()
    done = finished(events)
    assert done.status == "error"
    assert done.reason == "the env session failed to open: the sandbox image is missing"
    assert not only(events, EpisodeStarted)  # it never started
    assert only(events, EpisodeGraded)[0].reward is None


async def test_a_hanging_tool_is_the_environments_failure_not_a_reward(toy_tokenizer):
    """The episode ends at the timeout, as an error: the harness does not go on calling a dead
    environment, and a grade would measure the environment, not the policy."""
    async with toy_system(toy_tokenizer, entry("prog-hanging-tool"), tool_timeout=0.2) as toy:
        events = await toy.play()
        assert await toy.all_closed()
    (returned,) = only(events, ToolReturned)
    assert returned.error == "tool hang timed out after 0.2s" and returned.env_fault
    done = finished(events)
    assert (done.status, done.final_message) == ("error", None)  # ended there, no answer given
    assert done.reason == "the environment failed: tool hang timed out after 0.2s"
    (graded,) = only(events, EpisodeGraded)
    assert graded.reward is None  # counted as failed, never trained on as a 0


async def test_an_env_may_declare_its_tool_errors_the_agents_doing(toy_tokenizer):
    async with toy_system(
        toy_tokenizer, entry("prog-hanging-tool"), tool_timeout=0.2, tool_errors="agent"
    ) as toy:
        events = await toy.play()
    (returned,) = only(events, ToolReturned)
    assert not returned.env_fault
    assert finished(events).status == "completed"
    assert only(events, EpisodeGraded)[0].reward == 0.0  # played, not found: graded


async def test_the_episode_timeout_ends_it_as_timeout(toy_tokenizer):
    async with toy_system(toy_tokenizer, entry("prog-sleeper", timeout=0.2)) as toy:
        with anyio.fail_after(5):
            events = await toy.play()
        assert await toy.all_closed()
    done = finished(events)
    assert done.status == "timeout"
    assert done.reason == "the episode passed its 0.2 s timeout"
    assert 0.2 <= done.duration_s < 2


async def test_a_harness_past_its_budget_ends_as_limit(toy_tokenizer):
    async with toy_system(toy_tokenizer, entry("prog-chatter", max_steps=3), script=lambda m: "Hm.") as toy:
        events = await toy.play()
        assert await toy.all_closed()
    done = finished(events)
    assert done.status == "limit"
    assert done.reason == "budget exhausted: all 3 model calls are used"
    assert done.num_model_calls == len(only(events, ModelCallFinished)) == 3
    # A budget that ran out is a played episode: it is graded.
    assert only(events, EpisodeGraded)[0].reward == 0.0


async def test_a_run_shut_down_mid_episode_records_it_as_cancelled_and_closes_the_session(toy_tokenizer):
    seen: list[Event] = []
    backend = ToyBackend()
    async with toy_system(toy_tokenizer, entry("prog-sleeper"), backend=backend) as toy:
        toy.bus.subscribe(Event, seen.append)
        async with toy.bus.stream(EpisodeStarted) as started:
            task = TaskRef(env="toy", split="train", task_id="train-1")
            await toy.bus.publish(EpisodeRequested(episode_id="ep-cancel", group_id="g", task=task))
            await started.receive()
    # Leaving the block cancelled every component mid-episode; the bus drained what they said.
    assert backend.opened == backend.closed == 1 and not backend.live
    (done,) = [e for e in seen if isinstance(e, EpisodeFinished)]
    assert (done.episode_id, done.status, done.reason) == ("ep-cancel", "cancelled", "cancelled")


async def test_a_runner_cancelled_alone_publishes_cancelled_and_the_grader_closes_the_session(toy_tokenizer):
    async with toy_system(toy_tokenizer, entry("prog-guesser")) as toy:
        runner = EpisodeRunner([entry("prog-sleeper")], request_timeout=5)
        request = EpisodeRequested(
            episode_id="ep-alone", group_id="g", task=TaskRef(env="toy", split="train", task_id="train-2")
        )
        async with toy.bus.stream(EpisodeGraded) as graded, toy.bus.stream(EpisodeStarted) as started:
            async with anyio.create_task_group() as tg:
                tg.start_soon(runner.play, toy.bus, request)
                await started.receive()  # the episode is under way
                tg.cancel_scope.cancel()
            grade = await graded.receive()
        assert (grade.episode_id, grade.status, grade.reward, grade.reason) == (
            "ep-alone",
            "cancelled",
            None,
            "cancelled",
        )
        assert await toy.all_closed()


async def test_harness_options_reach_the_harness(toy_tokenizer):
    options = {"retries": "3", "mode": "careful"}  # strings from key=value overrides convert
    async with toy_system(toy_tokenizer, entry("prog-options", harness_options=options)) as toy:
        done = finished(await toy.play())
    assert done.final_message == "3 careful"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retries": "many"}, "environments.2.harness_options.retries: expected int, got str"),
        (
            {"mode": "slow"},
            "environments.2.harness_options.mode: expected one of 'careful', 'fast', got 'slow'",
        ),
        ({"retry": 2}, "environments.2.harness_options.retry: unknown option of harness 'prog-options'"),
    ],
)
async def test_bad_harness_options_fail_before_anything_runs_naming_the_path(options, message):
    with pytest.raises(HarnessError) as caught:
        EpisodeRunner([entry("prog-options", harness_options=options, path="environments.2")])
    assert str(caught.value) == message


async def test_options_are_checked_for_every_harness_of_a_mixture():
    with pytest.raises(HarnessError, match=r"environments.0.harness_options.retries: harness 'prog-guesser'"):
        EpisodeRunner(
            [
                entry(
                    {"prog-options": 1, "prog-guesser": 1},
                    harness_options={"retries": 2},
                    path="environments.0",
                )
            ]
        )
    with pytest.raises(HarnessError, match="unknown harness 'no-such-harness'"):
        EpisodeRunner([entry("no-such-harness")])


async def test_a_mixture_plays_both_harnesses_chosen_by_seed(toy_tokenizer):
    mixture = {"prog-guesser": 1.0, "prog-other": 1.0}
    ids = [f"ep-{i}" for i in range(16)]

    async def picks(seed: int) -> list[str]:
        async with toy_system(toy_tokenizer, entry(mixture), seed=seed) as toy:
            chosen = []
            for episode_id in ids:
                events = await toy.play(episode_id=episode_id)
                chosen.append(only(events, AgentSpawned)[0].harness)
                assert finished(events).status == "completed"
            return chosen

    first = await picks(seed=3)
    assert set(first) == set(mixture)
    assert first == [choose_harness(mixture, episode_id, 3) for episode_id in ids]
    assert await picks(seed=3) == first  # a rerun picks the same harnesses
    assert await picks(seed=4) != first  # another seed, another draw


async def test_a_seeded_episode_draws_its_harness_from_its_seed_not_its_id(toy_tokenizer):
    """A rerun of a seeded run (fresh episode ids, the same seeds) plays the same harnesses."""
    mixture = {"prog-guesser": 1.0, "prog-other": 1.0}

    async def picks() -> list[str]:
        async with toy_system(toy_tokenizer, entry(mixture), seed=3) as toy:
            return [only(await toy.play(seed=s), AgentSpawned)[0].harness for s in range(12)]

    first = await picks()
    assert set(first) == set(mixture)
    assert await picks() == first


async def test_a_request_can_name_its_harness(toy_tokenizer):
    async with toy_system(toy_tokenizer, entry({"prog-guesser": 1.0, "prog-other": 0.0})) as toy:
        events = await toy.play(harness="prog-other")
    assert only(events, AgentSpawned)[0].harness == "prog-other"


async def test_a_tool_still_running_when_the_episode_times_out_does_not_hold_up_its_grade(toy_tokenizer):
    """The episode's own timeout ends it; grading stops the hanging tool instead of waiting
    out the (much longer) tool timeout."""
    async with toy_system(toy_tokenizer, entry("prog-hanging-tool", timeout=0.3), tool_timeout=60) as toy:
        answers: list[ToolReturned] = []
        toy.bus.subscribe(ToolReturned, answers.append)
        with anyio.fail_after(20):  # a bound for a broken service; the grade comes at once
            events = await toy.play()
        assert await toy.all_closed()
        await toy.bus.drained()
    assert finished(events).status == "timeout"
    (graded,) = only(events, EpisodeGraded)
    # Ungraded, with the reason: what a timed-out agent left is no answer (it was once graded 0.0).
    assert graded.reward is None and "timeout" in (graded.reason or "")
    (returned,) = answers
    assert returned.error == "tool hang was stopped: the agent's episode ended first"
    assert not returned.env_fault

"""`platoon-react` plays guess-the-number through the runner, gateway and env service, and a
mixture with the quickstart's function harness picks both."""

from __future__ import annotations

import collections
import json

import pytest
from agents.episodes import binary_search, guessing

from platoon.bus.events import AgentSpawned, EpisodeFinished, EpisodeGraded, ModelCallFinished, ToolCalled
from platoon.harness import AgentContext, HarnessError, get_harness, validate_options
from platoon.harness.builtin.react import ReactOptions, _run_call, cut

pytestmark = pytest.mark.anyio


async def test_react_plays_guess_the_number(toy_tokenizer):
    async with guessing(toy_tokenizer, binary_search, "platoon-react") as system:
        events = await system.play("train-42")

    finished = next(e for e in events if isinstance(e, EpisodeFinished))
    graded = next(e for e in events if isinstance(e, EpisodeGraded))
    guesses = [e.arguments["number"] for e in events if isinstance(e, ToolCalled)]
    assert guesses == [50, 25, 37, 43, 40, 41, 42]
    assert (finished.status, finished.final_message, finished.num_model_calls) == ("completed", "Correct!", 7)
    assert graded.reward == 1.0
    assert len([e for e in events if isinstance(e, ModelCallFinished)]) == 7


async def test_react_options_reach_the_model(toy_tokenizer):
    seen: list[list[dict]] = []

    def script(messages):
        seen.append(messages)
        if len(seen) == 1:
            return "I think it is 42."
        return binary_search(messages)

    options = {"system_prompt": "Be brief.", "stop_on_text": False, "max_tool_output_chars": 6}
    async with guessing(toy_tokenizer, script, "platoon-react", harness_options=options) as system:
        events = await system.play("train-2")

    finished = next(e for e in events if isinstance(e, EpisodeFinished))
    assert seen[0][0] == {"role": "system", "content": "Be brief."}
    # The text answer did not end the episode: the model was asked to go on.
    assert seen[1][-1] == {"role": "user", "content": "Continue: use the tools to finish the task."}
    # "higher" and "lower" fit in 6 characters; "Correct!" is cut.
    assert finished.status == "completed"
    assert finished.final_message == "Cor\n[... 2 characters cut ...]\nct!"


async def test_react_stops_at_the_budget(toy_tokenizer):
    options = {"stop_on_text": False}
    async with guessing(
        toy_tokenizer, ["Hm."] * 3, "platoon-react", max_steps=3, harness_options=options
    ) as system:
        events = await system.play()

    finished = next(e for e in events if isinstance(e, EpisodeFinished))
    assert (finished.status, finished.num_model_calls) == ("limit", 3)


async def test_malformed_tool_calls_are_answered_not_run():
    class NoTools:
        call_tool_call = AgentContext.call_tool_call

        async def call_tool(self, name, arguments):
            raise AssertionError("a malformed call must not reach the environment")

    bad_json = {"id": "1", "function": {"name": "guess", "arguments": "{not json"}}
    not_object = {"id": "2", "function": {"name": "guess", "arguments": "[1, 2]"}}
    assert (await _run_call(NoTools(), bad_json, 100))[0].startswith(
        "Error: the arguments of guess are not valid JSON"
    )
    assert await _run_call(NoTools(), not_object, 100) == (
        "Error: the arguments of guess must be a JSON object",
        False,
    )


async def test_a_mixture_picks_both_harnesses(toy_tokenizer):
    import guesser  # noqa: F401 - registers example-guesser

    mixture = {"platoon-react": 1, "example-guesser": 1}
    async with guessing(toy_tokenizer, binary_search, mixture) as system:
        # Seeded episodes: the draw depends on the seed alone (11 and 9 of 20 with these).
        runs = [await system.play(f"train-{n}", seed=n) for n in range(1, 21)]

    picked = collections.Counter(next(e.harness for e in run if isinstance(e, AgentSpawned)) for run in runs)
    rewards = [next(e.reward for e in run if isinstance(e, EpisodeGraded)) for run in runs]
    assert set(picked) == {"platoon-react", "example-guesser"}
    assert min(picked.values()) >= 4
    assert rewards == [1.0] * 20


def test_react_options_are_checked():
    react = get_harness("platoon-react")
    assert validate_options(react, {"stop_on_text": False}) == ReactOptions(stop_on_text=False)
    with pytest.raises(HarnessError) as exc:
        validate_options(react, {"max_tool_output_chars": 0}, "environments.0.harness_options")
    assert str(exc.value) == "environments.0.harness_options.max_tool_output_chars: expected int >= 1"
    with pytest.raises(
        HarnessError, match=r"harness_options.retries: unknown option of harness 'platoon-react'"
    ):
        validate_options(react, {"retries": 2})


def test_cut_keeps_both_ends():
    text = "a" * 50 + "b" * 50
    short = cut(text, 20)
    assert short.startswith("a" * 10) and short.endswith("b" * 10) and "80 characters cut" in short
    assert cut("short", 20) == "short"
    assert json.dumps(cut("", 1)) == '""'

"""Command-line harnesses from TOML specs: a real agent script (openai + mcp clients) plays
guess-the-number through the gateway's HTTP and the MCP tool server, its calls are recorded
with the scripted tokens, and its options are checked like any harness's."""

from __future__ import annotations

import shutil

import pytest
from agents.episodes import AGENTS, binary_search, guessing

from platoon.bus.events import (
    AgentSpawned,
    EpisodeFinished,
    EpisodeGraded,
    ModelCallFinished,
    ToolCalled,
)
from platoon.harness import HarnessError, get_harness, validate_options
from platoon.harness.command import CommandHarness, load_spec_harness
from platoon.programs import EntrySettings, EpisodeRunner

pytestmark = pytest.mark.anyio

SPEC = AGENTS / "openai_mcp_agent.toml"


def first(events, kind):
    return next(e for e in events if isinstance(e, kind))


@pytest.mark.slow
async def test_a_cli_agent_plays_through_the_gateway_and_mcp(toy_tokenizer):
    async with guessing(toy_tokenizer, binary_search, str(SPEC)) as system:
        events = await system.play("train-42")

    finished, graded = first(events, EpisodeFinished), first(events, EpisodeGraded)
    agent = first(events, AgentSpawned).agent_id
    assert (finished.status, finished.final_message, finished.reason) == ("completed", "Correct!", None)
    assert graded.reward == 1.0
    tools = [e for e in events if isinstance(e, ToolCalled)]
    assert [e.arguments["number"] for e in tools] == [50, 25, 37, 43, 40, 41, 42]
    assert {e.agent_id for e in tools} == {agent}
    # Every call the script made over HTTP is recorded for its agent, with the sampled tokens.
    calls = [e for e in events if isinstance(e, ModelCallFinished)]
    stop = toy_tokenizer.convert_tokens_to_ids("<|im_end|>")
    expected = []
    lo, hi = 1, 100
    for guess, answer in zip(
        [50, 25, 37, 43, 40, 41, 42],
        ["lower", "higher", "higher", "lower", "higher", "higher", ""],
        strict=True,
    ):
        assert guess == (lo + hi) // 2
        text = f'<tool_call>\n{{"name": "guess", "arguments": {{"number": {guess}}}}}\n</tool_call>'
        expected.append([*toy_tokenizer.encode(text, add_special_tokens=False), stop])
        lo, hi = (guess + 1, hi) if answer == "higher" else (lo, guess - 1)
    assert [c.completion_tokens for c in calls] == expected
    assert {(c.agent_id, c.kind) for c in calls} == {(agent, "policy")}
    assert all(len(c.logprobs) == len(c.completion_tokens) for c in calls)
    assert finished.num_model_calls == 7


ASYNCIO_ONLY = pytest.mark.parametrize("anyio_backend", ["asyncio"])  # each run starts a Python agent


@pytest.mark.slow
@ASYNCIO_ONLY
async def test_exit_codes_map_to_statuses(toy_tokenizer):
    options = {"max_turns": 2}
    async with guessing(toy_tokenizer, binary_search, str(SPEC), harness_options=options) as system:
        events = await system.play("train-42")
    finished = first(events, EpisodeFinished)
    assert finished.status == "limit"
    assert finished.reason == "test-openai-mcp exited with code 3: no answer after 2 turns"
    assert first(events, EpisodeGraded).reward == 0.0


@pytest.mark.slow
@ASYNCIO_ONLY
async def test_an_agent_refused_past_its_budget_ends_in_limit(toy_tokenizer):
    async with guessing(toy_tokenizer, binary_search, str(SPEC), max_steps=3) as system:
        events = await system.play("train-42")
    finished = first(events, EpisodeFinished)
    assert (finished.status, finished.num_model_calls) == ("limit", 3)
    assert finished.reason.startswith("out of model calls; test-openai-mcp exited with code 1: ")
    assert "budget" in finished.reason


def test_spec_options_are_checked_with_dotted_paths():
    agent = get_harness(str(SPEC))
    assert isinstance(agent, CommandHarness) and agent.name == "test-openai-mcp"
    assert validate_options(agent, {}).max_turns == 20
    assert validate_options(agent, {"max_turns": "7", "model": "platoon-policy"}).max_turns == 7
    path = "environments.0.harness_options"
    cases = {
        "turns": f"{path}.turns: unknown option of harness 'test-openai-mcp'",
        "max_turns": f"{path}.max_turns: expected int, got str",
        "model": f"{path}.model: expected one of 'platoon-policy', 'policy', got 'gpt'",
    }
    bad = {"turns": 3, "max_turns": "many", "model": "gpt"}
    for key, message in cases.items():
        with pytest.raises(HarnessError) as exc:
            validate_options(agent, {key: bad[key]}, path)
        assert str(exc.value) == message
    with pytest.raises(HarnessError) as exc:
        validate_options(agent, {"max_turns": 0}, path)
    assert str(exc.value) == f"{path}.max_turns: expected int >= 1"
    with pytest.raises(HarnessError) as exc:
        validate_options(agent, {"max_turns": 101}, path)
    assert str(exc.value) == f"{path}.max_turns: expected int <= 100"


def test_the_runner_checks_a_specs_options_before_anything_runs():
    entry = EntrySettings(
        name="guess",
        harness=str(SPEC),
        harness_options={"max_turns": -1},
        path="environments.2",
    )
    with pytest.raises(
        HarnessError, match=r"^environments\.2\.harness_options\.max_turns: expected int >= 1$"
    ):
        EpisodeRunner([entry])


def test_load_spec_harness_reads_the_file():
    agent = load_spec_harness(SPEC)
    assert agent.spec_dir == AGENTS
    assert agent.uses_mcp
    assert agent.exit_codes == {3: "limit"}
    assert agent.description.startswith("An agent script using the openai client")


@ASYNCIO_ONLY
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
async def test_an_env_without_a_sandbox_gives_the_agent_a_fresh_one_with_tools_over_mcp(toy_tokenizer):
    spec = AGENTS / "stdlib_mcp_agent.toml"
    async with guessing(toy_tokenizer, binary_search, str(spec)) as system:
        events = await system.play("train-42")
    finished, graded = first(events, EpisodeFinished), first(events, EpisodeGraded)
    assert (finished.status, finished.final_message, graded.reward) == ("completed", "Correct!", 1.0)
    tools = [e.arguments["number"] for e in events if isinstance(e, ToolCalled)]
    assert tools == [50, 25, 37, 43, 40, 41, 42]  # each through the forwarded MCP port
    assert finished.num_model_calls == 7

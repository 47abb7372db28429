"""`platoon-bash`: its tool-calling loop over a fake context, its options, and a real episode
on an environment without a bash tool (it falls back to the environment's tools)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agents.episodes import binary_search, guessing

from platoon.bus.events import EpisodeFinished, EpisodeGraded, ToolSpec
from platoon.envs.harbor.service import BASH_TOOL
from platoon.harness import (
    AgentContext,
    AgentResult,
    BudgetExhausted,
    HarnessError,
    ToolResult,
    get_harness,
    validate_options,
)
from platoon.harness.builtin.bash import DEFAULT_SYSTEM_PROMPT, BashOptions
from platoon.harness.context import ChatReply

pytestmark = pytest.mark.anyio


class FakeContext:
    """The parts of AgentContext that platoon-bash uses, answering from a list of replies."""

    def __init__(self, replies: list[dict[str, Any]], tools: list[ToolSpec], *, outputs=None, options=None):
        self.instruction = "Count the files."
        self.options = options
        self.replies = list(replies)
        self.tools = tools
        self.outputs = outputs or {}
        self.chats: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = []
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.budget = self

    def remaining(self) -> int:
        return len(self.replies)

    async def list_tools(self) -> list[ToolSpec]:
        return self.tools

    def openai_tools(self) -> list[dict[str, Any]]:
        return [
            {"type": "function", "function": {"name": t.name, "parameters": t.input_schema}}
            for t in self.tools
        ]

    async def chat(self, messages, tools=None) -> ChatReply:
        self.chats.append(([dict(m) for m in messages], tools))
        if not self.replies:
            raise BudgetExhausted("no model calls left")
        return ChatReply(message=self.replies.pop(0), call_id="c", finish_reason="stop")

    call_tool_call = AgentContext.call_tool_call  # parses the call, then calls `call_tool` below

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        self.calls.append((name, arguments))
        output, finished = self.outputs.get(name, ("ok", False))
        return ToolResult(name=name, output=output, finished=finished)


def tool_call(name: str, arguments: Any) -> dict[str, Any]:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "t1", "type": "function", "function": {"name": name, "arguments": raw}}],
    }


async def test_runs_bash_calls_until_the_model_answers_in_text():
    ctx = FakeContext(
        [tool_call("bash", {"command": "ls | wc -l"}), {"role": "assistant", "content": "There are 3."}],
        [BASH_TOOL, ToolSpec(name="submit")],
        outputs={"bash": ("3\n[exit code 0]", False)},
        options=BashOptions(command_timeout=5),
    )
    result = await get_harness("platoon-bash").run(ctx)

    assert result == AgentResult("completed", final_message="There are 3.")
    # Only bash is offered when the environment has it; the command timeout is filled in.
    assert [t["function"]["name"] for t in ctx.chats[0][1]] == ["bash"]
    assert ctx.calls == [("bash", {"command": "ls | wc -l", "timeout": 5.0})]
    first = ctx.chats[0][0]
    assert first == [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": "Count the files."},
    ]
    assert ctx.chats[1][0][-1] == {"role": "tool", "tool_call_id": "t1", "content": "3\n[exit code 0]"}


async def test_a_finished_tool_result_ends_the_agent_and_long_output_is_cut():
    ctx = FakeContext(
        [tool_call("bash", {"command": "sleep 99", "timeout": 200})],
        [BASH_TOOL],
        outputs={"bash": ("x" * 30 + "[the agent's time limit is up]", True)},
        options=BashOptions(max_output_chars=20),
    )
    result = await get_harness("platoon-bash").run(ctx)
    assert ctx.calls == [("bash", {"command": "sleep 99", "timeout": 200})]  # the model's own timeout wins
    assert result.status == "completed"
    assert result.final_message == "x" * 10 + "\n[... 40 characters cut ...]\n" + "mit is up]"


async def test_malformed_calls_are_answered_and_the_budget_ends_the_loop():
    ctx = FakeContext([tool_call("bash", "{not json"), tool_call("bash", "[1, 2]")], [BASH_TOOL])
    result = await get_harness("platoon-bash").run(ctx)
    assert result == AgentResult("limit", reason="out of model calls")
    assert ctx.calls == []
    tool_messages = [m["content"] for m in ctx.chats[1][0] if m["role"] == "tool"]
    assert tool_messages[0].startswith("Error: the arguments of bash are not valid JSON")


async def test_without_a_bash_tool_the_environments_tools_are_offered():
    ctx = FakeContext(
        [tool_call("guess", {"number": 3}), {"role": "assistant", "content": "ok"}], [ToolSpec(name="guess")]
    )
    await get_harness("platoon-bash").run(ctx)
    assert [t["function"]["name"] for t in ctx.chats[0][1]] == ["guess"]
    assert ctx.calls == [("guess", {"number": 3})]  # no timeout added to a tool that is not bash


def test_options_are_checked():
    harness = get_harness("platoon-bash")
    options = validate_options(
        harness, {"system_prompt": "Be terse.", "command_timeout": 5}, "environments.0.harness_options"
    )
    assert options == BashOptions(system_prompt="Be terse.", command_timeout=5.0)
    with pytest.raises(
        HarnessError,
        match=r"environments\.0\.harness_options\.timeout: unknown option of harness 'platoon-bash'",
    ):
        validate_options(harness, {"timeout": 5}, "environments.0.harness_options")
    with pytest.raises(HarnessError, match="max_output_chars"):
        validate_options(harness, {"max_output_chars": 0}, "environments.0.harness_options")


async def test_plays_a_real_episode_with_the_environments_own_tools(toy_tokenizer):
    async with guessing(toy_tokenizer, binary_search, "platoon-bash") as system:
        events = await system.play("train-42")
    finished = next(e for e in events if isinstance(e, EpisodeFinished))
    graded = next(e for e in events if isinstance(e, EpisodeGraded))
    assert (finished.status, finished.final_message, graded.reward) == ("completed", "Correct!", 1.0)

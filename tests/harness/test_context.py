"""`AgentContext`, what a function harness sees: chat through the gateway (replies, params,
budget, errors), tools through the bus, and the small helpers around them."""

# ruff: noqa: F811
from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest

from platoon.bus import Bus, RequestTimeout
from platoon.bus.chat import ChatMessage, ChatToolCall
from platoon.bus.events import (
    AgentOpened,
    AgentOpenRequested,
    ChatRequested,
    ModelCallFinished,
    TaskRef,
    ToolCalled,
    ToolReturned,
    ToolSpec,
)
from platoon.gateway import Gateway, GatewayPolicy, GatewaySettings
from platoon.gateway.renderers import get_renderer
from platoon.harness.context import AgentContext, AgentResult, Budget, BudgetExhausted, ChatError, ToolResult
from platoon.testing.policies import ScriptedSamplerFactory
from tokenizer_fixtures import toy_tokenizer  # noqa: F401

pytestmark = pytest.mark.anyio
USER = [{"role": "user", "content": "Guess."}]
SCHEMA = {"type": "object", "properties": {"number": {"type": "integer"}}, "required": ["number"]}
GUESS = ToolSpec(name="guess", description="Guess the number.", input_schema=SCHEMA)
CALL = '<tool_call>\n{"name": "guess", "arguments": {"number": 50}}\n</tool_call>'


def context(bus: Bus, **options: Any) -> AgentContext:
    defaults: dict[str, Any] = dict(
        bus=bus,
        task=TaskRef(env="toy", split="train", task_id="0"),
        episode_id="ep1",
        agent_id="ep1/root",
        instruction="Guess.",
        tools=[GUESS],
        budget=Budget(None),
        request_timeout=5,
    )
    return AgentContext(**(defaults | options))


@asynccontextmanager
async def gateway_bus(
    tokenizer: Any, script: list[str], records: list[ModelCallFinished] | None = None, **options: Any
) -> AsyncIterator[Bus]:
    """A bus with a gateway on it (no HTTP) answering from `script`."""
    gateway = Gateway(
        GatewayPolicy(
            get_renderer(options.pop("renderer", "qwen3_instruct"), tokenizer),
            ScriptedSamplerFactory(tokenizer, script),
        ),
        GatewaySettings(serve_http=False),
    )
    async with Bus() as bus:
        if records is not None:
            bus.subscribe(ModelCallFinished, records.append)
        gateway.attach(bus)
        bus.start_soon(gateway.run, bus)
        yield bus


async def opened_context(bus: Bus, max_model_calls: int | None = None) -> AgentContext:
    reply = await bus.request(
        AgentOpenRequested(episode_id="ep1", agent_id="ep1/root", max_model_calls=max_model_calls)
    )
    assert isinstance(reply, AgentOpened)
    return context(bus, budget=Budget(max_model_calls), api_key=reply.key)


async def test_chat_returns_the_reply_and_its_parts(toy_tokenizer):
    script = ["<think>\nMiddle.\n</think>\n\nFifty?\n" + CALL]
    async with gateway_bus(toy_tokenizer, script, renderer="qwen3") as bus:
        ctx = await opened_context(bus)
        reply = await ctx.chat(USER, ctx.openai_tools())

    assert reply.text == "Fifty?"
    assert reply.reasoning == "Middle."
    [call] = reply.tool_calls
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("guess", {"number": 50})
    assert reply.finish_reason == "tool_calls"
    assert reply.prompt_tokens > 0 and reply.completion_tokens > 0 and reply.call_id


async def test_context_params_are_defaults_that_a_call_overrides(toy_tokenizer):
    text = "one two three four five six seven"
    records: list[ModelCallFinished] = []
    async with gateway_bus(toy_tokenizer, [text, text], records) as bus:
        ctx = await opened_context(bus)
        ctx.params = {"max_tokens": 2, "temperature": 0.5}
        short = await ctx.chat(USER)
        longer = await ctx.chat(USER, max_tokens=4)
        await bus.drained()

    assert (short.finish_reason, short.completion_tokens) == ("length", 2)
    assert (longer.finish_reason, longer.completion_tokens) == ("length", 4)
    assert [len(r.completion_tokens) for r in records] == [2, 4]


async def test_the_budget_follows_what_the_gateway_reports(toy_tokenizer):
    async with gateway_bus(toy_tokenizer, ["a", "b", "c", "d"]) as bus:
        ctx = await opened_context(bus, max_model_calls=2)
        assert ctx.budget.remaining() == 2
        await ctx.chat(USER)
        await ctx.chat(USER, kind="aux")
        assert (ctx.budget.used, ctx.budget.remaining()) == (1, 1)
        await ctx.chat(USER)
        assert ctx.budget.remaining() == 0
        with pytest.raises(BudgetExhausted, match="budget exhausted"):
            await ctx.chat(USER)
        await ctx.chat(USER, kind="judge")


def test_an_unlimited_budget_and_a_deadline():
    budget = Budget(None)
    assert budget.remaining() == 2**31 and budget.seconds_left() is None
    budget = Budget(5, deadline=time.monotonic() - 1)
    assert budget.remaining() == 0 and budget.seconds_left() == 0.0


async def test_chat_reads_plain_dicts_as_messages_and_names_one_that_does_not_fit(toy_tokenizer):
    """`ctx.chat` takes OpenAI-style dicts and puts `ChatMessage`s on the bus: keys that are no
    field of a message are dropped, the reply comes back as the dict it was, and a message that
    does not fit is a `ChatError` naming its field."""
    asked: list[ChatRequested] = []
    async with gateway_bus(toy_tokenizer, ["Fifty?\n" + CALL, "Done."]) as bus:
        bus.subscribe(ChatRequested, asked.append)
        ctx = await opened_context(bus)
        first = await ctx.chat([{**USER[0], "cache_control": {"type": "ephemeral"}}], ctx.openai_tools())
        [call] = first.tool_calls
        result = {"role": "tool", "tool_call_id": call["id"], "content": "higher"}
        await ctx.chat([*USER, first.message, result], ctx.openai_tools())
        with pytest.raises(
            ChatError, match=r"messages\.1\.content: Expected `str \| array \| null`, got `int`"
        ):
            await ctx.chat([*USER, {"role": "user", "content": 5}])
        with pytest.raises(ChatError, match=r"messages\.0: Object missing required field `role`"):
            await ctx.chat([{"content": "hi"}])
        await bus.drained()

    assert first.message == {"role": "assistant", "content": "Fifty?", "tool_calls": [call]}
    assert set(call) == {"id", "type", "function"}
    assert asked[0].messages == [ChatMessage("user", "Guess.")]  # no cache_control
    assert asked[1].messages[1:] == [
        ChatMessage("assistant", "Fifty?", tool_calls=[msgspec.convert(call, ChatToolCall)]),
        ChatMessage("tool", "higher", tool_call_id=call["id"]),
    ]
    assert len(asked) == 2  # a message that does not fit never reaches the bus


async def test_chat_errors_name_the_problem(toy_tokenizer):
    async with gateway_bus(toy_tokenizer, ["x"]) as bus:
        ctx = await opened_context(bus)
        with pytest.raises(ChatError, match="tool calls"):
            await ctx.chat([{"role": "user", "content": "hi", "tool_calls": [{}]}])
        stranger = context(bus, agent_id="ep1/nobody")
        with pytest.raises(ChatError, match="ep1/nobody is not open"):
            await stranger.chat(USER)


async def test_chat_times_out_when_nothing_answers():
    async with Bus() as bus:
        bus.subscribe(ChatRequested, lambda request: None)
        ctx = context(bus, request_timeout=0.05)
        with pytest.raises(RequestTimeout):
            await ctx.chat(USER)


async def test_call_tool_goes_over_the_bus():
    async with Bus() as bus:

        async def env(call: ToolCalled) -> None:
            number = call.arguments.get("number")
            await bus.publish(
                ToolReturned(
                    reply_to=call.request_id,
                    episode_id=call.episode_id,
                    agent_id=call.agent_id,
                    name=call.name,
                    output="correct" if number == 42 else "",
                    reward=1.0 if number == 42 else None,
                    finished=number == 42,
                    error=None if isinstance(number, int) else "number must be an integer",
                )
            )

        bus.subscribe(ToolCalled, env)
        ctx = context(bus)
        right = await ctx.call_tool("guess", {"number": 42})
        wrong = await ctx.call_tool("guess")

    assert right == ToolResult(name="guess", output="correct", reward=1.0, finished=True)
    assert right.as_text() == "correct"
    assert wrong.as_text() == "Error: number must be an integer"


async def test_tools_in_openai_form_and_spawn_without_a_program():
    async with Bus() as bus:
        ctx = context(bus)
        assert [t.name for t in await ctx.list_tools()] == ["guess"]
        assert ctx.openai_tools() == [
            {
                "type": "function",
                "function": {"name": "guess", "description": "Guess the number.", "parameters": SCHEMA},
            }
        ]
        result = await ctx.spawn("help me")
    assert result == AgentResult("error", reason="this episode's program does not spawn subagents")

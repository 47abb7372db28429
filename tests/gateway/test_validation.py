"""Validation as the real APIs do it, checked with the real `openai`, `anthropic` and `litellm`
clients: a bad request raises the exception class (status, error type and code) the client raises
for OpenAI or Anthropic; a reply's tool-call markup is read as those APIs would return it.
"""

# ruff: noqa: F811
from __future__ import annotations

import json
import os
from typing import Any

import anthropic
import openai
import pytest
from test_conformance import ANTHROPIC_TOOLS, MODEL, USER, clients
from test_gateway import GUESS_TOOLS, running_gateway, tool_call_text

from tokenizer_fixtures import toy_tokenizer  # noqa: F401

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of litellm's price list
import litellm

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

ORDER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "order",
            "description": "Order some items.",
            "parameters": {
                "type": "object",
                "properties": {"qty": {"type": "integer"}},
                "required": ["qty"],
            },
        },
    }
]
ORDER_ANTHROPIC = [
    {
        "name": "order",
        "description": "Order some items.",
        "input_schema": ORDER_TOOLS[0]["function"]["parameters"],
    }
]
LOTS = '<tool_call>\n{"name": "order", "arguments": {"qty": "lots"}}\n</tool_call>'


async def test_a_request_without_a_model_is_refused_as_each_api_refuses_it(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["x"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, claude):
            with pytest.raises(openai.BadRequestError) as completions:
                await chat.chat.completions.create(model=openai.omit, messages=USER)  # type: ignore[arg-type]
            with pytest.raises(openai.BadRequestError) as responses:
                await chat.responses.create(input="Guess.")
            with pytest.raises(anthropic.BadRequestError) as messages:
                await claude.messages.create(model=anthropic.omit, max_tokens=5, messages=USER)  # type: ignore[arg-type]
            with pytest.raises(anthropic.BadRequestError) as counted:
                await claude.messages.count_tokens(model=anthropic.omit, messages=USER)  # type: ignore[arg-type]
            assert await gw.settled() == []
    error = completions.value
    assert error.body == {
        "message": "you must provide a model parameter",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    assert (responses.value.param, responses.value.code) == ("model", "missing_required_parameter")
    for refused in (messages.value, counted.value):
        assert refused.body == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "model: Field required"},
        }


async def test_a_tool_message_without_its_call_id_is_refused(toy_tokenizer):
    call = {"id": "call_1", "type": "function", "function": {"name": "guess", "arguments": '{"number": 5}'}}
    history = [*USER, {"role": "assistant", "content": None, "tool_calls": [call]}]
    async with running_gateway(toy_tokenizer, ["x"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, claude):
            with pytest.raises(openai.BadRequestError) as completions:
                await chat.chat.completions.create(
                    model=MODEL,
                    messages=[*history, {"role": "tool", "content": "too low"}],
                    tools=GUESS_TOOLS,
                )
            with pytest.raises(litellm.BadRequestError):
                await litellm.acompletion(
                    model=f"openai/{MODEL}",
                    api_base=opened.base_url,
                    api_key=opened.key,
                    messages=[*history, {"role": "tool", "content": "too low"}],
                )
            use = {"type": "tool_use", "id": "toolu_1", "name": "guess", "input": {"number": 5}}
            with pytest.raises(anthropic.BadRequestError) as messages:
                await claude.messages.create(
                    model=MODEL,
                    max_tokens=5,
                    tools=ANTHROPIC_TOOLS,
                    messages=[
                        *USER,
                        {"role": "assistant", "content": [use]},
                        {"role": "user", "content": [{"type": "tool_result", "content": "too low"}]},
                    ],
                )
            assert await gw.settled() == []
    error = completions.value
    assert error.body["message"] == (
        "Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id'."
    )
    assert (error.param, error.code) == ("messages.2.tool_call_id", None)
    assert messages.value.body["error"]["type"] == "invalid_request_error"
    assert "tool_use_id" in messages.value.message


async def test_temperature_out_of_the_apis_range_is_refused(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["x"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, claude):
            with pytest.raises(openai.BadRequestError) as above:
                await chat.chat.completions.create(model=MODEL, messages=USER, temperature=2.5)
            with pytest.raises(openai.BadRequestError) as below:
                await chat.responses.create(model=MODEL, input="Guess.", temperature=-0.5)
            # Anthropic's range ends at 1, where OpenAI's goes on to 2.
            with pytest.raises(anthropic.BadRequestError) as messages:
                await claude.messages.create(
                    model=MODEL, max_tokens=5, messages=USER, extra_body={"temperature": 1.5}
                )
            within = await chat.chat.completions.create(model=MODEL, messages=USER, temperature=2)
            assert await gw.settled() != []
    assert (above.value.param, above.value.code) == ("temperature", "decimal_above_max_value")
    assert above.value.body["message"] == (
        "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 2.5 instead."
    )
    assert (below.value.param, below.value.code) == ("temperature", "decimal_below_min_value")
    assert messages.value.body["error"] == {
        "type": "invalid_request_error",
        "message": "temperature: Input should be less than or equal to 1",
    }
    assert within.choices[0].message.content == "x"


async def test_max_tokens_beyond_the_window_is_refused(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["x"], serve_http=True, context_window=64) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, claude):
            with pytest.raises(openai.BadRequestError) as completions:
                await chat.chat.completions.create(model=MODEL, messages=USER, max_completion_tokens=65)
            with pytest.raises(openai.BadRequestError) as responses:
                await chat.responses.create(model=MODEL, input="Guess.", max_output_tokens=100)
            with pytest.raises(anthropic.BadRequestError) as messages:
                await claude.messages.create(model=MODEL, max_tokens=1000, messages=USER)
            assert await gw.settled() == []
    assert completions.value.param == "max_completion_tokens"
    assert completions.value.body["message"] == (
        "max_completion_tokens is too large: 65. This model supports at most 64 completion tokens, "
        "whereas you provided 65."
    )
    assert responses.value.param == "max_output_tokens"
    assert messages.value.body["error"] == {
        "type": "invalid_request_error",
        "message": "max_tokens: 1000 > 64, which is the maximum allowed number of output tokens for "
        "platoon-policy",
    }


async def test_an_unknown_previous_response_id_is_previous_response_not_found(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["x"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, _):
            with pytest.raises(openai.BadRequestError) as error:
                await chat.responses.create(model=MODEL, input="Again.", previous_response_id="resp_nope")
    assert error.value.status_code == 400
    assert (error.value.code, error.value.param) == ("previous_response_not_found", "previous_response_id")
    assert error.value.body["message"].startswith("Previous response with id 'resp_nope' not found.")


async def test_tool_call_markup_without_tools_is_text(toy_tokenizer):
    text = tool_call_text(50, preamble="Maybe: ")
    async with running_gateway(toy_tokenizer, [text] * 3, serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, claude):
            completion = await chat.chat.completions.create(model=MODEL, messages=USER)
            stream = await chat.chat.completions.create(model=MODEL, messages=USER, stream=True)
            streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            message = await claude.messages.create(model=MODEL, max_tokens=100, messages=USER)
    choice = completion.choices[0]
    assert (choice.message.content, choice.message.tool_calls, choice.finish_reason) == (text, None, "stop")
    assert streamed == text
    assert [(b.type, b.text) for b in message.content] == [("text", text)]
    assert message.stop_reason == "end_turn"


async def test_a_call_to_an_undeclared_tool_is_returned_as_a_call(toy_tokenizer):
    """As the APIs return it: the agent answers it (as Claude Code and Codex answer a call to a
    tool they do not have) and the episode goes on."""
    peek = '<tool_call>\n{"name": "peek", "arguments": {}}\n</tool_call>'
    async with running_gateway(toy_tokenizer, [peek] * 3, serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, claude):
            completion = await chat.chat.completions.create(model=MODEL, messages=USER, tools=GUESS_TOOLS)
            response = await chat.responses.create(
                model=MODEL, input="Guess.", tools=[{"type": "function", **GUESS_TOOLS[0]["function"]}]
            )
            message = await claude.messages.create(
                model=MODEL, max_tokens=100, messages=USER, tools=ANTHROPIC_TOOLS
            )
            records = await gw.settled()
    [call] = completion.choices[0].message.tool_calls
    assert (call.function.name, call.function.arguments, completion.choices[0].finish_reason) == (
        "peek",
        "{}",
        "tool_calls",
    )
    assert [(o.type, getattr(o, "name", None)) for o in response.output] == [("function_call", "peek")]
    assert [(b.type, b.name) for b in message.content] == [("tool_use", "peek")]
    assert message.stop_reason == "tool_use"
    for record in records:
        assert record.parse_errors == ["tool call 1: unknown tool 'peek' (available: guess)"]


async def test_arguments_that_do_not_fit_the_schema_reach_the_agent_as_a_call(toy_tokenizer):
    async with running_gateway(toy_tokenizer, [LOTS] * 4, serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, claude):
            completion = await chat.chat.completions.create(model=MODEL, messages=USER, tools=ORDER_TOOLS)
            async with claude.messages.stream(
                model=MODEL, max_tokens=100, messages=USER, tools=ORDER_ANTHROPIC
            ) as stream:
                message = await stream.get_final_message()
            response: Any = await litellm.acompletion(
                model=f"openai/{MODEL}",
                api_base=opened.base_url,
                api_key=opened.key,
                messages=USER,
                tools=ORDER_TOOLS,
            )
            ctx = await gw.context("ep2")
            reply = await ctx.chat(USER, ORDER_TOOLS)
            records = await gw.settled()
    error = "tool call 1: argument 'qty' of 'order' must be integer, got string"
    [call] = completion.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"qty": "lots"}
    assert completion.choices[0].finish_reason == "tool_calls"
    assert [(b.type, b.input) for b in message.content] == [("tool_use", {"qty": "lots"})]
    assert json.loads(response.choices[0].message.tool_calls[0].function.arguments) == {"qty": "lots"}
    # In process the harness reads the error beside the call; over HTTP the call's record holds it.
    assert [json.loads(c["function"]["arguments"]) for c in reply.tool_calls] == [{"qty": "lots"}]
    assert reply.parse_errors == [error]
    assert [r.parse_errors for r in records] == [[error]] * 4

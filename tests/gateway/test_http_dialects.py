"""The OpenAI Responses and Anthropic Messages dialects, driven by the real `openai` and
`anthropic` clients (asyncio only), on the same records and token-exact history as chat."""

# ruff: noqa: F811
from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest
from test_gateway import GUESS_TOOLS, extends, running_gateway, sampled_tokens, tool_call_text

from platoon.bus.chat import ChatFunctionCall, ChatMessage, ChatPart, ChatToolCall
from tokenizer_fixtures import toy_tokenizer  # noqa: F401

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

RESPONSES_TOOLS = [{"type": "function", **tool["function"]} for tool in GUESS_TOOLS]
ANTHROPIC_TOOLS = [
    {
        "name": tool["function"]["name"],
        "description": tool["function"]["description"],
        "input_schema": tool["function"]["parameters"],
    }
    for tool in GUESS_TOOLS
]


def anthropic_client(opened: Any, **options: Any) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=opened.base_url.removesuffix("/v1"), max_retries=0, **options)


# --- OpenAI Responses -------------------------------------------------------------------------


async def test_responses_api_with_tool_calls_stream_and_not(toy_tokenizer, anyio_backend):
    script = [
        "<think>\nStart high.\n</think>\n\n" + tool_call_text(70, compact=True),
        "<think>\nLower.\n</think>\n\n" + tool_call_text(35, preamble="Going lower."),
        "<think>\nFound.\n</think>\n\nIt is 35.",
    ]
    async with running_gateway(toy_tokenizer, script, renderer="qwen3", serve_http=True) as gw:
        opened = await gw.open("ep1")
        items: list[Any] = [{"role": "user", "content": "Guess a number."}]
        async with openai.AsyncOpenAI(base_url=opened.base_url, api_key=opened.key, max_retries=0) as client:
            first = await client.responses.create(
                model="platoon-policy",
                instructions="You play a guessing game.",
                input=items,
                tools=RESPONSES_TOOLS,
            )
            assert [o.type for o in first.output] == ["reasoning", "function_call"]
            assert first.output[0].content[0].text == "Start high."
            call = first.output[1]
            assert (call.name, json.loads(call.arguments)) == ("guess", {"number": 70})
            items += [o.model_dump(exclude_none=True) for o in first.output]
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": "too high"})

            events = [
                e
                async for e in await client.responses.create(
                    model="platoon-policy",
                    instructions="You play a guessing game.",
                    input=items,
                    tools=RESPONSES_TOOLS,
                    stream=True,
                )
            ]
            second = events[-1].response
            assert events[-1].type == "response.completed"
            assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
            assert [o.type for o in second.output] == ["reasoning", "message", "function_call"]
            assert second.output_text == "Going lower."
            items += [o.model_dump(exclude_none=True) for o in second.output]
            items.append(
                {"type": "function_call_output", "call_id": second.output[2].call_id, "output": "yes"}
            )

            third = await client.responses.create(
                model="platoon-policy",
                instructions="You play a guessing game.",
                input=items,
                tools=RESPONSES_TOOLS,
            )
        records = await gw.settled()

    assert third.output_text == "It is 35." and third.status == "completed"
    assert third.usage.output_tokens == len(records[2].completion_tokens)
    assert [r.completion_tokens for r in records] == [sampled_tokens(toy_tokenizer, s) for s in script]
    assert extends(records[1], records[0]) and extends(records[2], records[1])


async def test_responses_api_string_input_and_max_output_tokens(toy_tokenizer, anyio_backend):
    async with running_gateway(toy_tokenizer, ["one two three four five six"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with openai.AsyncOpenAI(base_url=opened.base_url, api_key=opened.key, max_retries=0) as client:
            response = await client.responses.create(
                model="platoon-policy", input="Count.", max_output_tokens=2
            )
        [record] = await gw.settled()

    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert len(record.completion_tokens) == 2 and record.stop_reason == "length"
    assert record.prompt_tokens == gw.renderer.render([{"role": "user", "content": "Count."}])


# --- Anthropic Messages -----------------------------------------------------------------------


async def test_anthropic_messages_with_tool_use_stream_and_not(toy_tokenizer, anyio_backend):
    script = [
        tool_call_text(60, preamble="Let me guess."),
        tool_call_text(30, compact=True),
        "It is 30.",
    ]
    async with running_gateway(toy_tokenizer, script, serve_http=True) as gw:
        opened = await gw.open("ep1")
        messages: list[Any] = [{"role": "user", "content": "Guess a number."}]
        system = [{"type": "text", "text": "You play a guessing game."}]
        async with anthropic_client(opened, api_key=opened.key) as client:
            first = await client.messages.create(
                model="platoon-policy",
                max_tokens=200,
                system=system,
                messages=messages,
                tools=ANTHROPIC_TOOLS,
            )
            assert first.stop_reason == "tool_use"
            assert [b.type for b in first.content] == ["text", "tool_use"]
            assert first.content[0].text == "Let me guess."
            assert (first.content[1].name, first.content[1].input) == ("guess", {"number": 60})
            messages += [
                {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": first.content[1].id, "content": "too high"}
                    ],
                },
            ]

            async with client.messages.stream(
                model="platoon-policy",
                max_tokens=200,
                system=system,
                messages=messages,
                tools=ANTHROPIC_TOOLS,
            ) as stream:
                second = await stream.get_final_message()
            assert second.stop_reason == "tool_use"
            [use] = second.content
            assert (use.name, use.input) == ("guess", {"number": 30})
            messages += [
                {"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": use.id,
                            "content": [{"type": "text", "text": "yes"}],
                        }
                    ],
                },
            ]

            events = [
                e
                async for e in await client.messages.create(
                    model="platoon-policy",
                    max_tokens=200,
                    system=system,
                    messages=messages,
                    tools=ANTHROPIC_TOOLS,
                    stream=True,
                )
            ]
        records = await gw.settled()

    assert next(e.type for e in events) == "message_start" and events[-1].type == "message_stop"
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == "It is 30."
    assert next(e for e in events if e.type == "message_delta").delta.stop_reason == "end_turn"
    assert [r.completion_tokens for r in records] == [sampled_tokens(toy_tokenizer, s) for s in script]
    assert extends(records[1], records[0]) and extends(records[2], records[1])


async def test_anthropic_bearer_auth_max_tokens_and_count_tokens(toy_tokenizer, anyio_backend):
    async with running_gateway(toy_tokenizer, ["one two three four five"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        messages = [{"role": "user", "content": "Count."}]
        async with anthropic_client(opened, auth_token=opened.key) as client:
            reply = await client.messages.create(model="platoon-policy", max_tokens=3, messages=messages)
            counted = await client.messages.count_tokens(
                model="platoon-policy", messages=messages, tools=ANTHROPIC_TOOLS
            )
        [record] = await gw.settled()

    assert reply.stop_reason == "max_tokens"
    assert reply.usage.output_tokens == len(record.completion_tokens) == 3
    assert counted.input_tokens == len(gw.renderer.render(messages, GUESS_TOOLS))


async def test_a_call_over_http_records_its_messages_for_the_viewer(toy_tokenizer, anyio_backend):
    """An HTTP agent's call has no `ChatRequested`: its `ModelCallFinished` carries the messages,
    as the gateway read them, in every dialect. An in-process call's do not repeat there."""
    async with running_gateway(toy_tokenizer, ["One.", "Two.", "Three.", "Four."], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with openai.AsyncOpenAI(base_url=opened.base_url, api_key=opened.key, max_retries=0) as client:
            await client.chat.completions.create(
                model="platoon-policy", messages=[{"role": "user", "content": "chat"}]
            )
            await client.responses.create(model="platoon-policy", instructions="Be brief.", input="responses")
        async with anthropic_client(opened, api_key=opened.key) as claude:
            await claude.messages.create(
                model="platoon-policy", max_tokens=16, messages=[{"role": "user", "content": "messages"}]
            )
        ctx = await gw.context("ep2")
        await ctx.chat([{"role": "user", "content": "in process"}])
        records = await gw.settled()

    assert [r.messages for r in records] == [
        [ChatMessage("user", "chat")],
        [ChatMessage("system", "Be brief."), ChatMessage("user", "responses")],
        [ChatMessage("user", "messages")],
        None,
    ]


async def test_an_http_agents_growing_and_edited_history_is_recorded_as_sent(toy_tokenizer, anyio_backend):
    """An HTTP agent's record reads only what a call adds to its last call's messages (the
    memo); a message edited since is recorded as it is now."""
    first = [{"role": "user", "content": "Find it."}]
    second = [*first, {"role": "assistant", "content": "One."}, {"role": "user", "content": "More."}]
    third = [
        {"role": "user", "content": "Look again."},
        *second[1:],
        {"role": "assistant", "content": "Two."},
    ]
    third.append({"role": "user", "content": "Done?"})
    async with running_gateway(toy_tokenizer, ["One.", "Two.", "Three."], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with anthropic_client(opened, api_key=opened.key) as claude:
            for messages in (first, second, third):
                await claude.messages.create(model="platoon-policy", max_tokens=16, messages=messages)
        records = await gw.settled()

    assert [r.messages for r in records] == [
        [ChatMessage(m["role"], m["content"]) for m in sent] for sent in (first, second, third)
    ]


async def test_what_agents_add_to_a_request_is_taken(toy_tokenizer, anyio_backend):
    """Hints and options the real clients send on behalf of Codex- and Claude-Code-like agents
    (cache control, metadata, thinking, reasoning, included fields) do not stop a call."""
    cache = {"type": "ephemeral"}
    async with running_gateway(toy_tokenizer, ["One.", "Two."], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with openai.AsyncOpenAI(base_url=opened.base_url, api_key=opened.key, max_retries=0) as client:
            response = await client.responses.create(
                model="platoon-policy",
                input=[
                    {
                        "type": "message",
                        "role": "developer",
                        "content": [{"type": "input_text", "text": "Go."}],
                    }
                ],
                tools=[{**RESPONSES_TOOLS[0], "strict": False}],
                reasoning={"effort": "low", "summary": "auto"},
                include=["reasoning.encrypted_content"],
                store=False,
                prompt_cache_key="k",
                text={"verbosity": "low"},
                parallel_tool_calls=True,
            )
        async with anthropic_client(opened, api_key=opened.key) as claude:
            message = await claude.messages.create(
                model="platoon-policy",
                max_tokens=16,
                system=[{"type": "text", "text": "Be brief.", "cache_control": cache}],
                messages=[
                    {"role": "user", "content": [{"type": "text", "text": "Hi.", "cache_control": cache}]}
                ],
                tools=[{**ANTHROPIC_TOOLS[0], "cache_control": cache}],
                metadata={"user_id": "u1"},
                thinking={"type": "enabled", "budget_tokens": 1024},
            )
        records = await gw.settled()

    assert response.output_text == "One." and message.content[0].text == "Two."
    assert [r.messages for r in records] == [
        [ChatMessage("system", "Go.")],
        [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi.")],
    ]


async def test_a_chat_completion_records_the_messages_it_was_sent_read_once(toy_tokenizer, anyio_backend):
    """Chat completions' record carries the body's messages as they were checked, not read
    again: a developer message as the system one it renders as, keys outside a message's fields
    dropped, each of `n` choices with the same messages."""
    call = {"id": "c1", "type": "function", "function": {"name": "guess", "arguments": '{"number": 5}'}}
    sent = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Guess."}], "cache_control": {"type": "x"}},
        {"role": "assistant", "content": None, "tool_calls": [call], "refusal": None},
        {"role": "tool", "tool_call_id": "c1", "content": "higher"},
    ]
    async with running_gateway(toy_tokenizer, ["One.", "Two."], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with openai.AsyncOpenAI(base_url=opened.base_url, api_key=opened.key, max_retries=0) as client:
            await client.chat.completions.create(model="platoon-policy", messages=sent, n=2)
        records = await gw.settled()

    typed = ChatToolCall(id="c1", type="function", function=ChatFunctionCall("guess", '{"number": 5}'))
    expected = [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", [ChatPart("text", "Guess.")]),
        ChatMessage("assistant", None, [typed]),
        ChatMessage("tool", "higher", tool_call_id="c1"),
    ]
    assert [r.messages for r in records] == [expected, expected]

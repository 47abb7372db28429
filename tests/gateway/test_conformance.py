"""Dialect conformance: what the real `openai`, `anthropic` and `litellm` clients expect of an
OpenAI- or Anthropic-compatible server, checked against the gateway.

Streaming is checked on cue, not on the clock: the scripted sampler stops half-way through its
reply until the test has seen the first piece of text arrive, so a gateway that sent everything
at the end would never release it (and the test would fail at its deadline).
"""

# ruff: noqa: F811
from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anthropic
import anyio
import openai
import pytest
from test_gateway import GUESS_TOOLS, running_gateway, tool_call_text

from platoon.policy.tinker import TinkerSamplerFactory, closing
from platoon.testing.policies import ScriptedSamplerFactory
from tokenizer_fixtures import toy_tokenizer  # noqa: F401

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of litellm's price list
import litellm

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

MODEL = "platoon-policy"
RESPONSES_TOOLS = [{"type": "function", **tool["function"]} for tool in GUESS_TOOLS]
ANTHROPIC_TOOLS = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in GUESS_TOOLS
]
USER = [{"role": "user", "content": "Guess a number from 1 to 100."}]
REPLY = "I think the number is probably somewhere near the middle of the range, so fifty."


class Held:
    """A pace for the scripted sampler: it stops before token `at` until `release` is set."""

    def __init__(self, at: int = 6) -> None:
        self.at = at
        self.release = anyio.Event()
        self.held = anyio.Event()

    async def __call__(self, index: int) -> None:
        if index == self.at:
            self.held.set()
            await self.release.wait()


@asynccontextmanager
async def clients(opened: Any) -> AsyncIterator[tuple[openai.AsyncOpenAI, anthropic.AsyncAnthropic]]:
    """Both clients, closed at the end (an unclosed one is closed by the collector later, in
    another test's event loop). litellm's cached clients are dropped for the same reason."""
    chat = openai.AsyncOpenAI(base_url=opened.base_url, api_key=opened.key, max_retries=0)
    base = opened.base_url.removesuffix("/v1")
    claude = anthropic.AsyncAnthropic(base_url=base, api_key=opened.key, max_retries=0)
    async with chat, claude:
        try:
            yield chat, claude
        finally:
            litellm.in_memory_llm_clients_cache.flush_cache()


# --- streaming ---------------------------------------------------------------------------------


async def first_text_then_release(stream: Any, text_of: Any, held: Held) -> list[str]:
    """Read `stream`; on its first piece of text, let the sampler go on. The pieces of text."""
    pieces: list[str] = []
    with anyio.fail_after(30):  # only reached if nothing streams before the reply is done
        async for event in stream:
            text = text_of(event)
            if text:
                if not pieces:
                    assert held.held.is_set() and not held.release.is_set()
                    held.release.set()
                pieces.append(text)
    return pieces


async def test_chat_completions_stream_as_sampled(toy_tokenizer):
    held = Held()
    factory = ScriptedSamplerFactory(toy_tokenizer, [REPLY], pace=held)
    async with running_gateway(toy_tokenizer, factory=factory, serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, _):
            stream = await chat.chat.completions.create(model=MODEL, messages=USER, stream=True)
            pieces = await first_text_then_release(
                stream, lambda c: c.choices[0].delta.content if c.choices else None, held
            )
    assert "".join(pieces) == REPLY and len(pieces) > 1


async def test_responses_stream_as_sampled(toy_tokenizer):
    held = Held()
    factory = ScriptedSamplerFactory(toy_tokenizer, [REPLY], pace=held)
    async with running_gateway(toy_tokenizer, factory=factory, serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, _):
            events: list[Any] = []

            def text_of(event: Any) -> str | None:
                events.append(event)
                return event.delta if event.type == "response.output_text.delta" else None

            stream = await chat.responses.create(model=MODEL, input="Guess.", stream=True)
            pieces = await first_text_then_release(stream, text_of, held)
    assert "".join(pieces) == REPLY and len(pieces) > 1
    assert events[-1].type == "response.completed" and events[-1].response.output_text == REPLY


async def test_messages_stream_as_sampled(toy_tokenizer):
    held = Held()
    factory = ScriptedSamplerFactory(toy_tokenizer, [REPLY], pace=held)
    async with running_gateway(toy_tokenizer, factory=factory, serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (_, claude):
            async with claude.messages.stream(model=MODEL, max_tokens=200, messages=USER) as stream:
                pieces = await first_text_then_release(
                    stream, lambda e: e.delta.text if e.type == "content_block_delta" else None, held
                )
                final = await stream.get_final_message()
    assert "".join(pieces) == REPLY and len(pieces) > 1
    assert final.content[0].text == REPLY and final.stop_reason == "end_turn"
    assert final.usage.input_tokens > 0


async def test_litellm_streams_as_sampled(toy_tokenizer):
    held = Held()
    factory = ScriptedSamplerFactory(toy_tokenizer, [REPLY], pace=held)
    async with running_gateway(toy_tokenizer, factory=factory, serve_http=True) as gw:
        opened = await gw.open("ep1")
        stream = await litellm.acompletion(
            model=f"openai/{MODEL}", api_base=opened.base_url, api_key=opened.key, messages=USER, stream=True
        )
        pieces = await first_text_then_release(stream, lambda c: c.choices[0].delta.content, held)
    assert "".join(pieces) == REPLY and len(pieces) > 1


async def test_a_tool_call_is_never_streamed_as_text(toy_tokenizer):
    script = [tool_call_text(50, preamble="Trying the middle.")]
    async with running_gateway(toy_tokenizer, script, serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, _):
            stream = await chat.chat.completions.create(
                model=MODEL, messages=USER, tools=GUESS_TOOLS, stream=True
            )
            chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert text == "Trying the middle." and "<tool_call>" not in text
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("guess", {"number": 50})]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


# --- stop sequences ----------------------------------------------------------------------------

STOPPED = "The answer is 42. END and then some text the client never asked for."


async def test_a_stop_sequence_ends_the_reply_in_each_dialect(toy_tokenizer):
    async with running_gateway(toy_tokenizer, [STOPPED] * 4, serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, claude):
            completion = await chat.chat.completions.create(model=MODEL, messages=USER, stop=["END"])
            stream = await chat.chat.completions.create(model=MODEL, messages=USER, stop="END", stream=True)
            chunks = [c async for c in stream]
            message = await claude.messages.create(
                model=MODEL, max_tokens=100, messages=USER, stop_sequences=["END"]
            )
            async with claude.messages.stream(
                model=MODEL, max_tokens=100, messages=USER, stop_sequences=["END"]
            ) as messages_stream:
                streamed = await messages_stream.get_final_message()
            records = await gw.settled()

    assert completion.choices[0].message.content == "The answer is 42."
    assert completion.choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "The answer is 42."
    assert chunks[-1].choices[0].finish_reason == "stop"
    for reply in (message, streamed):
        assert reply.content[0].text == "The answer is 42."
        assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", "END")
    # What trains is what was sampled up to the stop: nothing after it.
    for record in records:
        text = toy_tokenizer.decode(record.completion_tokens)
        assert text.endswith("END") and "then some" not in text


# --- tool choice -------------------------------------------------------------------------------


async def test_tool_choice_none_reads_no_calls(toy_tokenizer):
    async with running_gateway(toy_tokenizer, [tool_call_text(50)], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, _):
            completion = await chat.chat.completions.create(
                model=MODEL, messages=USER, tools=GUESS_TOOLS, tool_choice="none"
            )
    choice = completion.choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "stop"
    assert "<tool_call>" in choice.message.content


async def test_tool_choice_required_and_named_are_enforced(toy_tokenizer):
    """The reply starts as a tool call (the gateway writes its opening, the model the rest), so
    a model that would have answered in prose still calls a tool."""
    script = [
        '{"name": "guess", "arguments": {"number": 10}}\n</tool_call>',  # after "<tool_call>\n"
        '{"number": 20}}\n</tool_call>',  # after '<tool_call>\n{"name": "guess", "arguments": '
        '{"name": "guess", "arguments": {"number": 30}}\n</tool_call>',
        '{"number": 40}}\n</tool_call>',
    ]
    async with running_gateway(toy_tokenizer, script, serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, claude):
            required = await chat.chat.completions.create(
                model=MODEL, messages=USER, tools=GUESS_TOOLS, tool_choice="required"
            )
            named = await chat.chat.completions.create(
                model=MODEL,
                messages=USER,
                tools=GUESS_TOOLS,
                tool_choice={"type": "function", "function": {"name": "guess"}},
            )
            any_tool = await claude.messages.create(
                model=MODEL, max_tokens=100, messages=USER, tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"}
            )
            one_tool = await claude.messages.create(
                model=MODEL,
                max_tokens=100,
                messages=USER,
                tools=ANTHROPIC_TOOLS,
                tool_choice={"type": "tool", "name": "guess"},
            )
            with pytest.raises(openai.BadRequestError) as error:
                await chat.chat.completions.create(
                    model=MODEL,
                    messages=USER,
                    tools=GUESS_TOOLS,
                    tool_choice={"type": "function", "function": {"name": "no_such_tool"}},
                )
            records = await gw.settled()

    for completion, number in ((required, 10), (named, 20)):
        [call] = completion.choices[0].message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("guess", {"number": number})
        assert completion.choices[0].finish_reason == "tool_calls"
    for message, number in ((any_tool, 30), (one_tool, 40)):
        [block] = message.content
        assert (block.type, block.name, block.input, message.stop_reason) == (
            "tool_use",
            "guess",
            {"number": number},
            "tool_use",
        )
    assert error.value.body["param"] == "tool_choice"
    # The opening the gateway wrote is the end of the prompt, not sampled tokens.
    opening = toy_tokenizer.encode('<tool_call>\n{"name": "guess", "arguments": ', add_special_tokens=False)
    assert records[1].prompt_tokens[-len(opening) :] == opening


async def test_a_scripted_policy_sees_the_forced_opening_and_may_write_the_whole_call(toy_tokenizer):
    openings: list[str] = []

    def policy(messages: list[dict[str, Any]]) -> str:
        last = messages[-1]
        assert (last["role"], last["prefix"]) == ("assistant", True)
        openings.append(last["content"])
        return tool_call_text(len(openings))  # the whole call, opening included

    async with running_gateway(toy_tokenizer, policy, serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, claude):
            required = await chat.chat.completions.create(
                model=MODEL, messages=USER, tools=GUESS_TOOLS, tool_choice="required"
            )
            one_tool = await claude.messages.create(
                model=MODEL,
                max_tokens=100,
                messages=USER,
                tools=ANTHROPIC_TOOLS,
                tool_choice={"type": "tool", "name": "guess"},
            )
    [call] = required.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"number": 1}
    assert [(b.type, b.input) for b in one_tool.content] == [("tool_use", {"number": 2})]
    assert openings == ["<tool_call>\n", '<tool_call>\n{"name": "guess", "arguments": ']


async def test_a_forced_call_that_does_not_parse_is_sampled_again_then_refused(toy_tokenizer):
    """Never the forced markup returned as text: a reply that does not continue the opening into a
    call is sampled again (up to three samples); only the sample that called is recorded."""
    script = ["I would rather explain.", tool_call_text(10)] + ["Still no call."] * 6
    async with running_gateway(toy_tokenizer, script, serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, claude):
            second = await chat.chat.completions.create(
                model=MODEL, messages=USER, tools=GUESS_TOOLS, tool_choice="required", seed=7
            )
            with pytest.raises(openai.InternalServerError) as chat_error:
                await chat.chat.completions.create(
                    model=MODEL, messages=USER, tools=GUESS_TOOLS, tool_choice="required"
                )
            with pytest.raises(anthropic.InternalServerError) as claude_error:
                await claude.messages.create(
                    model=MODEL,
                    max_tokens=100,
                    messages=USER,
                    tools=ANTHROPIC_TOOLS,
                    tool_choice={"type": "any"},
                )
            [record] = await gw.settled()
    [call] = second.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"number": 10}
    assert toy_tokenizer.decode(record.completion_tokens).startswith('{"name": "guess"')
    assert chat_error.value.status_code == 502
    assert chat_error.value.body["message"].startswith(
        "tool_choice asks for a tool call, and the policy wrote none in 3 samples (last: tool call 1: "
    )
    assert claude_error.value.body["error"]["type"] == "api_error"
    assert gw.gateway.budgets["ep1"].calls == 1  # a refused call costs nothing


async def test_parallel_tool_calls_false_keeps_one_call(toy_tokenizer):
    two = tool_call_text(10) + "\n" + tool_call_text(20)
    async with running_gateway(toy_tokenizer, [two, two], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, claude):
            completion = await chat.chat.completions.create(
                model=MODEL, messages=USER, tools=GUESS_TOOLS, parallel_tool_calls=False
            )
            message = await claude.messages.create(
                model=MODEL,
                max_tokens=200,
                messages=USER,
                tools=ANTHROPIC_TOOLS,
                tool_choice={"type": "auto", "disable_parallel_tool_use": True},
            )
            records = await gw.settled()
    [call] = completion.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"number": 10}
    assert [b.input for b in message.content if b.type == "tool_use"] == [{"number": 10}]
    for record in records:
        assert toy_tokenizer.decode(record.completion_tokens).count("<tool_call>") == 1


# --- what cannot be honoured -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "a", "strict": True, "schema": {"anyOf": []}},
                }
            },
            "response_format",
        ),
        ({"logprobs": True, "top_logprobs": 3}, "top_logprobs"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"logit_bias": {"42": 10}}, "logit_bias"),
    ],
)
async def test_what_cannot_be_honoured_is_a_400_naming_it(toy_tokenizer, extra, param):
    async with running_gateway(toy_tokenizer, ["x"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, _):
            with pytest.raises(openai.BadRequestError) as error:
                await chat.chat.completions.create(model=MODEL, messages=USER, **extra)
            assert await gw.settled() == []
    assert error.value.body["param"] == param and param in error.value.message


async def test_logprobs_come_back_when_asked(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["Fifty."], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, _):
            completion = await chat.chat.completions.create(
                model=MODEL, messages=USER, logprobs=True, top_logprobs=0
            )
            [record] = await gw.settled()
    assert [t.logprob for t in completion.choices[0].logprobs.content] == record.logprobs


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("tinker")
    from platoon.testing.models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden_size=64, num_layers=2, seed=0)


@pytest.mark.torch
async def test_top_logprobs_come_from_a_sampler_that_gives_them(toy_tokenizer, tiny_model):
    """The embedded sampler gives the top alternatives at each sampled token: the client gets
    them, and they are the model's own (checked against transformers)."""
    import tinker
    import torch
    from transformers import AutoModelForCausalLM

    from platoon.backends.local import running_server_in_thread

    async with running_server_in_thread(str(tiny_model), device="cpu") as url:
        async with closing(tinker.ServiceClient(base_url=url, api_key="tml-local")) as service:
            factory = TinkerSamplerFactory(service, base_model=str(tiny_model))
            async with running_gateway(toy_tokenizer, factory=factory, serve_http=True) as gw:
                opened = await gw.open("ep1")
                async with clients(opened) as (chat, _):
                    completion = await chat.chat.completions.create(
                        model=MODEL, messages=USER, logprobs=True, top_logprobs=3, max_tokens=6, seed=1
                    )
                    [record] = await gw.settled()
    content = completion.choices[0].logprobs.content
    assert [t.logprob for t in content] == record.logprobs and len(content) == 6
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    tokens = [*record.prompt_tokens, *record.completion_tokens]
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0, len(record.prompt_tokens) - 1 : -1]
    best = torch.log_softmax(logits.float(), dim=-1).topk(3)
    for token, values, ids in zip(content, best.values.tolist(), best.indices.tolist(), strict=True):
        assert [a.token for a in token.top_logprobs] == [toy_tokenizer.decode([i]) for i in ids]
        assert [a.logprob for a in token.top_logprobs] == pytest.approx(values, abs=1e-4)


async def test_a_prompt_over_the_context_is_a_400_at_once(toy_tokenizer):
    long = [{"role": "user", "content": "word " * 400}]
    async with running_gateway(toy_tokenizer, ["x"], serve_http=True, context_window=64) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, claude):
            with pytest.raises(openai.BadRequestError) as error:
                await chat.chat.completions.create(model=MODEL, messages=long)
            assert error.value.code == "context_length_exceeded"
            with pytest.raises(anthropic.BadRequestError) as refused:
                await claude.messages.create(model=MODEL, max_tokens=10, messages=long)
            assert "prompt is too long" in refused.value.message
            # litellm reads it as its context window error: agents built on it stop instead of retrying.
            with pytest.raises(litellm.ContextWindowExceededError):
                await litellm.acompletion(
                    model=f"openai/{MODEL}",
                    api_base=opened.base_url,
                    api_key=opened.key,
                    messages=long,
                    num_retries=3,
                )
            assert await gw.settled() == []


# --- models ------------------------------------------------------------------------------------


async def test_models_and_unknown_model_names(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["x"], serve_http=True, model_aliases=["gpt-5"]) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, claude):
            assert (await chat.models.retrieve(MODEL)).id == MODEL
            assert (await chat.models.retrieve("gpt-5")).id == "gpt-5"  # an alias the config gives
            assert sorted(m.id for m in (await chat.models.list()).data) == ["gpt-5", MODEL]
            with pytest.raises(openai.NotFoundError):
                await chat.models.retrieve("gpt-4o")
            with pytest.raises(openai.NotFoundError) as error:
                await chat.chat.completions.create(model="gpt-4o", messages=USER)
            assert error.value.code == "model_not_found"
            with pytest.raises(anthropic.NotFoundError):
                await claude.messages.create(model="claude-opus", max_tokens=10, messages=USER)
            assert await gw.settled() == []


# --- stateful Responses --------------------------------------------------------------------------


async def test_previous_response_id_continues_a_stored_conversation(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["Fifty?", "Seventy-five?", "x"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with clients(opened) as (chat, _):
            first = await chat.responses.create(model=MODEL, instructions="Play.", input="Guess.")
            second = await chat.responses.create(
                model=MODEL, instructions="Play.", input="Higher.", previous_response_id=first.id
            )
            unstored = await chat.responses.create(model=MODEL, input="Guess.", store=False)
            with pytest.raises(openai.BadRequestError) as error:
                await chat.responses.create(model=MODEL, input="Again.", previous_response_id=unstored.id)
            one, two, _ = await gw.settled()
    assert second.output_text == "Seventy-five?"
    assert error.value.code == "previous_response_not_found"
    assert error.value.param == "previous_response_id"
    # The second call's prompt holds the first call's, and its reply as the exact sampled tokens.
    assert two.prompt_tokens[: len(one.prompt_tokens) + len(one.completion_tokens)] == [
        *one.prompt_tokens,
        *one.completion_tokens,
    ]


# --- streaming from the embedded sampler ---------------------------------------------------------


async def streamed_text(dialect: str, chat: openai.AsyncOpenAI, claude: anthropic.AsyncAnthropic, gw: Any):
    """The content deltas of a streamed reply, and whether the first came before the call's
    record (which the gateway publishes once the sampler is done)."""
    pieces: list[str] = []
    first_before_record = False

    def take(text: str | None) -> None:
        nonlocal first_before_record
        if text:
            if not pieces:
                first_before_record = not gw.records
            pieces.append(text)

    if dialect == "chat":
        stream = await chat.chat.completions.create(model=MODEL, messages=USER, max_tokens=64, stream=True)
        async for chunk in stream:
            take(chunk.choices[0].delta.content if chunk.choices else None)
    elif dialect == "responses":
        events = await chat.responses.create(model=MODEL, input="Guess.", max_output_tokens=64, stream=True)
        async for event in events:
            take(event.delta if event.type == "response.output_text.delta" else None)
    else:
        async with claude.messages.stream(model=MODEL, max_tokens=64, messages=USER) as messages:
            async for event in messages:
                take(event.delta.text if event.type == "content_block_delta" else None)
    return pieces, first_before_record


async def whole_text(dialect: str, chat: openai.AsyncOpenAI, claude: anthropic.AsyncAnthropic) -> str:
    if dialect == "chat":
        completion = await chat.chat.completions.create(model=MODEL, messages=USER, max_tokens=64)
        return completion.choices[0].message.content or ""
    if dialect == "responses":
        return (await chat.responses.create(model=MODEL, input="Guess.", max_output_tokens=64)).output_text
    message = await claude.messages.create(model=MODEL, max_tokens=64, messages=USER)
    return "".join(block.text for block in message.content if block.type == "text")


@pytest.mark.torch
@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
async def test_the_embedded_sampler_streams_as_it_samples(toy_tokenizer, tiny_model, dialect):
    """Each dialect's content arrives in pieces, the first before sampling is done, and the
    call's record is the one a call not streamed (same seed) gets."""
    import tinker

    from platoon.backends.local import running_server_in_thread

    async with (
        running_server_in_thread(str(tiny_model), device="cpu") as url,
        closing(tinker.ServiceClient(base_url=url, api_key="tml-local")) as service,
        running_gateway(
            toy_tokenizer, factory=TinkerSamplerFactory(service, base_model=str(tiny_model)), serve_http=True
        ) as gw,
    ):
        streamed, whole = await gw.open("streamed", seed=11), await gw.open("whole", seed=11)
        async with clients(streamed) as (chat, claude):
            pieces, first_before_record = await streamed_text(dialect, chat, claude, gw)
        async with clients(whole) as (chat, claude):
            text = await whole_text(dialect, chat, claude)
        await gw.settled()
    assert len(pieces) > 1 and first_before_record
    assert "".join(pieces) == text
    [one], [other] = gw.of("streamed"), gw.of("whole")
    assert one.completion_tokens == other.completion_tokens and one.logprobs == other.logprobs
    assert one.stop_reason == other.stop_reason and one.prompt_tokens == other.prompt_tokens

"""Constraints honoured or refused, never pretended: `tool_choice` and JSON output formats with
the real `openai` and `anthropic` clients. On the embedded sampler a random-init model is decoded
to the constraint, so its reply is a declared call or valid JSON every time; a scripted sampler's
reply is checked and sampled again, then refused in each API's error shape.
"""

# ruff: noqa: F811
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import structlog
import structlog.testing
from test_conformance import MODEL, USER, clients, tiny_model  # noqa: F401
from test_gateway import GUESS_TOOLS, running_gateway

from platoon.policy.constraints import schema_error
from platoon.policy.tinker import TinkerSamplerFactory, closing
from tokenizer_fixtures import toy_tokenizer  # noqa: F401

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

SAY = {
    "type": "function",
    "function": {
        "name": "say",
        "description": "Say something.",
        "parameters": {
            "type": "object",
            "properties": {"text": {"type": "string"}, "loud": {"type": "boolean"}},
            "required": ["text", "loud"],
        },
    },
}
TOOLS = [*GUESS_TOOLS, SAY]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ANSWER = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "population": {"type": "integer"},
        "kind": {"enum": ["town", "city"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "capital": {"type": ["boolean", "null"]},
    },
    "required": ["city", "population", "kind"],
    "additionalProperties": False,
}


@asynccontextmanager
async def embedded_gateway(model: Path, tokenizer: Any, **options: Any) -> AsyncIterator[Any]:
    """A gateway sampling the tiny model on the embedded server (`options` go to the server)."""
    import tinker

    from platoon.backends.local import running_server_in_thread

    async with (
        running_server_in_thread(str(model), device="cpu", **options) as url,
        closing(tinker.ServiceClient(base_url=url, api_key="tml-local")) as service,
        running_gateway(
            tokenizer, factory=TinkerSamplerFactory(service, base_model=str(model)), serve_http=True
        ) as gw,
    ):
        yield gw


def checked_call(message: Any) -> tuple[str, dict[str, object]]:
    [call] = message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert schema_error(arguments, SCHEMAS[call.function.name]) is None, call.function.arguments
    return call.function.name, arguments


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("reproducible", [False, True])
async def test_a_random_model_calls_a_declared_tool_whenever_it_must(toy_tokenizer, tiny_model, reproducible):
    """Under `tool_choice` required, a named tool and Anthropic's `any`, every reply of the
    random-init model is one call of a declared tool with arguments of its schema, streamed or
    not, batched or reproducible; what the client got is what was recorded for training."""
    async with embedded_gateway(tiny_model, toy_tokenizer, batch_invariant=reproducible) as gw:
        replies = []
        for seed in range(4):
            async with clients(await gw.open(f"ep{seed}", seed=seed)) as (chat, _):
                replies.append(
                    await chat.chat.completions.create(
                        model=MODEL,
                        messages=USER,
                        tools=TOOLS,
                        tool_choice="required",
                        max_tokens=96,
                        logprobs=True,
                    )
                )
        async with clients(await gw.open("named", seed=9)) as (chat, claude):
            named = await claude.messages.create(
                model=MODEL,
                max_tokens=96,
                messages=USER,
                tools=[{"name": "say", "input_schema": SAY["function"]["parameters"]}],
                tool_choice={"type": "tool", "name": "say"},
            )
            chunks = await chat.chat.completions.create(
                model=MODEL, messages=USER, tools=TOOLS, tool_choice="required", max_tokens=96, stream=True
            )
            streamed = [
                c.choices[0].delta.tool_calls
                async for c in chunks
                if c.choices and c.choices[0].delta.tool_calls
            ]
        records = await gw.settled()
    names = [checked_call(r.choices[0].message)[0] for r in replies]
    assert set(names) <= {"guess", "say"}
    assert [(b.type, b.name) for b in named.content] == [("tool_use", "say")]
    assert schema_error(named.content[0].input, SCHEMAS["say"]) is None
    [[call]] = streamed
    assert schema_error(json.loads(call.function.arguments), SCHEMAS[call.function.name]) is None
    for reply, record in zip(replies, records, strict=False):
        content = reply.choices[0].logprobs.content
        assert [t.logprob for t in content] == record.logprobs
        assert "".join(t.token for t in content) == toy_tokenizer.decode(record.completion_tokens)
        assert reply.choices[0].finish_reason == "tool_calls"


@pytest.mark.torch
@pytest.mark.slow
async def test_a_tool_no_forced_call_can_reach_within_max_tokens_is_said_once(toy_tokenizer, tiny_model):
    """The sampler starts a call only where it can end within max_tokens, counting a character a
    token: with room for `guess` and not for a long-named tool, it draws `guess` every time, and
    the run hears once why the other is never drawn (the model's preference is not the cause)."""
    far = {
        "type": "function",
        "function": {
            "name": "delegate_this_whole_question_to_a_subagent",
            "parameters": {
                "type": "object",
                "properties": {"instruction": {"type": "string"}},
                "required": ["instruction"],
            },
        },
    }
    with structlog.testing.capture_logs() as logs:
        async with embedded_gateway(tiny_model, toy_tokenizer) as gw:
            names = []
            for seed in range(3):
                async with clients(await gw.open(f"ep{seed}", seed=seed)) as (chat, _):
                    reply = await chat.chat.completions.create(
                        model=MODEL,
                        messages=USER,
                        tools=[*GUESS_TOOLS, far],
                        tool_choice="required",
                        max_tokens=64,
                    )
                names += [call.function.name for call in reply.choices[0].message.tool_calls]
    assert names == ["guess"] * 3
    [said] = [entry["event"] for entry in logs if "never calls" in entry["event"]]
    head, _, rest = said.partition(" characters, ")
    shortest = len('{"name": "delegate_this_whole_question_to_a_subagent", "arguments": {"instruction": ""}}')
    assert head.startswith(
        "a forced tool call of at most 64 tokens never calls delegate_this_whole_question_to_a_subagent: "
        "its shortest call takes "
    )
    assert shortest <= int(head.rsplit(" ", 1)[1]) <= shortest + len("\n</tool_call>")
    assert rest.startswith("and the sampler starts a call only where the call can end")


@pytest.mark.torch
@pytest.mark.slow
async def test_json_output_formats_parse_and_fit_their_schema(toy_tokenizer, tiny_model):
    """Each dialect's JSON output format, decoded on the embedded sampler: the reply parses and
    fits the schema; the logprobs recorded are the model's own, unconstrained (what the trainer
    computes again), and Responses serves the top alternatives with them."""
    import torch
    from transformers import AutoModelForCausalLM

    schema_format = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": ANSWER, "strict": True},
    }
    async with embedded_gateway(tiny_model, toy_tokenizer) as gw:
        async with clients(await gw.open("ep1", seed=3)) as (chat, claude):
            chat_reply = await chat.chat.completions.create(
                model=MODEL, messages=USER, response_format=schema_format, max_tokens=60
            )
            any_object = await chat.chat.completions.create(
                model=MODEL, messages=USER, response_format={"type": "json_object"}, max_tokens=30
            )
            response = await chat.responses.create(
                model=MODEL,
                input="Name a city.",
                max_output_tokens=60,
                text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER}},
                include=["message.output_text.logprobs"],
                top_logprobs=2,
            )
            message = await claude.messages.create(
                model=MODEL,
                max_tokens=60,
                messages=USER,
                output_config={"format": {"type": "json_schema", "schema": ANSWER}},
            )
        records = await gw.settled()
    for text in (chat_reply.choices[0].message.content, response.output_text, message.content[0].text):
        assert schema_error(json.loads(text), ANSWER) is None, text
    assert isinstance(json.loads(any_object.choices[0].message.content), dict)
    logprobs = response.output[0].content[0].logprobs
    assert [t.logprob for t in logprobs] == records[2].logprobs
    assert all(len(t.top_logprobs) == 2 for t in logprobs)
    record = records[0]
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    tokens = [*record.prompt_tokens, *record.completion_tokens]
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0, len(record.prompt_tokens) - 1 : -1]
    raw = torch.log_softmax(logits.float(), dim=-1).gather(
        -1, torch.tensor(record.completion_tokens)[:, None]
    )
    assert record.logprobs == pytest.approx(raw[:, 0].tolist(), abs=1e-4)


async def test_json_that_never_comes_is_sampled_again_then_refused(toy_tokenizer):
    """A sampler that cannot constrain: a reply that is not the JSON asked for is sampled again
    (up to `constraint_tries`), then refused in each API's error shape, at no cost to the budget."""
    script = ["Paris, I think.", '{"city": "Paris", "population": 2, "kind": "city"}'] + ["Not JSON."] * 4
    async with running_gateway(toy_tokenizer, script, serve_http=True, constraint_tries=2) as gw:
        async with clients(await gw.open("ep1")) as (chat, claude):
            second = await chat.chat.completions.create(
                model=MODEL,
                messages=USER,
                response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": ANSWER}},
            )
            with pytest.raises(openai.InternalServerError) as chat_error:
                await chat.chat.completions.create(
                    model=MODEL, messages=USER, response_format={"type": "json_object"}
                )
            with pytest.raises(anthropic.InternalServerError) as claude_error:
                await claude.messages.create(
                    model=MODEL,
                    max_tokens=50,
                    messages=USER,
                    output_config={"format": {"type": "json_schema", "schema": ANSWER}},
                )
            [record] = await gw.settled()
    assert json.loads(second.choices[0].message.content)["city"] == "Paris"
    assert toy_tokenizer.decode(record.completion_tokens).startswith('{"city"')
    assert chat_error.value.status_code == 502
    assert chat_error.value.body["message"].startswith(
        "the output format asks for a JSON object, and the policy wrote none in 2 samples (last: the reply is not JSON"
    )
    assert claude_error.value.body["error"]["type"] == "api_error"
    assert "JSON of its schema" in claude_error.value.body["error"]["message"]
    assert gw.gateway.budgets["ep1"].calls == 1


async def test_top_logprobs_are_refused_where_they_cannot_be_served(toy_tokenizer):
    """Responses serves logprobs (the scripted sampler has no alternatives: asking for them is a
    400 naming top_logprobs); Anthropic Messages has no such parameter, and says where to ask."""
    async with running_gateway(toy_tokenizer, ["Fifty.", "x"], serve_http=True) as gw:
        async with clients(await gw.open("ep1")) as (chat, claude):
            response = await chat.responses.create(
                model=MODEL, input="Guess.", include=["message.output_text.logprobs"], top_logprobs=0
            )
            with pytest.raises(openai.BadRequestError) as responses_error:
                await chat.responses.create(
                    model=MODEL, input="Guess.", include=["message.output_text.logprobs"], top_logprobs=2
                )
            with pytest.raises(anthropic.BadRequestError) as claude_error:
                await claude.messages.create(
                    model=MODEL, max_tokens=10, messages=USER, extra_body={"top_logprobs": 2}
                )
            [record] = await gw.settled()
    assert [t.logprob for t in response.output[0].content[0].logprobs] == record.logprobs
    assert responses_error.value.body["param"] == "top_logprobs"
    assert "/v1/responses" in claude_error.value.body["error"]["message"]

"""Bad requests over HTTP get the right status and a message naming what is wrong, in each
dialect: 400 (field named), 401 (bad or revoked key), 404, 405, 429 (saturated), the
dialects' context-length errors, budget exhaustion and call kinds."""

# ruff: noqa: F811
from __future__ import annotations

from typing import Any

import anthropic
import anyio
import httpx
import openai
import pytest
from test_gateway import BlockingSampler, Factory, running_gateway

from platoon.gateway.renderers import get_renderer
from tokenizer_fixtures import toy_tokenizer  # noqa: F401

asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])
USER = [{"role": "user", "content": "Hi."}]
MODEL = "platoon-policy"


def client_for(opened: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=opened.base_url, headers={"authorization": f"Bearer {opened.key}"})


def openai_client(opened: Any, key: str | None = None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=opened.base_url, api_key=key or opened.key, max_retries=0)


def anthropic_client(opened: Any, key: str | None = None) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=opened.base_url.removesuffix("/v1"), api_key=key or opened.key, max_retries=0
    )


# --- 400: the field is named ------------------------------------------------------------------

BAD_BODIES = [
    ("/chat/completions", {"model": "platoon-policy"}, "messages"),
    ("/chat/completions", {"messages": USER, "temperature": "hot"}, "temperature"),
    ("/chat/completions", {"model": MODEL, "messages": USER, "max_tokens": 0}, "max_tokens"),
    ("/chat/completions", {"model": MODEL, "messages": USER, "max_completion_tokens": 0}, "max_tokens"),
    ("/chat/completions", {"messages": USER, "n": 99}, "n"),
    ("/chat/completions", {"messages": USER, "stop": [1]}, "stop"),
    ("/chat/completions", {"messages": USER, "tools": {"a": 1}}, "tools"),
    ("/chat/completions", {"messages": [{"content": "no role"}]}, "messages.0"),
    ("/chat/completions", {"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    ("/responses", {"model": "platoon-policy"}, "input"),
    ("/responses", {"input": [{"type": "web_search_call"}]}, "input.0.type"),
    ("/responses", {"input": "hi", "previous_response_id": 7}, "previous_response_id"),
    ("/responses", {"input": "hi", "tools": [{"type": "web_search"}]}, "tools.0"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("path", "body", "field"), BAD_BODIES)
async def test_openai_dialects_name_the_bad_field(toy_tokenizer, path, body, field):
    async with running_gateway(toy_tokenizer, ["x"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with client_for(opened) as client:
            response = await client.post(path, json=body)
        assert await gw.settled() == []

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == field
    assert error["message"].startswith(field)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": USER}, "max_tokens"),
        ({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
            "messages.0.content.0.type",
        ),
    ],
)
async def test_anthropic_dialect_names_the_bad_field(toy_tokenizer, body, field):
    async with running_gateway(toy_tokenizer, ["x"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with client_for(opened) as client:
            response = await client.post("/messages", json=body)

    assert response.status_code == 400
    assert response.json()["type"] == "error"
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"].startswith(field)


NESTED_BAD_BODIES = [
    (
        "/responses",
        {"input": [{"type": "function_call_output", "call_id": "c1", "output": {"text": "x"}}]},
        "input.0.output",
    ),
    (
        "/responses",
        {"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": 5}]}]},
        "input.0.content.0.text",
    ),
    (
        "/messages",
        {
            "max_tokens": 5,
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]}
            ],
        },
        "messages.0.content.0.content",
    ),
    (
        "/messages",
        {
            "max_tokens": 5,
            "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": ["t"]}]}],
        },
        "messages.0.content.0.tool_use_id",
    ),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("path", "body", "field"), NESTED_BAD_BODIES)
async def test_a_wrong_field_inside_an_item_or_block_is_named(toy_tokenizer, path, body, field):
    async with running_gateway(toy_tokenizer, ["x"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with client_for(opened) as client:
            response = await client.post(path, json=body)
        assert await gw.settled() == []

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(f"{field}: expected ")
    if path == "/responses":
        assert error["param"] == field


@pytest.mark.anyio
async def test_a_body_that_is_not_json(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["x"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with client_for(opened) as client:
            response = await client.post("/chat/completions", content=b"{not json")
            anthropic_response = await client.post("/messages", content=b"[1,")

    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    assert anthropic_response.status_code == 400
    assert "not valid JSON" in anthropic_response.json()["error"]["message"]


@asyncio_only
@pytest.mark.anyio
async def test_clients_raise_bad_request_naming_the_field(toy_tokenizer, anyio_backend):
    async with running_gateway(toy_tokenizer, ["x"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with openai_client(opened) as client, anthropic_client(opened) as claude:
            with pytest.raises(openai.BadRequestError) as chat:
                await client.chat.completions.create(model="platoon-policy", messages=USER, temperature="hot")
            with pytest.raises(openai.BadRequestError) as responses:
                await client.responses.create(
                    model="platoon-policy", input=[{"type": "item_reference", "id": "x"}]
                )
            with pytest.raises(anthropic.BadRequestError) as messages:
                await claude.messages.create(
                    model="platoon-policy", max_tokens=5, messages=USER, stop_sequences="END"
                )

    assert chat.value.status_code == 400 and chat.value.param == "temperature"
    assert responses.value.param == "input.0.type"
    assert "stop_sequences: expected an array" in messages.value.message


# --- 401, 404, 405 ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_bad_key_is_401_on_every_route(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["x"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with httpx.AsyncClient(base_url=opened.base_url) as client:
            bad = {"authorization": "Bearer pt-not-a-key"}
            responses = [
                await client.post("/chat/completions", json={"messages": USER}, headers=bad),
                await client.post("/responses", json={"input": "hi"}, headers=bad),
                await client.post(
                    "/messages", json={"max_tokens": 1, "messages": USER}, headers={"x-api-key": "x"}
                ),
                await client.post("/messages/count_tokens", json={"messages": USER}),
                await client.get("/models"),
            ]
        assert await gw.settled() == []

    assert [r.status_code for r in responses] == [401] * 5
    assert responses[0].json()["error"]["code"] == "invalid_api_key"
    assert responses[2].json()["error"]["type"] == "authentication_error"
    assert all("invalid or expired API key" in r.text for r in responses)


@asyncio_only
@pytest.mark.anyio
async def test_the_key_stops_working_when_the_episode_finishes(toy_tokenizer, anyio_backend):
    async with running_gateway(toy_tokenizer, ["a", "b", "c"], serve_http=True) as gw:
        a = await gw.open("A")
        b = await gw.open("B")
        async with (
            openai_client(a) as client_a,
            openai_client(b) as client_b,
            anthropic_client(a) as claude_a,
        ):
            await client_a.chat.completions.create(model="platoon-policy", messages=USER)
            await gw.finish("A")
            with pytest.raises(openai.AuthenticationError, match="invalid or expired API key"):
                await client_a.chat.completions.create(model="platoon-policy", messages=USER)
            with pytest.raises(openai.AuthenticationError):
                await client_a.responses.create(model="platoon-policy", input="hi")
            with pytest.raises(anthropic.AuthenticationError):
                await claude_a.messages.create(model="platoon-policy", max_tokens=5, messages=USER)
            reply = await client_b.chat.completions.create(model="platoon-policy", messages=USER)
        records = await gw.settled()

    assert reply.choices[0].message.content == "b"
    assert [(r.episode_id, r.agent_id) for r in records] == [("A", "A/root"), ("B", "B/root")]


@pytest.mark.anyio
async def test_unknown_routes_are_404_and_wrong_methods_405(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["x"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with client_for(opened) as client:
            missing = await client.post("/embeddings", json={"input": "hi"})
            wrong = await client.get("/chat/completions")

    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "message": "no route POST /v1/embeddings",
        "type": "invalid_request_error",
        "param": None,
        "code": "not_found",
    }
    assert wrong.status_code == 405 and "GET is not allowed" in wrong.json()["error"]["message"]


# --- 429: the sampler is saturated ------------------------------------------------------------


@asyncio_only
@pytest.mark.anyio
async def test_a_saturated_sampler_answers_429(toy_tokenizer, anyio_backend):
    sampler = BlockingSampler(toy_tokenizer, ["first", "second"])
    async with running_gateway(
        toy_tokenizer, factory=Factory(sampler), serve_http=True, max_concurrent_samples=1
    ) as gw:
        a = await gw.open("A", max_model_calls=5)
        b = await gw.open("B")
        async with (
            openai_client(a) as client_a,
            openai_client(b) as client_b,
            anthropic_client(b) as claude_b,
        ):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: client_a.chat.completions.create(model="platoon-policy", messages=USER))
                await sampler.entered.wait()
                with pytest.raises(openai.RateLimitError) as chat:
                    await client_b.chat.completions.create(model="platoon-policy", messages=USER)
                with pytest.raises(openai.RateLimitError):
                    await client_b.responses.create(model="platoon-policy", input="hi")
                with pytest.raises(anthropic.RateLimitError):
                    await claude_b.messages.create(model="platoon-policy", max_tokens=5, messages=USER)
                sampler.release.set()
            reply = await client_b.chat.completions.create(model="platoon-policy", messages=USER)
        records = await gw.settled()

    assert chat.value.status_code == 429 and chat.value.code == "rate_limit_exceeded"
    assert chat.value.response.headers["retry-after"] == "1"
    assert "saturated" in chat.value.message
    assert reply.choices[0].message.content == "second"
    assert [r.episode_id for r in records] == ["A", "B"]
    assert gw.gateway.budgets["A"].calls == 1  # a refused call costs nothing


# --- context length, max_tokens, budgets, call kinds ------------------------------------------


@asyncio_only
@pytest.mark.anyio
async def test_context_length_errors_in_each_dialect(toy_tokenizer, anyio_backend):
    long = [{"role": "user", "content": "word " * 100}]
    async with running_gateway(toy_tokenizer, ["x"], serve_http=True, context_window=30) as gw:
        opened = await gw.open("ep1")
        async with openai_client(opened) as client, anthropic_client(opened) as claude:
            with pytest.raises(openai.BadRequestError) as chat:
                await client.chat.completions.create(model="platoon-policy", messages=long)
            with pytest.raises(openai.BadRequestError) as responses:
                await client.responses.create(model="platoon-policy", input="word " * 100)
            with pytest.raises(anthropic.BadRequestError) as messages:
                await claude.messages.create(model="platoon-policy", max_tokens=5, messages=long)
        assert await gw.settled() == []

    for error in (chat.value, responses.value):
        assert error.code == "context_length_exceeded" and error.param == "messages"
        assert "maximum context length is 30 tokens" in error.message
    assert messages.value.body["error"]["type"] == "invalid_request_error"
    assert messages.value.body["error"]["message"].startswith("prompt is too long:")


@asyncio_only
@pytest.mark.anyio
async def test_max_tokens_is_clamped_to_the_room_left_over_http(toy_tokenizer, anyio_backend):
    prompt = len(get_renderer("qwen3_instruct", toy_tokenizer).render(USER))
    text = "one two three four five six seven eight nine ten"
    window = prompt + 4
    async with running_gateway(toy_tokenizer, [text] * 3, serve_http=True, context_window=window) as gw:
        opened = await gw.open("ep1")
        async with openai_client(opened) as client, anthropic_client(opened) as claude:
            # Within the window, not beside the prompt: clamped, as agents ask for their usual limit.
            chat = await client.chat.completions.create(
                model="platoon-policy", messages=USER, max_completion_tokens=window
            )
            responses = await client.responses.create(
                model="platoon-policy", input="Hi.", max_output_tokens=window
            )
            messages = await claude.messages.create(model="platoon-policy", max_tokens=window, messages=USER)
        records = await gw.settled()

    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 4
    assert responses.status == "incomplete"
    assert messages.stop_reason == "max_tokens" and messages.usage.output_tokens == 4
    assert [len(r.completion_tokens) for r in records] == [4, 4, 4]


@asyncio_only
@pytest.mark.anyio
async def test_budget_exhaustion_and_call_kinds_over_http(toy_tokenizer, anyio_backend):
    async with running_gateway(toy_tokenizer, [f"reply {n}" for n in range(6)], serve_http=True) as gw:
        opened = await gw.open("ep1", max_model_calls=2)
        async with openai_client(opened) as client, anthropic_client(opened) as claude:
            await client.chat.completions.create(model="platoon-policy", messages=USER)
            aux = {"X-Platoon-Call-Kind": "aux"}
            await client.chat.completions.create(model="platoon-policy", messages=USER, extra_headers=aux)
            await client.responses.create(model="platoon-policy", input="hi", extra_headers=aux)
            await client.chat.completions.create(
                model="platoon-policy", messages=USER, extra_headers={"X-Platoon-Call-Kind": "judge"}
            )
            await client.chat.completions.create(model="platoon-policy", messages=USER)
            with pytest.raises(openai.BadRequestError) as chat:
                await client.chat.completions.create(model="platoon-policy", messages=USER)
            with pytest.raises(anthropic.BadRequestError) as messages:
                await claude.messages.create(model="platoon-policy", max_tokens=5, messages=USER)
            await claude.messages.create(
                model="platoon-policy", max_tokens=5, messages=USER, extra_headers=aux
            )
            with pytest.raises(openai.BadRequestError, match="X-Platoon-Call-Kind"):
                await client.chat.completions.create(
                    model="platoon-policy", messages=USER, extra_headers={"X-Platoon-Call-Kind": "free"}
                )
        records = await gw.settled()

    assert chat.value.code == "budget_exhausted" and "all 2 model calls are used" in chat.value.message
    assert "budget exhausted" in messages.value.message
    assert [r.kind for r in records] == ["policy", "aux", "aux", "judge", "policy", "aux"]


@asyncio_only
@pytest.mark.anyio
async def test_a_sampler_failure_is_502(toy_tokenizer, anyio_backend):
    def crash(messages: list[dict[str, Any]]) -> str:
        raise RuntimeError("out of memory")

    async with running_gateway(toy_tokenizer, crash, serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with openai_client(opened) as client:
            with pytest.raises(openai.InternalServerError) as error:
                await client.chat.completions.create(model="platoon-policy", messages=USER)

    assert error.value.status_code == 502
    assert "sampling failed: RuntimeError: out of memory" in error.value.message


MALFORMED_TURNS = [
    {"role": "assistant", "tool_calls": [{"function": None}]},
    {"role": "assistant", "tool_calls": 5},
    {"role": "assistant", "tool_calls": [{"function": {"name": ["guess"], "arguments": {}}}]},
    {"role": "assistant", "content": [{"type": "text", "text": 5}]},
    {"role": "assistant", "content": 5},
    {"role": "assistant", "content": [5]},
]


@pytest.mark.anyio
@pytest.mark.parametrize("turn", MALFORMED_TURNS)
async def test_a_malformed_assistant_turn_is_400_not_500(toy_tokenizer, turn):
    async with running_gateway(toy_tokenizer, ["x", "y"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with client_for(opened) as client:
            # A first call, so that the agent has sampled turns to look the history up in.
            await client.post("/chat/completions", json={"model": MODEL, "messages": USER})
            response = await client.post(
                "/chat/completions", json={"model": MODEL, "messages": [*USER, turn, *USER]}
            )

    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("messages.1.")

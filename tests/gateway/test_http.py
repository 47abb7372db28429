"""The gateway over HTTP, driven by the real `openai` client (async and sync, streaming and
not), by plain httpx under trio, and token-exact history across calls.

The async openai client runs under asyncio only; the sync client runs in a worker thread and
httpx speaks to the gateway under both backends.
"""

# ruff: noqa: F811
from __future__ import annotations

import itertools
import json
from typing import Any

import anyio
import httpx
import openai
import pytest
from test_gateway import (
    GUESS_TOOLS,
    extends,
    running_gateway,
    sampled_tokens,
    tool_call_text,
)

from platoon.gateway.http import build_app
from tokenizer_fixtures import qwen3_tokenizer, toy_tokenizer  # noqa: F401

asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])


def async_client(opened: Any, **options: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=opened.base_url, api_key=opened.key, max_retries=0, **options)


def assemble(chunks: list[Any]) -> dict[str, Any]:
    """The assistant message a streaming client builds from chat.completion.chunk deltas."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content.append(delta.content or "")
            for call in delta.tool_calls or []:
                entry = calls.setdefault(
                    call.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                entry["id"] += call.id or ""
                entry["function"]["name"] += call.function.name or ""
                entry["function"]["arguments"] += call.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


ECHOES = {
    "exclude_none": lambda m: m.model_dump(exclude_none=True),
    "with_nones": lambda m: m.model_dump(),
    "content_empty_string": lambda m: {**m.model_dump(exclude_none=True), "content": m.content or ""},
    "arguments_as_dict": lambda m: {
        **m.model_dump(exclude_none=True),
        "tool_calls": [
            {
                **c.model_dump(),
                "function": {"name": c.function.name, "arguments": json.loads(c.function.arguments)},
            }
            for c in m.tool_calls or []
        ],
    },
}


class _Streamed:
    """A streamed reply presented like a non-streamed message, for the echo functions."""

    def __init__(self, message: dict[str, Any]) -> None:
        self.message = openai.types.chat.ChatCompletionMessage.model_validate(message)


# --- the async client -------------------------------------------------------------------------


@asyncio_only
@pytest.mark.anyio
@pytest.mark.parametrize("echo", list(ECHOES))
async def test_async_openai_client_drives_a_tool_calling_agent(toy_tokenizer, echo, anyio_backend):
    script = [tool_call_text(n, compact=True, preamble=f"Try {n}.") for n in (10, 20, 30)] + ["It is 30."]
    async with running_gateway(toy_tokenizer, script, serve_http=True) as gw:
        opened = await gw.open("ep1")
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You play a guessing game."},
            {"role": "user", "content": "Guess a number from 1 to 100."},
        ]
        async with async_client(opened) as client:
            for n in range(4):
                if n % 2:  # every other call streams
                    stream = await client.chat.completions.create(
                        model="platoon-policy", messages=messages, tools=GUESS_TOOLS, stream=True
                    )
                    message = _Streamed(assemble([chunk async for chunk in stream])).message
                else:
                    response = await client.chat.completions.create(
                        model="platoon-policy", messages=messages, tools=GUESS_TOOLS
                    )
                    message = response.choices[0].message
                    assert response.choices[0].finish_reason == ("tool_calls" if n < 3 else "stop")
                messages.append(ECHOES[echo](message))
                for call in message.tool_calls or []:
                    assert call.function.name == "guess"
                    assert json.loads(call.function.arguments) == {"number": (n + 1) * 10}
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": "wrong"})
        records = await gw.settled()

    assert messages[-1]["content"] == "It is 30."
    assert [r.completion_tokens for r in records] == [sampled_tokens(toy_tokenizer, s) for s in script]
    assert {(r.episode_id, r.agent_id, r.kind) for r in records} == {("ep1", "ep1/root", "policy")}
    for earlier, later in itertools.pairwise(records):
        assert extends(later, earlier)


@asyncio_only
@pytest.mark.anyio
async def test_logprobs_come_back_with_the_tokens(toy_tokenizer, anyio_backend):
    script = ["Fifty.", tool_call_text(50), "Fifty.", tool_call_text(50), "Plain."]
    async with running_gateway(toy_tokenizer, script, serve_http=True) as gw:
        opened = await gw.open("ep1")
        messages = [{"role": "user", "content": "Guess."}]
        async with async_client(opened) as client:
            text = await client.chat.completions.create(
                model="platoon-policy", messages=messages, logprobs=True
            )
            call = await client.chat.completions.create(
                model="platoon-policy", messages=messages, tools=GUESS_TOOLS, logprobs=True
            )
            streams = []
            for tools in (None, GUESS_TOOLS):
                stream = await client.chat.completions.create(
                    model="platoon-policy",
                    messages=messages,
                    tools=tools or openai.omit,
                    logprobs=True,
                    stream=True,
                )
                streams.append(
                    [
                        lp
                        for chunk in [c async for c in stream]
                        for ch in chunk.choices
                        if ch.logprobs
                        for lp in ch.logprobs.content
                    ]
                )
            plain = await client.chat.completions.create(
                model="platoon-policy", messages=messages, tools=GUESS_TOOLS
            )
        records = await gw.settled()

    assert plain.choices[0].logprobs is None
    got = [text.choices[0].logprobs.content, call.choices[0].logprobs.content, *streams]
    for entries, record in zip(got, records[:4], strict=True):
        assert [e.logprob for e in entries] == record.logprobs == [-0.25] * len(record.completion_tokens)
        assert [e.token for e in entries] == [toy_tokenizer.decode([t]) for t in record.completion_tokens]


@asyncio_only
@pytest.mark.anyio
async def test_n_choices_are_each_recorded(toy_tokenizer, anyio_backend):
    async with running_gateway(toy_tokenizer, ["one", "two", "three"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with async_client(opened) as client:
            response = await client.chat.completions.create(
                model="platoon-policy",
                messages=[{"role": "user", "content": "Count."}],
                n=3,
                temperature=0.7,
                seed=1,
            )
        records = await gw.settled()

    assert [c.message.content for c in response.choices] == ["one", "two", "three"]
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert response.usage.completion_tokens == sum(len(r.completion_tokens) for r in records)
    assert len({r.call_id for r in records}) == 3


@asyncio_only
@pytest.mark.anyio
async def test_stream_usage_and_models(toy_tokenizer, anyio_backend):
    async with running_gateway(toy_tokenizer, ["Hello there."], serve_http=True, model_name="pol") as gw:
        opened = await gw.open("ep1")
        async with async_client(opened) as client:
            stream = await client.chat.completions.create(
                model="pol",
                messages=[{"role": "user", "content": "Hi."}],
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
            models = await client.models.list()
        [record] = await gw.settled()

    assert assemble(chunks)["content"] == "Hello there."
    assert chunks[-1].usage.completion_tokens == len(record.completion_tokens)
    assert chunks[-1].usage.prompt_tokens == len(record.prompt_tokens)
    assert sorted(m.id for m in models.data) == ["platoon-policy", "pol"]


@asyncio_only
@pytest.mark.anyio
async def test_real_qwen3_tokenizer_over_http(qwen3_tokenizer, anyio_backend):
    script = [
        "<think>\nMiddle first.\n</think>\n\n" + tool_call_text(50),
        "<think>\nLower.\n</think>\n\nIt is 25.",
    ]
    async with running_gateway(qwen3_tokenizer, script, renderer="qwen3", serve_http=True) as gw:
        opened = await gw.open("ep1")
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Guess a number."}]
        async with async_client(opened) as client:
            first = await client.chat.completions.create(
                model="platoon-policy", messages=messages, tools=GUESS_TOOLS
            )
            message = first.choices[0].message
            messages += [
                message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "too high"},
            ]
            stream = await client.chat.completions.create(
                model="platoon-policy", messages=messages, tools=GUESS_TOOLS, stream=True
            )
            chunks = [c async for c in stream]
        records = await gw.settled()

    assert message.model_extra["reasoning_content"] == "Middle first."
    assert assemble(chunks)["content"] == "It is 25."
    assert [r.completion_tokens for r in records] == [sampled_tokens(qwen3_tokenizer, s) for s in script]
    assert extends(records[1], records[0])


# --- the sync client in a thread, and httpx under trio ------------------------------------------


@pytest.mark.anyio
async def test_sync_openai_client_in_a_thread(toy_tokenizer):
    script = [tool_call_text(42), "Done.", "Streamed."]
    async with running_gateway(toy_tokenizer, script, serve_http=True) as gw:
        opened = await gw.open("ep1")

        def harness() -> tuple[Any, list[Any], list[Any]]:
            with openai.OpenAI(base_url=opened.base_url, api_key=opened.key, max_retries=0) as client:
                messages: list[Any] = [{"role": "user", "content": "Guess."}]
                first = client.chat.completions.create(
                    model="platoon-policy", messages=messages, tools=GUESS_TOOLS
                )
                message = first.choices[0].message
                messages += [
                    message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "right"},
                ]
                second = client.chat.completions.create(
                    model="platoon-policy", messages=messages, tools=GUESS_TOOLS
                )
                chunks = list(
                    client.chat.completions.create(model="platoon-policy", messages=messages, stream=True)
                )
                return first, [second], chunks

        first, [second], chunks = await anyio.to_thread.run_sync(harness)
        records = await gw.settled()

    assert json.loads(first.choices[0].message.tool_calls[0].function.arguments) == {"number": 42}
    assert second.choices[0].message.content == "Done."
    assert assemble(chunks)["content"] == "Streamed."
    assert [r.completion_tokens for r in records] == [sampled_tokens(toy_tokenizer, s) for s in script]
    assert extends(records[1], records[0])


@pytest.mark.anyio
async def test_httpx_streams_server_sent_events(toy_tokenizer):
    async with running_gateway(toy_tokenizer, [tool_call_text(9, preamble="Nine.")], serve_http=True) as gw:
        opened = await gw.open("ep1")
        body = {
            "model": "platoon-policy",
            "messages": [{"role": "user", "content": "Go."}],
            "tools": GUESS_TOOLS,
            "stream": True,
        }
        headers = {"authorization": f"Bearer {opened.key}"}
        async with (
            httpx.AsyncClient(base_url=opened.base_url, headers=headers) as client,
            client.stream("POST", "/chat/completions", json=body) as response,
        ):
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            data = [line[6:] async for line in response.aiter_lines() if line.startswith("data: ")]
        async with httpx.AsyncClient() as client:
            health = await client.get(opened.base_url.removesuffix("/v1") + "/healthz")

    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content") or "" for d in deltas) == "Nine."
    [call] = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert call["function"]["name"] == "guess" and json.loads(call["function"]["arguments"]) == {"number": 9}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert health.json() == {"status": "ok"}


@pytest.mark.anyio
async def test_concurrent_episodes_over_http_keep_their_own_records(toy_tokenizer):
    def answer(messages: list[dict[str, Any]]) -> str:
        return f"{messages[0]['content']} turn {sum(m['role'] == 'assistant' for m in messages)}"

    async with running_gateway(toy_tokenizer, answer, serve_http=True) as gw:
        keys = {name: (await gw.open(name)).key for name in ("A", "B", "C")}
        base_url = (await gw.open("D")).base_url

        async def episode(name: str) -> None:
            messages: list[dict[str, Any]] = [{"role": "system", "content": name}]
            headers = {"authorization": f"Bearer {keys[name]}"}
            async with httpx.AsyncClient(base_url=base_url, headers=headers) as client:
                for _ in range(3):
                    messages.append({"role": "user", "content": "next"})
                    response = await client.post(
                        "/chat/completions", json={"model": "platoon-policy", "messages": messages}
                    )
                    messages.append(response.json()["choices"][0]["message"])

        async with anyio.create_task_group() as tg:
            for name in keys:
                tg.start_soon(episode, name)
        await gw.settled()

        for name in keys:
            records = gw.of(name)
            assert [r.completion_text for r in records] == [f"{name} turn {n}" for n in range(3)]
            assert {r.agent_id for r in records} == {f"{name}/root"}
            assert all(extends(b, a) for a, b in itertools.pairwise(records))


@pytest.mark.anyio
async def test_model_calls_answer_the_same_straight_from_the_guard_or_through_routing(toy_tokenizer):
    """The model-call routes are served from the guard with the body it read; under a root path
    they go through starlette's routing: the same statuses, headers and bodies either way, and an
    unexpected error is starlette's 500."""
    async with running_gateway(toy_tokenizer, ["hello"] * 4) as gw:
        opened = await gw.open("ep1")
        app = build_app(gw.gateway)
        headers = {"authorization": f"Bearer {opened.key}"}
        body = {"model": "platoon-policy", "messages": [{"role": "user", "content": "Hi"}]}
        answers = []
        for root_path in ("", "/root"):
            transport = httpx.ASGITransport(app=app, root_path=root_path)
            async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers) as client:
                ok = await client.post(f"{root_path}/v1/chat/completions", json=body)
                bad = await client.post(f"{root_path}/v1/chat/completions", json={"messages": []})
                anthropic = await client.post(f"{root_path}/v1/messages", json={**body, "max_tokens": 5})
            answers.append(
                [
                    (r.status_code, sorted(r.headers.items()), _without_ids(r.json()))
                    for r in (ok, bad, anthropic)
                ]
            )
        assert answers[0] == answers[1]
        assert answers[0][0][0] == 200 and answers[0][1][0] == 400

        def broken(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("a bug")

        gw.gateway.complete = gw.gateway.complete_stream = broken  # type: ignore[method-assign]
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers) as client:
            failed = await client.post("/v1/chat/completions", json=body)
        assert (failed.status_code, failed.text) == (500, "Internal Server Error")


def _without_ids(value: Any) -> Any:
    """A response body without what differs between two calls (ids, times)."""
    if isinstance(value, dict):
        return {k: _without_ids(v) for k, v in value.items() if k not in ("id", "created")}
    if isinstance(value, list):
        return [_without_ids(v) for v in value]
    return value

"""What a hostile agent sends the gateway: huge prompts, malformed JSON and values, floods.

Each answer is a 4xx naming the problem, never a 500, and no agent's call holds up another's.
"""

# ruff: noqa: F811
from __future__ import annotations

import threading

import anyio
import httpx
import openai
import pytest
from test_gateway import BlockingSampler, Factory, running_gateway

from tokenizer_fixtures import qwen3_tokenizer, toy_tokenizer  # noqa: F401

pytestmark = pytest.mark.anyio
USER = [{"role": "user", "content": "Hi."}]


def client_for(opened, **kwargs) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=opened.base_url, headers={"authorization": f"Bearer {opened.key}"}, timeout=30, **kwargs
    )


async def test_a_huge_prompt_is_refused_before_it_is_tokenized(qwen3_tokenizer):
    async with running_gateway(qwen3_tokenizer, ["ok"], serve_http=True, context_window=2048) as gw:
        opened = await gw.open("ep1")
        client = openai.AsyncOpenAI(base_url=opened.base_url, api_key=opened.key, max_retries=0)
        calls = []
        gw.renderer.render = lambda *a, **k: calls.append(1) or []  # must not be reached
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="platoon-policy", messages=[{"role": "user", "content": "a" * (50 * 2**20)}]
            )
        await client.close()
    assert caught.value.code == "context_length_exceeded"
    assert calls == []


@pytest.mark.parametrize(
    "tools",
    [
        # ten thousand tools, each small
        [
            {"type": "function", "function": {"name": f"t{i}", "parameters": {"type": "object"}}}
            for i in range(10_000)
        ],
        # one tool whose schema is 1.3 MB
        [{"type": "function", "function": {"name": "big", "description": "x" * 1_300_000}}],
    ],
    ids=["many", "huge"],
)
async def test_too_many_or_too_large_tools_are_refused_before_they_are_rendered(toy_tokenizer, tools):
    async with running_gateway(toy_tokenizer, ["ok"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        gw.renderer.render = lambda *a, **k: pytest.fail("rendered")
        client = openai.AsyncOpenAI(base_url=opened.base_url, api_key=opened.key, max_retries=0)
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="platoon-policy", messages=USER, tools=tools)
        await client.close()
    assert refused.value.status_code == 400 and "tools" in str(refused.value)


async def test_one_agents_long_prompt_does_not_hold_up_another_agents_call(toy_tokenizer):
    """The long prompt is tokenized off the event loop: while it is, another call is answered."""
    async with running_gateway(toy_tokenizer, ["ok", "ok"], serve_http=True) as gw:
        renderer = gw.renderer
        real_render = renderer.render
        other_answered = threading.Event()
        waited: list[bool] = []

        def render(messages, tools=None, **kwargs):
            if len(str(messages)) > 100_000:
                # Hold the long prompt until the other agent's call is answered; on the event
                # loop this would deadlock (bounded by the timeout, then the test fails).
                waited.append(other_answered.wait(timeout=20))
            return real_render(messages, tools, **kwargs)

        renderer.render = render
        big, small = await gw.open("big"), await gw.open("small")
        results = {}

        async def call(name, opened, content):
            async with client_for(opened) as client:
                results[name] = await client.post(
                    "/chat/completions",
                    json={"model": "platoon-policy", "messages": [{"role": "user", "content": content}]},
                )
            if name == "small":
                other_answered.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "big", big, "word " * 200_000)
            tg.start_soon(call, "small", small, "hi")
    assert results["small"].status_code == 200 and results["big"].status_code == 200
    assert waited == [True]


MALFORMED = [
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "Unicode"),
    (b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', "NaN"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": 1e309}', "out of range"),
    (b'{"messages": [{"role": "user", "content": "x"}', "not valid JSON"),
    (b"\xff\xfe", "not valid JSON"),
]
ASKS = b'{"model": "platoon-policy", "messages": [{"role": "user", "content": "x"}], '
BAD_VALUES = [
    (ASKS + b'"max_tokens": 1000000000000}', "max_tokens"),
    (ASKS + b'"temperature": -1}', "temperature"),
    (ASKS + b'"top_p": 2}', "top_p"),
    (ASKS + b'"max_tokens": 3.5}', "max_tokens"),
]


@pytest.mark.parametrize(("body", "says"), MALFORMED + BAD_VALUES)
async def test_malformed_input_is_a_400_that_says_what_is_wrong(toy_tokenizer, body, says):
    paths = (
        ("/chat/completions", "/responses", "/messages")
        if (body, says) in MALFORMED
        else ("/chat/completions",)
    )
    async with running_gateway(toy_tokenizer, ["ok"], serve_http=True) as gw:
        opened = await gw.open("ep1")
        async with client_for(opened) as client:
            for path in paths:
                response = await client.post(path, content=body, headers={"content-type": "application/json"})
                assert response.status_code == 400, (path, response.text)
                assert says in response.text, (path, response.text)


async def test_a_body_over_the_limit_is_refused(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["ok"], serve_http=True, max_body=2**20) as gw:
        opened = await gw.open("ep1")
        async with client_for(opened) as client:
            response = await client.post(
                "/chat/completions", json={"messages": [{"role": "user", "content": "a" * 2**21}]}
            )
    assert response.status_code == 413


async def test_one_agent_cannot_take_every_slot(toy_tokenizer):
    sampler = BlockingSampler(toy_tokenizer, ["ok"] * 10)
    async with running_gateway(
        toy_tokenizer, factory=Factory(sampler), serve_http=True, max_calls_per_agent=2
    ) as gw:
        greedy, polite = await gw.open("greedy"), await gw.open("polite")
        statuses: list[int] = []

        async def call(opened):
            async with client_for(opened) as client:
                response = await client.post(
                    "/chat/completions", json={"model": "platoon-policy", "messages": USER}
                )
                statuses.append(response.status_code)

        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(call, greedy)
            while sampler.in_flight < 2:
                await sampler.entered.wait()
                sampler.entered = anyio.Event()
            await call(greedy)  # a third at once: refused
            assert statuses == [429]
            tg.start_soon(call, polite)  # another agent still gets in
            while sampler.in_flight < 3:
                await sampler.entered.wait()
                sampler.entered = anyio.Event()
            sampler.release.set()
    assert sorted(statuses) == [200, 200, 200, 429]

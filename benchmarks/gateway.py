"""Latency the gateway adds to a chat call, in process and over HTTP, and 64 concurrent clients.

The sampler answers at once with a canned completion, so what is measured is the gateway:
rendering, the bus round trip or the HTTP request, parsing, recording. The floor for HTTP is a
bare starlette endpoint served the same way (`serving.serve_asgi`) that returns a canned
completion; the floor in process is a bare bus request/reply.

Run: python benchmarks/gateway.py [--calls N] [--turns T] [--clients C] [--per-client K] [--backend asyncio|trio]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from platoon.bus import Bus
from platoon.bus.events import AgentOpened, AgentOpenRequested, Reply, Request, TaskRef
from platoon.gateway import Gateway
from platoon.gateway.renderers import get_renderer
from platoon.harness.context import AgentContext, Budget
from platoon.policy.base import SampledCompletion, SampleParams
from platoon.serving import serve_asgi
from platoon.testing.tokenizers import toy_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command and return its output.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]
REPLY = "I will look at the files first, then answer."


class Ping(Request, frozen=True, kw_only=True):
    """A bare bus request carrying the same messages as a chat call (the in-process floor)."""

    messages: list[dict[str, Any]]


class Pong(Reply, frozen=True, kw_only=True):
    message: dict[str, Any]


class InstantSampler:
    """Returns the same completion at once, whatever the prompt."""

    version = 0

    def __init__(self, tokens: list[int]) -> None:
        self.result = SampledCompletion(tokens=tokens, logprobs=[-0.5] * len(tokens), stop_reason="stop")

    async def sample(self, prompt_tokens: Sequence[int], params: SampleParams, *, messages=None):
        return self.result


class InstantFactory:
    def __init__(self, sampler: InstantSampler) -> None:
        self.sampler = sampler

    async def initial(self) -> InstantSampler:
        return self.sampler

    async def updated(self, event: Any) -> InstantSampler:
        return self.sampler


def conversation(turns: int) -> list[dict[str, Any]]:
    """A tool-using agent's history: system, task, then `turns` call/result pairs."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful software engineer."},
        {"role": "user", "content": "Find the bug in the parser and fix it. " * 4},
    ]
    for n in range(turns):
        call = {
            "id": f"c{n}",
            "type": "function",
            "function": {"name": "run", "arguments": f'{{"cmd": "ls {n}"}}'},
        }
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{n}", "content": f"file_{n}.py\n" * 8})
    return messages


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e3, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3


async def timed(n: int, call: Callable[[], Awaitable[Any]], warmup: int = 50) -> list[float]:
    for _ in range(warmup):
        await call()
    out = []
    for _ in range(n):
        start = time.perf_counter()
        await call()
        out.append(time.perf_counter() - start)
    return out


def canned_app(body: dict[str, Any]) -> Starlette:
    async def endpoint(request):
        await request.body()
        return JSONResponse(body)

    return Starlette(routes=[Route("/v1/chat/completions", endpoint, methods=["POST"])])


def row(name: str, samples: list[float], floor: list[float] | None = None) -> None:
    p50, p99 = percentiles(samples)
    line = f"  {name:<34} p50 {p50:7.3f} ms   p99 {p99:7.3f} ms"
    if floor is not None:
        f50, f99 = percentiles(floor)
        line += f"   added: p50 {p50 - f50:6.3f} ms  p99 {p99 - f99:6.3f} ms"
    print(line)


async def main(calls: int, turns: int, clients: int, per_client: int) -> None:
    tokenizer = toy_tokenizer()
    renderer = get_renderer("qwen3_instruct", tokenizer)
    completion = list(tokenizer.encode(REPLY, add_special_tokens=False)) + renderer.stop_token_ids[:1]
    gateway = Gateway(renderer=renderer, sampler_factory=InstantFactory(InstantSampler(completion)))
    messages = conversation(turns)
    print(f"conversation: {len(messages)} messages, {len(renderer.render(messages, TOOLS))} prompt tokens")

    async with Bus() as bus:
        gateway.attach(bus)
        bus.start_soon(gateway.run, bus)
        opened = await bus.request(AgentOpenRequested(episode_id="bench", agent_id="root"))
        assert isinstance(opened, AgentOpened) and opened.base_url is not None

        # In process: AgentContext.chat over the bus, against a bare request/reply on the bus.
        async def echo(request: Ping) -> None:
            await bus.publish(Pong(reply_to=request.request_id, message={"role": "assistant"}))

        bus.subscribe(Ping, echo)
        ctx = AgentContext(
            bus=bus,
            task=TaskRef(env="bench", split="train", task_id="0"),
            episode_id="bench",
            agent_id="root",
            instruction="",
            tools=[],
            budget=Budget(None),
        )
        floor_bus = await timed(calls, lambda: bus.request(Ping(messages=messages)))
        in_process = await timed(calls, lambda: ctx.chat(messages, TOOLS))

        # Over HTTP: the same client against the gateway and against a canned endpoint.
        canned = {
            "id": "chatcmpl-x",
            "object": "chat.completion",
            "created": 0,
            "model": "platoon-policy",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": REPLY}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        body = {"model": "platoon-policy", "messages": messages, "tools": TOOLS}
        headers = {"authorization": f"Bearer {opened.key}"}
        async with anyio.create_task_group() as tg:
            floor_url = await tg.start(serve_asgi, canned_app(canned))
            async with httpx.AsyncClient(headers=headers, timeout=30) as client:

                async def post(url: str) -> None:
                    response = await client.post(url, json=body)
                    response.raise_for_status()

                floor_http = await timed(calls, lambda: post(f"{floor_url}/v1/chat/completions"))
                over_http = await timed(calls, lambda: post(f"{opened.base_url}/chat/completions"))
            tg.cancel_scope.cancel()

        print(f"per call, {calls} sequential calls:")
        row("bus request/reply (floor)", floor_bus)
        row("in process: ctx.chat", in_process, floor_bus)
        row("bare starlette endpoint (floor)", floor_http)
        row("over HTTP: /v1/chat/completions", over_http, floor_http)

        # Concurrency: every client is its own episode with its own key.
        keys = []
        for n in range(clients):
            reply = await bus.request(AgentOpenRequested(episode_id=f"c{n}", agent_id=f"c{n}/root"))
            keys.append(reply.key)
        errors: list[str] = []
        latencies: list[float] = []

        # Clients are made before the clock starts: building one (its TLS context) takes ~20 ms.
        http_clients = [
            httpx.AsyncClient(headers={"authorization": f"Bearer {key}"}, timeout=60) for key in keys
        ]

        async def client_loop(client: httpx.AsyncClient) -> None:
            async with client:
                for _ in range(per_client):
                    start = time.perf_counter()
                    try:
                        response = await client.post(f"{opened.base_url}/chat/completions", json=body)
                        if response.status_code != 200:
                            errors.append(f"{response.status_code} {response.text[:100]}")
                    except httpx.HTTPError as exc:
                        errors.append(repr(exc))
                    latencies.append(time.perf_counter() - start)

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for client in http_clients:
                tg.start_soon(client_loop, client)
        elapsed = time.perf_counter() - start
        total = clients * per_client
        p50, p99 = percentiles(latencies)
        print(
            f"{clients} concurrent HTTP clients x {per_client} calls: {total - len(errors)}/{total} ok, "
            f"{len(errors)} errors, {total / elapsed:.0f} calls/s, p50 {p50:.2f} ms, p99 {p99:.2f} ms"
        )
        for error in errors[:5]:
            print("  error:", error)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=8, help="tool call/result pairs in the conversation")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--per-client", type=int, default=20)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()
    anyio.run(main, args.calls, args.turns, args.clients, args.per_client, backend=args.backend)

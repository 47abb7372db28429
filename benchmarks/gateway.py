"""What the gateway costs per chat call: latency in process and over HTTP, and the server's CPU.

The sampler answers at once with a canned completion, so what is measured is the gateway:
rendering, the bus round trip or the HTTP request, parsing, recording. The floor for HTTP is a
bare starlette endpoint served the same way (`serving.serve_asgi`) that returns a canned
completion; the floor in process is a bare bus request/reply.

Then, side by side and for the same clients (128 by default, each its own agent, in this
process), the server in a process of its own, measured by that process's CPU seconds per call
(/proc, Linux): the bare endpoint against the gateway on a short chat (`--turns` tool calls),
and the gateway on a coding agent's request (a 10 KiB system prompt, 16 tools, the same
history) as chat completions and as Anthropic Messages (Claude Code's dialect), per KiB of body.

Measured on 2 shared cores, before (issue #35) and after its point 5, two runs each, best of 3
server processes, 128 clients x 10 calls, server CPU ms per call:

    request                    bare starlette   gateway before   gateway after
    chat, 2.7 KiB                0.258-0.273      0.531-0.547      0.445-0.461   2.00x -> 1.68-1.79x
    agent's chat, 26 KiB         0.266-0.289      0.906-0.945      0.648-0.688
    agent's Messages, 26 KiB     0.273-0.297      0.945-1.000      0.633-0.688   per KiB vs chat:
                                                                                1.06-1.07x -> 0.99-1.02x

Then the model calls answered straight from the body guard (no starlette objects per call) and
an agent's prompt rendered and tokenized only where its call adds to its last one (`gateway.memo`).
Measured while another session loaded the same 2 cores (load 3-5): the two trees' servers
interleaved round by round, three runs (best of 6, 4 and 5 rounds of 128 clients x 20 calls; x 60
for the second, the short chat only), server CPU ms per call, each run's ratio to its own bare:

    request                    bare starlette   gateway before   gateway after
    chat, 2.7 KiB                0.227-0.264      0.391-0.439      0.359-0.427   1.52/1.66/1.76x ->
                                                                                1.52/1.62/1.59x
    agent's chat, 26 KiB         0.246-0.277      0.484-0.488      0.414-0.473   1.75/1.98x -> 1.70/1.68x
    agent's Messages, 26 KiB     0.250-0.266      0.445-0.516      0.410-0.504   1.94/1.78x -> 1.90/1.64x
                                                  per KiB vs chat: 1.08/0.93x -> 1.08/1.01x

Under that load a server's CPU per call moved by 10-20% from one run to the next, as much as the
change; the app's own cost, measured in process (`--app 7000`: the ASGI app called directly,
128 agents in turn, best of 7 batches, wall us per call, two runs), is steadier:

    request                    bare starlette   gateway before   gateway after
    chat, 2.7 KiB                  11.2-12.2        116-119           86
    agent's chat, 26 KiB           11.2-12.2        196-198         145-151
    agent's Messages, 26 KiB       11.2-12.2        195-209         141-151   per KiB vs chat:
                                                                             1.00-1.08x -> 0.99-1.02x

The goal (issue #35) is <= 1.15x the bare endpoint; it is not reached. A short chat's call still
costs the app ~74 us more than the bare endpoint's: reading the body under its deadline (a cancel
scope, 5) and parsing and checking it (11); in `Gateway.complete_stream` the render (8, most of
it writing and comparing the new messages), each message's encoding for the memo and the size
bound (4), finding the agent's sampled turns (4), the tokenizer's decode of the reply (4), the
parameters and controls (4), and the limiter, recording and async plumbing around them (~20);
building and sending the response (5). Each is a few microseconds of Python; what is left is
spread thin.

Issue #49 typed the bus's chat messages and cut the call into named phases; that cost ~20 us a
call in process and ~10 us a short HTTP chat. Then each call was made to work on what its agent's
call adds (`ctx.chat`'s reader, the memos' checks and comparisons, the sampled turns, an HTTP
agent's record), a whole reply left the streaming generator, `Bus.request` waited on an event,
and decoding went to the tokenizer's backend. The same machine idle, the trees one after the
other: in process, this benchmark's p50 in ms (two runs each); the app alone, its CPU us a call
(best of 7 batches of 1,024 calls, 128 agents in turn) in five fresh processes per tree,
interleaved, as min/median:

    measure                              before #49     #49, typed chat     after
    in process, ctx.chat (18 messages)   0.148 0.147    0.169               0.124 0.125
    an agent's 30 calls, growing         0.180 0.177    0.204               0.175 0.169
    same, trio: ctx.chat / growing       0.161 / 0.191                      0.136 / 0.176
    app alone, chat 2.7 KiB              109.0/115.1                        106.8/110.2
    app alone, agent's chat 26 KiB       197.8/225.2                        188.1/199.5
    app alone, agent's Messages 26 KiB   190.0/200.3                        185.6/194.0

Server CPU at 128 clients, best of 3 processes, two runs (ms a call): chat 0.615/0.439 ->
0.514/0.432, agent's chat 0.656/0.535 -> 0.586/0.578, Messages 0.545/0.529 -> 0.627/0.520; the
bare endpoint in the same runs 0.324-0.457: at that load these move as much as any change.

Run: python benchmarks/gateway.py [--calls N] [--turns T] [--clients C] [--per-client K] [--rounds R]
     [--backend asyncio|trio] [--app N]   (--calls 0 skips the latency part, --per-client 0 the
     server's CPU; --app N calls the apps alone, in process, N times each)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

import anyio
import httpx
import msgspec
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from platoon.bus import Bus
from platoon.bus.events import AgentOpened, AgentOpenRequested, Reply, Request, TaskRef
from platoon.gateway import Gateway, GatewayPolicy
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


CANNED = {
    "id": "chatcmpl-x",
    "object": "chat.completion",
    "created": 0,
    "model": "platoon-policy",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": REPLY}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


def canned_app(chat: dict[str, Any], messages: dict[str, Any] | None = None) -> Starlette:
    """A bare endpoint: reads the body, returns a fixed completion."""

    def endpoint(body: dict[str, Any]) -> Callable[[Any], Awaitable[JSONResponse]]:
        async def answer(request):
            await request.body()
            return JSONResponse(body)

        return answer

    return Starlette(
        routes=[
            Route("/v1/chat/completions", endpoint(chat), methods=["POST"]),
            Route("/v1/messages", endpoint(messages or chat), methods=["POST"]),
        ]
    )


def row(name: str, samples: list[float], floor: list[float] | None = None) -> None:
    p50, p99 = percentiles(samples)
    line = f"  {name:<34} p50 {p50:7.3f} ms   p99 {p99:7.3f} ms"
    if floor is not None:
        f50, f99 = percentiles(floor)
        line += f"   added: p50 {p50 - f50:6.3f} ms  p99 {p99 - f99:6.3f} ms"
    print(line)


async def latency(calls: int, turns: int) -> None:
    """Sequential calls, in process and over HTTP, against their floors."""
    gateway = bench_gateway()
    renderer = gateway.policies[gateway.default_policy].renderer
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
        agents = await growing(bus, calls)

        # Over HTTP: the same client against the gateway and against a canned endpoint.
        body = {"model": "platoon-policy", "messages": messages, "tools": TOOLS}
        headers = {"authorization": f"Bearer {opened.key}"}
        async with anyio.create_task_group() as tg:
            floor_url = await tg.start(serve_asgi, canned_app(CANNED))
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
        row(f"  an agent's {AGENT_CALLS} calls, growing", agents, floor_bus)
        row("bare starlette endpoint (floor)", floor_http)
        row("over HTTP: /v1/chat/completions", over_http, floor_http)


AGENT_CALLS = 30


async def growing(bus: Bus, calls: int) -> list[float]:
    """`ctx.chat` as an agent calls it: its history grows by the reply and a tool result each
    call (from a system prompt and a task to 60 messages), a new agent every 30 calls."""
    out: list[float] = []
    for n in range(-(-(calls + 50) // AGENT_CALLS)):
        opened = await bus.request(AgentOpenRequested(episode_id=f"grow{n}", agent_id=f"grow{n}/root"))
        assert opened.error is None
        ctx = AgentContext(
            bus=bus,
            task=TaskRef(env="bench", split="train", task_id="0"),
            episode_id=f"grow{n}",
            agent_id=f"grow{n}/root",
            instruction="",
            tools=[],
            budget=Budget(None),
        )
        messages = conversation(0)
        for turn in range(AGENT_CALLS):
            start = time.perf_counter()
            reply = await ctx.chat(messages, TOOLS)
            out.append(time.perf_counter() - start)
            messages += [reply.message, {"role": "user", "content": f"file_{turn}.py\n" * 8}]
    return out[50 : 50 + calls]  # the first agents' calls warm up


# --- the server's CPU per call: server and clients in separate processes ---------------------

SYSTEM = (
    "You are an interactive CLI tool that helps users with software engineering tasks. "
    "Use the instructions below and the tools available to you to assist the user. "
) * 60  # ~10 KiB, as a coding agent's system prompt is
TOOL_NAMES = [
    "Bash", "Read", "Write", "Edit", "MultiEdit", "Glob", "Grep", "LS", "WebFetch", "WebSearch",
    "NotebookRead", "NotebookEdit", "TodoRead", "TodoWrite", "Task", "ExitPlanMode",
]  # fmt: skip


def agent_tools() -> list[dict[str, Any]]:
    """A coding agent's tools (chat form): a long description and a schema each."""
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"{name}: performs its operation on the workspace and returns the result. "
                * 8,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "An absolute path in the workspace."},
                        "command": {"type": "string", "description": "What to run or look for."},
                        "limit": {"type": "integer", "description": "At most this many lines."},
                    },
                    "required": ["path"],
                },
            },
        }
        for name in TOOL_NAMES
    ]


def large_chat_body(turns: int) -> dict[str, Any]:
    """A coding agent's request as chat completions: long system prompt, many tools, a history."""
    messages = [{"role": "system", "content": SYSTEM}, *conversation(turns)[1:]]
    return {"model": "platoon-policy", "messages": messages, "tools": agent_tools(), "max_tokens": 512}


def as_anthropic(chat: dict[str, Any]) -> dict[str, Any]:
    """The same request as Claude Code sends it to /v1/messages."""
    messages: list[dict[str, Any]] = []
    for m in chat["messages"][1:]:
        if m["role"] == "assistant":
            calls = [
                {
                    "type": "tool_use",
                    "id": c["id"],
                    "name": c["function"]["name"],
                    "input": json.loads(c["function"]["arguments"]),
                }
                for c in m["tool_calls"]
            ]
            messages.append({"role": "assistant", "content": calls})
        elif m["role"] == "tool":
            result = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            messages.append({"role": "user", "content": [result]})
        else:
            messages.append({"role": "user", "content": [{"type": "text", "text": m["content"]}]})
    tools = [
        {"name": f["name"], "description": f["description"], "input_schema": f["parameters"]}
        for f in (t["function"] for t in chat["tools"])
    ]
    system = [
        {"type": "text", "text": chat["messages"][0]["content"], "cache_control": {"type": "ephemeral"}}
    ]
    return {
        "model": "platoon-policy",
        "max_tokens": chat["max_tokens"],
        "system": system,
        "messages": messages,
        "tools": tools,
        "metadata": {"user_id": "bench"},
    }


CANNED_MESSAGE = {
    "id": "msg_x",
    "type": "message",
    "role": "assistant",
    "model": "platoon-policy",
    "content": [{"type": "text", "text": REPLY}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 1, "output_tokens": 1},
}


def bench_gateway() -> Gateway:
    tokenizer = toy_tokenizer()
    renderer = get_renderer("qwen3_instruct", tokenizer)
    completion = list(tokenizer.encode(REPLY, add_special_tokens=False)) + renderer.stop_token_ids[:1]
    return Gateway(GatewayPolicy(renderer, InstantFactory(InstantSampler(completion))))


async def serve(what: str, clients: int, conn: Connection) -> None:
    """The server process: a bare endpoint or the gateway with `clients` agents open; sends its
    `/v1` URL and the agents' keys, then serves until terminated."""
    if what == "bare":
        app = canned_app(CANNED, CANNED_MESSAGE)
        async with anyio.create_task_group() as tg:
            url = await tg.start(serve_asgi, app)
            conn.send((f"{url}/v1", ["-"] * clients))
            await anyio.sleep_forever()
    gateway = bench_gateway()
    async with Bus() as bus:
        gateway.attach(bus)
        bus.start_soon(gateway.run, bus)
        keys = []
        for n in range(clients):
            opened = await bus.request(AgentOpenRequested(episode_id=f"c{n}", agent_id=f"c{n}/root"))
            assert isinstance(opened, AgentOpened) and opened.key is not None
            keys.append(opened.key)
        conn.send((opened.base_url, keys))
        await anyio.sleep_forever()


def serve_process(what: str, clients: int, conn: Connection, backend: str) -> None:
    anyio.run(serve, what, clients, conn, backend=backend)


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) process `pid` has used so far, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Load(NamedTuple):
    cpu_per_call: float  # seconds of the server process's CPU (user + system)
    calls_per_s: float
    errors: list[str]


async def load(pid: int, url: str, keys: list[str], path: str, body: bytes, per_client: int) -> Load:
    """`len(keys)` concurrent clients (one per agent) post `body` `per_client` times each."""
    errors: list[str] = []
    # Clients are made before the clock starts: building one (its TLS context) takes ~20 ms.
    clients = [
        httpx.AsyncClient(
            base_url=url,
            headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            timeout=60,
        )
        for key in keys
    ]

    async def calls(client: httpx.AsyncClient, n: int) -> None:
        for _ in range(n):
            try:
                response = await client.post(path, content=body)
                if response.status_code != 200:
                    errors.append(f"{response.status_code} {response.text[:100]}")
            except httpx.HTTPError as exc:
                errors.append(repr(exc))

    async def all_clients(n: int) -> None:
        async with anyio.create_task_group() as tg:
            for client in clients:
                tg.start_soon(calls, client, n)

    await all_clients(2)  # warm up: connections open, caches filled
    before, start = cpu_seconds(pid), time.perf_counter()
    await all_clients(per_client)
    after, elapsed = cpu_seconds(pid), time.perf_counter() - start
    for client in clients:
        await client.aclose()
    total = len(keys) * per_client
    return Load((after - before) / total, total / elapsed, errors)


def measure(
    what: str, path: str, body: bytes, clients: int, per_client: int, rounds: int, backend: str
) -> Load:
    """The best of `rounds` loads, each against a fresh server process."""
    best: Load | None = None
    for _ in range(rounds):
        ours, theirs = multiprocessing.Pipe()
        process = multiprocessing.get_context("spawn").Process(
            target=serve_process, args=(what, clients, theirs, backend), daemon=True
        )
        process.start()
        try:
            url, keys = ours.recv()
            result = anyio.run(load, process.pid, url, keys, path, body, per_client)
        finally:
            process.terminate()
            process.join()
        if best is None or result.cpu_per_call < best.cpu_per_call:
            best = result
    assert best is not None
    return best


async def asgi_post(app: Callable[..., Awaitable[None]], path: str, body: bytes, key: str) -> None:
    """One POST of `body` to an ASGI app, called directly; it must answer 200."""

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        assert message.get("status", 200) == 200, message

    headers = [(b"authorization", f"Bearer {key}".encode()), (b"content-type", b"application/json")]
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "root_path": "",
             "query_string": b"", "headers": headers, "http_version": "1.1", "scheme": "http",
             "server": ("127.0.0.1", 1), "client": ("127.0.0.1", 2)}  # fmt: skip
    await app(scope, receive, send)


async def app_cost(turns: int, clients: int, calls: int) -> None:
    """The ASGI apps called directly, in this process, `clients` agents in turn: wall time per
    call, best of 7 batches (steadier than a server's CPU on a loaded machine)."""
    from platoon.gateway.http import build_app  # the app alone, without a server

    small = msgspec.json.encode({"model": "platoon-policy", "messages": conversation(turns), "tools": TOOLS})
    large = large_chat_body(turns)
    bodies = [
        ("chat body", "/v1/chat/completions", small),
        ("agent's chat body", "/v1/chat/completions", msgspec.json.encode(large)),
        ("agent's messages body", "/v1/messages", msgspec.json.encode(as_anthropic(large))),
    ]
    gateway = bench_gateway()
    gateway.serve_http = False
    async with Bus() as bus:
        gateway.attach(bus)
        bus.start_soon(gateway.run, bus)
        keys = []
        for n in range(clients):  # as agents open: once the gateway has its sampler
            opened = await bus.request(AgentOpenRequested(episode_id=f"c{n}", agent_id=f"c{n}/root"))
            assert isinstance(opened, AgentOpened) and opened.key is not None
            keys.append(opened.key)
        apps = [("bare starlette", canned_app(CANNED, CANNED_MESSAGE)), ("gateway", build_app(gateway))]
        print(f"the app alone, per call, {clients} agents in turn, best of 7 x {calls // 7} calls:")
        for name, path, body in bodies:
            for what, app in apps:
                for key in keys * 2:  # warm up: every agent has called
                    await asgi_post(app, path, body, key)
                best = float("inf")
                for _ in range(7):
                    start = time.perf_counter()
                    for n in range(calls // 7):
                        await asgi_post(app, path, body, keys[n % len(keys)])
                    best = min(best, (time.perf_counter() - start) / (calls // 7))
                print(f"  {what + ', ' + name:<38} {len(body) / 1024:5.1f} KiB  {best * 1e6:6.1f} us/call")


def server_cpu(turns: int, clients: int, per_client: int, rounds: int, backend: str) -> None:
    """Side by side, the same clients: the server process's CPU per call of the bare endpoint and
    of the gateway; and of the Messages dialect against chat completions, per KiB of body."""
    small = msgspec.json.encode({"model": "platoon-policy", "messages": conversation(turns), "tools": TOOLS})
    large = large_chat_body(turns)
    chat, messages = msgspec.json.encode(large), msgspec.json.encode(as_anthropic(large))
    runs = [
        ("bare starlette, chat body", "bare", "/chat/completions", small),
        ("gateway, chat completions", "gateway", "/chat/completions", small),
        ("bare starlette, agent's chat body", "bare", "/chat/completions", chat),
        ("gateway, agent's chat body", "gateway", "/chat/completions", chat),
        ("bare starlette, agent's messages body", "bare", "/messages", messages),
        ("gateway, agent's messages body", "gateway", "/messages", messages),
    ]
    print(
        f"server process CPU per call, {clients} concurrent clients x {per_client} calls, best of {rounds}:"
    )
    results = []
    for name, what, path, body in runs:
        result = measure(what, path, body, clients, per_client, rounds, backend)
        results.append(result)
        per_kib = result.cpu_per_call * 1e3 / (len(body) / 1024)
        print(
            f"  {name:<38} {len(body) / 1024:5.1f} KiB  {result.cpu_per_call * 1e3:6.3f} ms CPU/call "
            f"({per_kib:6.3f} ms/KiB)  {result.calls_per_s:5.0f} calls/s  {len(result.errors)} errors"
        )
        if result.cpu_per_call * clients * per_client < 100 / os.sysconf("SC_CLK_TCK"):
            print("    (under 100 clock ticks of CPU: too few calls to tell; raise --per-client)")
        for error in result.errors[:3]:
            print("    error:", error)
    bare, gateway, _, chat_large, _, messages_large = results
    chat_kib = chat_large.cpu_per_call / len(chat)
    messages_kib = messages_large.cpu_per_call / len(messages)
    print(
        f"  gateway / bare starlette, CPU per call: {gateway.cpu_per_call / bare.cpu_per_call:.2f}x (goal <= 1.15x)"
    )
    print(f"  messages / chat completions, CPU per KiB: {messages_kib / chat_kib:.2f}x (goal <= 1x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=8, help="tool call/result pairs in the conversation")
    parser.add_argument("--clients", type=int, default=128)
    parser.add_argument("--per-client", type=int, default=10)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--app", type=int, default=0, help="calls of the apps alone, in process (0: none)")
    parser.add_argument(
        "--rounds", type=int, default=3, help="server processes per measure (the best counts)"
    )
    args = parser.parse_args()
    if args.calls:
        anyio.run(latency, args.calls, args.turns, backend=args.backend)
    if args.app:
        anyio.run(app_cost, args.turns, args.clients, args.app, backend=args.backend)
    if args.per_client:
        server_cpu(args.turns, args.clients, args.per_client, args.rounds, args.backend)

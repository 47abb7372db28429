"""Rollout throughput: number-search episodes played by a scripted binary search.

Each episode is about 10 model calls and 10 tool calls: the scripted policy writes its guess as
a Qwen3 `<tool_call>`, the qwen3_instruct renderer renders the history and parses the call, the
environment answers higher or lower. Every call is recorded (`ModelCallFinished`, counted by
`evaluate`; `--event-log` also writes the run's event log). Three set-ups, each at 1, 16 and
128 concurrent episodes, each measured in a fresh subprocess so its peak RSS is its own:

* `inproc`: the environment in process (`env: platoon-number-search@1`), a function harness
  calling `ctx.chat` and `ctx.call_tool` over the bus;
* `http`: the same environment, a harness posting to the gateway's OpenAI-compatible HTTP with
  the episode's key (`httpx`, or the `openai` SDK with `--client openai`);
* `server`: the in-process harness, with the environment behind an ORS env server
  (`platoon.envs.server.running_env_server`, `service: http://...`);
* `floor`: the `http` harness and clients against a bare endpoint on the same server stack
  (starlette on `serving.serve_asgi`) that answers the binary search's tool call as JSON with
  no rendering, tokenizing, parsing or recording: what HTTP costs before the gateway does
  anything. `http` over `floor` is the gateway's own share.

    python benchmarks/rollout.py [--modes inproc,http,floor,server] [--concurrency 1,16,128]
                                 [--episodes N] [--tokenizer qwen3|toy] [--client httpx|openai]
                                 [--event-log]

The tokenizer is loaded from a saved directory through `platoon.load_tokenizer`, as a run
loads its model's. Peak RSS is the whole process's: tokenizer, environment SDK and all.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")

import anyio

import platoon as pt
from platoon.bus import Bus, EventLog, running
from platoon.bus.events import ToolReturned
from platoon.envs import build_env_service
from platoon.gateway import Gateway, GatewayPolicy, GatewaySettings
from platoon.gateway.renderers import get_renderer
from platoon.models.loading import load_tokenizer
from platoon.programs import EntrySettings, EpisodeRunner, Grader
from platoon.testing import tokenizers
from platoon.testing.policies import ScriptedSamplerFactory
from platoon.train.evaluate import EvalSettings, evaluate, list_tasks

ENV = "platoon-number-search@1"
LO, HI = 0, 1023  # the environment's default range: at most 10 guesses


def binary_search(messages: list[dict[str, Any]]) -> str:
    """The next guess of a binary search, written as the tool call a Qwen3 model would sample."""
    lo, hi, guess = LO, HI, None
    for message in messages:
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                arguments = call["function"]["arguments"]
                guess = (json.loads(arguments) if isinstance(arguments, str) else arguments)["number"]
        elif message.get("role") == "tool" and guess is not None:
            if message["content"] == "higher":
                lo = guess + 1
            elif message["content"] == "lower":
                hi = guess - 1
    call = {"name": "guess", "arguments": {"number": (lo + hi) // 2}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


@pt.harness("bench-inproc")
async def inproc_harness(ctx: pt.AgentContext) -> pt.AgentResult:
    """Tool calls through `ctx.chat` and `ctx.call_tool`, until the environment says done."""
    tools = ctx.openai_tools()
    messages: list[dict[str, Any]] = [{"role": "user", "content": ctx.instruction}]
    while ctx.budget.remaining() > 0:
        reply = await ctx.chat(messages, tools=tools)
        messages.append(reply.message)
        if not reply.tool_calls:
            return pt.AgentResult("completed", final_message=reply.text)
        for call in reply.tool_calls:
            result = await ctx.call_tool(call["function"]["name"], json.loads(call["function"]["arguments"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result.as_text()})
            if result.finished:
                return pt.AgentResult("completed", final_message=result.as_text())
    return pt.AgentResult("limit")


CLIENT = "httpx"
_openai: list[Any] = []


@pt.harness("bench-http")
async def http_harness(ctx: pt.AgentContext) -> pt.AgentResult:
    """The same loop, sampling through the gateway's OpenAI-compatible HTTP with the episode's key.

    `httpx` by default, one client an episode as a command-line agent has its own (one shared
    pool for 128 episodes spends more CPU scanning httpcore's connection list than the gateway
    spends answering); `--client openai` uses the `openai` SDK, one shared client, whose request
    building costs milliseconds of CPU a call in this process.
    """
    import httpx

    tools = ctx.openai_tools()
    messages: list[dict[str, Any]] = [{"role": "user", "content": ctx.instruction}]
    headers = {"Authorization": f"Bearer {ctx.api_key}"}
    # No TLS to loopback: skip loading the CA bundle each client would otherwise read.
    base_url = FLOOR_URL[0] if FLOOR_URL else str(ctx.gateway_url)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=60, verify=False) as http:
        while ctx.budget.remaining() > 0:
            body = {"model": "platoon-policy", "messages": messages, "tools": tools}
            if CLIENT == "openai":
                message = await _openai_complete(ctx, body)
            else:
                response = await http.post("/chat/completions", json=body)
                response.raise_for_status()
                message = response.json()["choices"][0]["message"]
            messages.append(message)
            if not message.get("tool_calls"):
                return pt.AgentResult("completed", final_message=message.get("content"))
            for call in message["tool_calls"]:
                arguments = json.loads(call["function"]["arguments"])
                result = await ctx.call_tool(call["function"]["name"], arguments)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result.as_text()})
                if result.finished:
                    return pt.AgentResult("completed", final_message=result.as_text())
    return pt.AgentResult("limit")


async def _openai_complete(ctx: pt.AgentContext, body: dict[str, Any]) -> dict[str, Any]:
    from openai import AsyncOpenAI

    if not _openai:
        _openai.append(AsyncOpenAI(base_url=ctx.gateway_url, api_key="unused", max_retries=0))
    completion = await _openai[0].with_options(api_key=ctx.api_key).chat.completions.create(**body)
    return completion.choices[0].message.model_dump(exclude_none=True)


FLOOR_CALLS = [0]


@contextlib.asynccontextmanager
async def floor_endpoint() -> AsyncIterator[str]:
    """A bare chat completions endpoint answering the binary search's next call as JSON."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from platoon.serving import serve_asgi

    async def complete(request: Request) -> JSONResponse:
        body = await request.json()
        FLOOR_CALLS[0] += 1
        text = binary_search(body["messages"])
        call = json.loads(text.split("<tool_call>\n", 1)[1].split("\n</tool_call>", 1)[0])
        tool_call = {
            "id": f"call_{FLOOR_CALLS[0]}",
            "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
        }
        message = {"role": "assistant", "content": None, "tool_calls": [tool_call]}
        return JSONResponse(
            {
                "id": "chatcmpl-floor",
                "object": "chat.completion",
                "created": 0,
                "model": "platoon-policy",
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            }
        )

    app = Starlette(routes=[Route("/v1/chat/completions", complete, methods=["POST"])])
    async with anyio.create_task_group() as tg:
        url = await tg.start(serve_asgi, app, "127.0.0.1", 0)
        yield f"{url}/v1"
        tg.cancel_scope.cancel()


FLOOR_URL: list[str] = []


@contextlib.asynccontextmanager
async def env_service(mode: str) -> AsyncIterator[Any]:
    if mode != "server":
        yield build_env_service("ns", env=ENV)
        return
    from platoon.envs.named import load_named_env
    from platoon.envs.server import running_env_server

    async with running_env_server(load_named_env(ENV)) as url:
        yield build_env_service("ns", url, service_kwargs={"reward": "sum"})


class ToolCounter:
    name = "tool-counter"

    def __init__(self) -> None:
        self.count = 0
        self.errors = 0

        self._attached = False

    def attach(self, bus: Bus) -> None:
        if not self._attached:
            self._attached = True
            bus.subscribe(ToolReturned, self.on_tool)

    def on_tool(self, event: ToolReturned) -> None:
        self.count += 1
        self.errors += event.error is not None

    async def run(self, bus: Bus) -> None:
        await anyio.sleep_forever()


def tokenizer_dir(name: str) -> str:
    """The tokenizer saved as a model directory would hold it, built once into a temp cache."""
    directory = os.path.join(tempfile.gettempdir(), f"platoon-bench-{name}-tokenizer")
    if not os.path.exists(os.path.join(directory, "tokenizer.json")):
        save = tokenizers.save_qwen3_tokenizer if name == "qwen3" else tokenizers.save_toy_tokenizer
        save(directory)
    return directory


async def measure(mode: str, concurrency: int, episodes: int, tokenizer_name: str, log: bool) -> dict:
    # Loaded as a run loads its model's tokenizer (building it from ranks would cost more memory
    # than any run spends).
    tokenizer = load_tokenizer(tokenizer_dir(tokenizer_name))
    harness = "bench-http" if mode in ("http", "floor") else "bench-inproc"
    tools = ToolCounter()
    with tempfile.TemporaryDirectory() as run_dir:
        async with contextlib.AsyncExitStack() as stack:
            if mode == "floor":
                FLOOR_URL.append(await stack.enter_async_context(floor_endpoint()))
            service = await stack.enter_async_context(env_service(mode))
            components = [
                service,
                Gateway(
                    GatewayPolicy(
                        get_renderer("qwen3_instruct", tokenizer),
                        ScriptedSamplerFactory(tokenizer, binary_search),
                    ),
                    GatewaySettings(serve_http=mode == "http"),
                ),
                EpisodeRunner([EntrySettings(name="ns", harness=harness, max_steps=12)]),
                Grader(),
                tools,
                *([EventLog(run_dir)] if log else []),
            ]
            async with Bus() as bus, running(bus, components):
                tasks = await list_tasks(bus, "ns", "train")
                warm = min(concurrency, 16)
                await evaluate(bus, tasks[:warm], EvalSettings(concurrency=concurrency), publish=False)
                tools_before, errors_before = tools.count, tools.errors
                floor_before = FLOOR_CALLS[0]
                started, cpu_started = time.perf_counter(), time.process_time()
                report = await evaluate(
                    bus, tasks[warm : warm + episodes], EvalSettings(concurrency=concurrency), publish=False
                )
                seconds = time.perf_counter() - started
                cpu = time.process_time() - cpu_started
    return {
        "mode": mode,
        "concurrency": concurrency,
        "episodes": report.episodes,
        "graded": report.graded,
        "reward_mean": report.reward_mean,
        "failures": report.failures,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "model_calls": report.tokens.get("calls", 0) if mode != "floor" else FLOOR_CALLS[0] - floor_before,
        "tool_calls": tools.count - tools_before,
        "tool_errors": tools.errors - errors_before,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def one(args: argparse.Namespace) -> None:
    global CLIENT
    mode, concurrency = args.one.split(":")
    CLIENT = args.client
    backend = "asyncio"  # the env server and the openai client need asyncio
    result = anyio.run(
        measure, mode, int(concurrency), args.episodes, args.tokenizer, args.event_log, backend=backend
    )
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="inproc,http,server")
    parser.add_argument("--concurrency", default="1,16,128")
    parser.add_argument("--episodes", type=int, default=0, help="per run (default: 40 x concurrency, <= 512)")
    parser.add_argument("--tokenizer", choices=["qwen3", "toy"], default="qwen3")
    parser.add_argument("--client", choices=["httpx", "openai"], default="httpx", help="for the http mode")
    parser.add_argument("--event-log", action="store_true", help="also write the event log to a temp dir")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(args)
        return
    tokenizer_dir(args.tokenizer)
    print(f"number-search, scripted binary search, {args.tokenizer} tokenizer, qwen3_instruct renderer")
    print("ms/call: wall time per model call (and its tool call); cpu ms: this process's CPU time per call")
    print(
        f"{'mode':<8} {'conc':>4} {'episodes':>8} {'calls/ep':>8} {'ep/s':>7} {'calls/s':>8} "
        f"{'ms/call':>7} {'cpu ms':>7} {'RSS MB':>7}  reward"
    )
    rates: dict[tuple[str, int], tuple[float, float]] = {}
    for mode in args.modes.split(","):
        for concurrency in map(int, args.concurrency.split(",")):
            episodes = args.episodes or min(40 * concurrency, 512)
            command = [
                sys.executable,
                __file__,
                "--one",
                f"{mode}:{concurrency}",
                "--episodes",
                str(episodes),
                "--tokenizer",
                args.tokenizer,
                "--client",
                args.client,
                *(["--event-log"] if args.event_log else []),
            ]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{mode:<8} {concurrency:>4}  failed: {done.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            rate = r["model_calls"] / r["seconds"]
            rates[mode, concurrency] = (rate, 1e3 * r["cpu_seconds"] / r["model_calls"])
            print(
                f"{mode:<8} {concurrency:>4} {r['episodes']:>8} {r['model_calls'] / r['episodes']:>8.2f} "
                f"{r['episodes'] / r['seconds']:>7.1f} {rate:>8.0f} {1e3 / rate:>7.2f} "
                f"{1e3 * r['cpu_seconds'] / r['model_calls']:>7.2f} "
                f"{r['peak_rss_mb']:>7.0f}  {r['reward_mean']:.2f}"
                + (f"  failures {r['failures']}" if r["failures"] else "")
                + (f"  tool errors {r['tool_errors']}" if r["tool_errors"] else "")
            )

    for concurrency in map(int, args.concurrency.split(",")):
        if ("http", concurrency) in rates and ("floor", concurrency) in rates:
            (http, http_cpu), (floor, floor_cpu) = rates["http", concurrency], rates["floor", concurrency]
            print(
                f"over HTTP at {concurrency}: the bare floor answers {floor / http:.2f}x as many calls/s "
                f"(target <= 1.25); the gateway's own CPU is {http_cpu - floor_cpu:.2f} ms a call "
                f"({http_cpu / floor_cpu:.2f}x the floor's); {http / PEER_HTTP_CALLS_S:.2f}x platoon "
                f"0.4.0's {PEER_HTTP_CALLS_S} calls/s on this machine"
            )


# platoon 0.4.0 measured on this machine: HTTP, a client per episode, 128 concurrent episodes.
PEER_HTTP_CALLS_S = 372

if __name__ == "__main__":
    main()

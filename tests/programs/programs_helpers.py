"""A toy environment, harnesses that fail in each way an episode can, and a running system
(env service, gateway without HTTP, episode runner, grader) to play them on."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import anyio.lowlevel
import msgspec

import platoon as pt
from platoon.bus import Bus, running
from platoon.bus.events import EpisodeGraded, EpisodeRequested, Event, TaskRef, ToolSpec, new_id
from platoon.envs import EnvError, EnvService, Grade, TaskInfo, ToolResult
from platoon.gateway import Gateway, GatewayPolicy, GatewaySettings
from platoon.gateway.renderers import get_renderer
from platoon.programs import EntrySettings, EpisodeRunner, Grader
from platoon.testing.policies import ScriptedSamplerFactory

GUESS_SCHEMA = {"type": "object", "properties": {"number": {"type": "integer"}}, "required": ["number"]}


class ToySession:
    """Find the task's secret from 0 to 15; `hang` never answers."""

    tools = [ToolSpec(name="guess", input_schema=GUESS_SCHEMA), ToolSpec(name="hang")]

    def __init__(self, backend: ToyBackend, task: TaskInfo) -> None:
        self.backend = backend
        self.secret = task.spec["secret"]
        self.instruction = "Find the number from 0 to 15."
        self.found = False
        backend.live.add(self)

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name == "hang":
            await anyio.sleep_forever()
        number = int(arguments["number"])
        if number == self.secret:
            self.found = True
            return ToolResult(output="correct", reward=1.0, finished=True)
        return ToolResult(output="higher" if self.secret > number else "lower", reward=0.0)

    async def read_file(self, path: str) -> str:
        """The one file of the toy "sandbox": the task's secret, for judges that read files."""
        if path != "/notes/secret.txt":
            raise FileNotFoundError(path)
        return f"the secret is {self.secret}"

    async def grade(self) -> Grade:
        if self.backend.grade_error:
            raise RuntimeError(self.backend.grade_error)
        return Grade(reward=1.0 if self.found else 0.0)

    async def fork(self, mode: str) -> ToySession:
        raise EnvError("the toy environment does not fork")

    async def close(self) -> None:
        await anyio.lowlevel.checkpoint()
        self.backend.live.discard(self)
        self.backend.closed += 1


class ToyBackend:
    """Sixteen tasks a split; `open_error` makes every session fail to open."""

    def __init__(self, *, open_error: str | None = None, grade_error: str | None = None) -> None:
        self.open_error = open_error
        self.grade_error = grade_error
        self.live: set[ToySession] = set()
        self.opened = 0
        self.closed = 0

    async def list_splits(self) -> list[str]:
        return ["train", "test"]

    async def list_tasks(self, split: str) -> list[TaskInfo]:
        return [
            TaskInfo(split=split, task_id=f"{split}-{i}", index=i, spec={"secret": (7 * i + 3) % 16})
            for i in range(16)
        ]

    async def open(self, task: TaskInfo, secrets: Mapping[str, str]) -> ToySession:
        if self.open_error:
            raise EnvError(self.open_error)
        self.opened += 1
        return ToySession(self, task)

    async def aclose(self) -> None:
        pass


def binary_search(messages: list[dict[str, Any]]) -> str:
    """The scripted policy: the next guess from 0 to 15, as a Qwen3 tool call."""
    lo, hi, guess = 0, 15, None
    for message in messages:
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                guess = json.loads(call["function"]["arguments"])["number"]
        elif message.get("role") == "tool" and guess is not None:
            if message["content"] == "higher":
                lo = guess + 1
            elif message["content"] == "lower":
                hi = guess - 1
    call = {"name": "guess", "arguments": {"number": (lo + hi) // 2}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


# --- harnesses ---------------------------------------------------------------------------------


@pt.harness("prog-guesser")
async def guesser(ctx: pt.AgentContext) -> pt.AgentResult:
    messages: list[dict[str, Any]] = [{"role": "user", "content": ctx.instruction}]
    while ctx.budget.remaining() > 0:
        reply = await ctx.chat(messages, tools=ctx.openai_tools())
        messages.append(reply.message)
        for call in reply.tool_calls:
            result = await ctx.call_tool(call["function"]["name"], json.loads(call["function"]["arguments"]))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result.as_text()})
            if result.finished:
                return pt.AgentResult("completed", final_message=result.output)
    return pt.AgentResult("limit")


@pt.harness("prog-other")
async def other(ctx: pt.AgentContext) -> pt.AgentResult:
    """The second harness of mixtures: one guess, no model."""
    result = await ctx.call_tool("guess", {"number": 0})
    return pt.AgentResult("completed", final_message=result.output)


@pt.harness("prog-raises")
async def raises(ctx: pt.AgentContext) -> pt.AgentResult:
    await ctx.call_tool("guess", {"number": 1})
    raise ValueError("the harness tripped")


@pt.harness("prog-sleeper")
async def sleeper(ctx: pt.AgentContext) -> pt.AgentResult:
    await anyio.sleep_forever()
    return pt.AgentResult("completed")


@pt.harness("prog-chatter")
async def chatter(ctx: pt.AgentContext) -> pt.AgentResult:
    """Ignores its budget: keeps calling the model until the gateway refuses."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": ctx.instruction}]
    while True:
        reply = await ctx.chat(messages)
        messages.append(reply.message)
        messages.append({"role": "user", "content": "Again."})


@pt.harness("prog-hanging-tool")
async def hanging_tool(ctx: pt.AgentContext) -> pt.AgentResult:
    result = await ctx.call_tool("hang", {})
    return pt.AgentResult("completed", final_message=result.as_text())


class ToyOptions(msgspec.Struct, forbid_unknown_fields=True):
    retries: int = 1
    mode: Literal["fast", "careful"] = "fast"


@pt.harness("prog-options", options=ToyOptions)
async def with_options(ctx: pt.AgentContext) -> pt.AgentResult:
    return pt.AgentResult("completed", final_message=f"{ctx.options.retries} {ctx.options.mode}")


# --- reward processors -------------------------------------------------------------------------


def halve(finished: Any, graded: Any) -> float:
    return graded.reward / 2


async def add_bonus(finished: Any, graded: Any) -> float:
    await anyio.lowlevel.checkpoint()
    return graded.reward + 0.25


def broken(finished: Any, graded: Any) -> float:
    raise KeyError("no such field")


# --- a running system --------------------------------------------------------------------------


@dataclass
class Toy:
    bus: Bus
    backend: ToyBackend
    service: EnvService
    gateway: Gateway
    seen: list[Event] = field(default_factory=list)

    async def play(
        self, task_id: str = "train-5", *, episode_id: str | None = None, **request: Any
    ) -> list[Event]:
        """Request one episode; its events up to and including its `EpisodeGraded`."""
        episode_id = episode_id or new_id()
        events: list[Event] = []
        async with self.bus.stream(Event, name="test:episode") as stream:
            await self.bus.publish(
                EpisodeRequested(
                    episode_id=episode_id,
                    group_id=new_id(),
                    task=TaskRef(env="toy", split="train", task_id=task_id),
                    **request,
                )
            )
            async for event in stream:
                if getattr(event, "episode_id", None) == episode_id:
                    events.append(event)
                if isinstance(event, EpisodeGraded) and event.episode_id == episode_id:
                    break
        return events

    async def all_closed(self) -> bool:
        """Wait (briefly) until no env session and no gateway key is left open."""
        with anyio.move_on_after(2):
            while self.service.open_sessions or self.backend.live or self.gateway.agents:  # noqa: ASYNC110 - other components' state
                await anyio.sleep(0.01)
        return not (self.service.open_sessions or self.backend.live or self.gateway.agents)


def entry(harness: str | dict[str, float], **settings: Any) -> EntrySettings:
    return EntrySettings(name="toy", harness=harness, **{"max_steps": 8, **settings})


@asynccontextmanager
async def toy_system(
    tokenizer: Any,
    *entries: EntrySettings,
    backend: ToyBackend | None = None,
    script: Any = binary_search,
    tool_timeout: float = 5.0,
    reward_processors: dict[str, str] | None = None,
    rules: dict[str, Any] | None = None,
    seed: int = 0,
    tool_errors: str = "env",
) -> AsyncIterator[Toy]:
    backend = backend or ToyBackend()
    service = EnvService("toy", backend, tool_timeout=tool_timeout, tool_errors=tool_errors)
    gateway = Gateway(
        GatewayPolicy(get_renderer("qwen3_instruct", tokenizer), ScriptedSamplerFactory(tokenizer, script)),
        GatewaySettings(serve_http=False),
    )
    components = [
        service,
        gateway,
        EpisodeRunner(list(entries) or [entry("prog-guesser")], request_timeout=10, seed=seed),
        Grader(reward_processors=reward_processors, rules=rules),
    ]
    async with Bus() as bus, running(bus, components):
        yield Toy(bus, backend, service, gateway)


def not_a_number(finished, graded):
    return float("nan")

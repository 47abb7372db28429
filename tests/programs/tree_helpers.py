"""Agent trees for the program tests: a notes environment with subtasks, scripted policies,
and a whole system (env service, gateway, runner, grader, credit assigner) on one bus."""

from __future__ import annotations

import json
import uuid
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from openreward.environments import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel

from platoon.bus import Bus, running
from platoon.bus.events import BatchReady, EpisodeGraded, EpisodeRequested, Event, TaskRef, new_id
from platoon.config.schema import AgentsConfig
from platoon.credit import CreditConfig
from platoon.envs.ors import OrsBackend
from platoon.envs.service import EnvService
from platoon.gateway import Gateway, GatewayPolicy, GatewaySettings
from platoon.gateway.renderers import get_renderer
from platoon.programs import EntrySettings, EpisodeRunner, Grader
from platoon.testing.policies import ScriptedSamplerFactory
from platoon.train.batcher import CreditAssigner, CreditSettings

TASKS = [
    {"id": "ab", "goal": ["a", "b"]},
    {"id": "a", "goal": ["a"]},
]


class Board(list):
    """The notes on one board (a list that a weak reference can hold)."""


_boards: weakref.WeakValueDictionary[str, Board] = weakref.WeakValueDictionary()


class Note(BaseModel):
    text: str


class Notes(Environment):
    """Write notes on a board; `finish` (and `grade`) check that every goal note is on it."""

    tasks: ClassVar[list[dict[str, Any]]] = TASKS

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return cls.tasks

    def __init__(self, task_spec: dict[str, Any] | None = None, secrets: dict[str, str] | None = None):
        super().__init__(task_spec=task_spec or {}, secrets=dict(secrets or {}))
        self.key = self.task_spec.get("board") or uuid.uuid4().hex
        self.board = _boards.get(self.key)
        if self.board is None:
            self.board = _boards[self.key] = Board(self.task_spec.get("notes", []))

    def get_prompt(self) -> list[TextBlock]:
        if "instruction" in self.task_spec:
            return [TextBlock(text=self.task_spec["instruction"])]
        return [TextBlock(text="Write the notes: " + ", ".join(self.task_spec["goal"]) + ".")]

    @tool
    async def write(self, args: Note) -> ToolOutput:
        """Write a note on the board."""
        self.board.append(args.text)
        return ToolOutput(blocks=[TextBlock(text=f"wrote {args.text}")])

    @tool
    async def read(self) -> ToolOutput:
        """Read the board."""
        return ToolOutput(blocks=[TextBlock(text=",".join(self.board))])

    @tool
    async def finish(self) -> ToolOutput:
        """End the task."""
        reward = self.grade()
        return ToolOutput(
            blocks=[TextBlock(text="done" if reward else "missing")], reward=reward, finished=True
        )

    def grade(self) -> float:
        return 1.0 if all(note in self.board for note in self.task_spec["goal"]) else 0.0


class SubNotes(Notes):
    """Notes with subtasks: a subagent's goal is the note its instruction ends with."""

    def child_task_spec(self, instruction: str, mode: str = "shared") -> dict[str, Any]:
        spec = {
            "id": f"{self.task_spec['id']}/sub",
            "goal": [instruction.split()[-1]],
            "instruction": instruction,
        }
        if mode == "shared":
            return spec | {"board": self.key}
        if mode == "copy":
            return spec | {"notes": list(self.board)}
        return spec | {"notes": list(self.task_spec.get("notes", []))}


def tool_call(name: str, **arguments: Any) -> str:
    """A Qwen3 tool call, as a model would write it."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def instruction_of(messages: list[dict[str, Any]]) -> str:
    return next(m["content"] for m in messages if m["role"] == "user")


def turn_of(messages: list[dict[str, Any]]) -> int:
    return sum(1 for m in messages if m["role"] == "assistant")


@dataclass
class Delegating:
    """A scripted policy for `platoon-react` on `SubNotes`. The root spawns one subagent per
    goal note, `levels` deep (`via K: write note X` delegates K more times), then finishes;
    the deepest writes its note. Notes in `wrong` are written as `x` instead."""

    levels: int = 1
    wrong: set[str] = field(default_factory=set)

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        instruction, n = instruction_of(messages), turn_of(messages)
        if instruction.startswith("Write the notes: "):
            notes = instruction.removeprefix("Write the notes: ").rstrip(".").split(", ")
            plan = [
                tool_call("spawn_subagent", instruction=f"via {self.levels - 1}: write note {x}")
                for x in notes
            ]
            plan.append(tool_call("finish"))
            return plan[n] if n < len(plan) else "finished"
        levels, _, rest = instruction.partition(": ")
        note = rest.split()[-1]
        if int(levels.removeprefix("via ")) > 0:
            deeper = int(levels.removeprefix("via ")) - 1
            return (
                tool_call("spawn_subagent", instruction=f"via {deeper}: {rest}")
                if n == 0
                else f"delegated {note}"
            )
        if n == 0:
            return tool_call("write", text="x" if note in self.wrong else note)
        return f"wrote {note}"


@dataclass
class Tree:
    """A running system; `play` runs one episode and returns its events."""

    bus: Bus
    batches: list[BatchReady] = field(default_factory=list)

    async def play(
        self, task_id: str = "ab", *, group_id: str | None = None, purpose: str = "train"
    ) -> list[Event]:
        episode_id = new_id()
        events: list[Event] = []
        async with self.bus.stream(Event, name="test:episode") as stream:
            task = TaskRef(env="notes", split="train", task_id=task_id)
            await self.bus.publish(
                EpisodeRequested(
                    episode_id=episode_id,
                    group_id=group_id or new_id(),
                    task=task,
                    purpose=purpose,  # type: ignore[arg-type]
                )
            )
            async for event in stream:
                if getattr(event, "episode_id", None) == episode_id:
                    events.append(event)
                if isinstance(event, EpisodeGraded) and event.episode_id == episode_id:
                    break
        return events


@asynccontextmanager
async def tree_system(
    tokenizer: Any,
    policy: Callable[[list[dict[str, Any]]], str] | list[str],
    *,
    env: type[Environment] = SubNotes,
    harness: str = "platoon-react",
    program: str = "recursive",
    agents: dict[str, Any] | None = None,
    credit: CreditConfig | None = None,
    group_size: int = 1,
    serve_http: bool = False,
    tasks: list[str] | None = None,
    **entry: Any,
) -> AsyncIterator[Tree]:
    """`env` played by `harness` under `program` against the scripted `policy`; with `credit`,
    a credit assigner turns each complete group of `group_size` into a `BatchReady`. `tasks`
    replaces the env's tasks with goal-less ones of these ids (their id is the harness's input)."""
    if tasks is not None:
        env = type(env.__name__, (env,), {"tasks": [{"id": t, "goal": []} for t in tasks]})
    settings = EntrySettings(
        name="notes",
        harness=harness,
        program=program,
        agents=AgentsConfig(**(agents or {})),
        **{"max_steps": 30, **entry},
    )
    components: list[Any] = [
        EnvService("notes", OrsBackend(env), tool_timeout=10),
        Gateway(
            GatewayPolicy(
                get_renderer("qwen3_instruct", tokenizer), ScriptedSamplerFactory(tokenizer, policy)
            ),
            GatewaySettings(serve_http=serve_http),
        ),
        EpisodeRunner([settings], request_timeout=30),
        Grader(),
    ]
    if credit is not None:
        components.append(CreditAssigner(CreditSettings(group_size=group_size, batch_size=1, credit=credit)))
    async with Bus() as bus, running(bus, components):
        tree = Tree(bus)
        bus.subscribe(BatchReady, tree.batches.append)
        yield tree

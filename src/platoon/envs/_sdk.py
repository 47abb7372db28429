"""What the ORS backends share, and the `openreward` SDK (the `ors` extra) with a clear error
when it is missing. (`platoon.envs` quiets the SDK's logging before it is imported.)"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import anyio

from platoon.bus.events import ToolSpec
from platoon.envs.service import EnvError, Grade, TaskInfo

try:
    from openreward.environments import Environment, ImageBlock, TextBlock, ToolOutput, tool
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise EnvError(f"ORS environments need the openreward SDK: pip install 'platoon[ors]' ({exc})") from exc

__all__ = [
    "Environment",
    "RewardTracker",
    "TextBlock",
    "ToolOutput",
    "blocks_text",
    "call_user",
    "is_environment_class",
    "on_asyncio",
    "task_infos",
    "terminal_spec",
    "tool",
    "tool_spec",
]


def is_environment_class(obj: object) -> bool:
    return isinstance(obj, type) and issubclass(obj, Environment)


def blocks_text(blocks: Sequence[Any]) -> str:
    """ORS content blocks as text: text blocks as they are, an image as a placeholder line."""
    parts = []
    for block in blocks:
        if isinstance(block, TextBlock) or getattr(block, "type", None) == "text":
            parts.append(block.text)
        elif isinstance(block, ImageBlock) or getattr(block, "type", None) == "image":
            parts.append(f"[image: {block.mimeType}]")
    return "\n".join(parts)


async def call_user(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run environment code as the SDK's server does: coroutines on the loop, plain functions
    in a worker thread (they may block), awaiting what a plain function returns if awaitable.

    Unlike the SDK's own helper this goes through anyio, so it also works under trio.
    """
    if inspect.iscoroutinefunction(fn):
        return await fn(*args, **kwargs)
    result = await anyio.to_thread.run_sync(partial(fn, *args, **kwargs))
    if inspect.isawaitable(result):
        result = await result
    return result


def on_asyncio() -> bool:
    """Whether an asyncio loop runs this task (the SDK's internals need one)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def task_infos(split: str, specs: Sequence[Any]) -> list[TaskInfo]:
    """ORS task specs as `TaskInfo`s. A task's id is its spec's `id` (or `task_id`) when
    every task of the split has a distinct one, else its index in the split."""
    specs = list(specs)
    for spec in specs:
        if not isinstance(spec, Mapping):
            raise EnvError(f"tasks of split {split!r} must be JSON objects, got {type(spec).__name__}")
    found = [_spec_id(spec) for spec in specs]
    ids = [i for i in found if i is not None]
    if len(ids) != len(specs) or len(set(ids)) != len(ids):
        ids = [str(index) for index in range(len(specs))]
    return [
        TaskInfo(split=split, task_id=task_id, index=index, spec=dict(spec))
        for index, (task_id, spec) in enumerate(zip(ids, specs, strict=True))
    ]


def _spec_id(spec: Mapping[str, Any]) -> str | None:
    for key in ("id", "task_id"):
        value = spec.get(key)
        if isinstance(value, str | int) and not isinstance(value, bool):
            return str(value)
    return None


def tool_spec(tool: Any) -> ToolSpec:
    """An ORS tool spec (server or client side) as platoon's `ToolSpec`."""
    schema = dict(tool.input_schema) if tool.input_schema else {"type": "object", "properties": {}}
    return ToolSpec(name=tool.name, description=tool.description or "", input_schema=schema)


def terminal_spec(term: Any) -> ToolSpec:
    """An ORS terminal tool: the harness passes the model's final message as its one field."""
    if term.arg is None:
        schema: dict[str, Any] = {"type": "object", "properties": {}}
    else:
        schema = {
            "type": "object",
            "properties": {term.arg: {"type": "string", "description": "The final answer message."}},
            "required": [term.arg],
        }
    return ToolSpec(name=term.name, description=term.description or "", input_schema=schema, terminal=True)


class RewardTracker:
    """Grades an ORS session from the tool results it saw.

    `final`: the reward of the result that finished the episode. An episode that never
    finished (the agent stopped, or ran out of steps) is graded by the sum of the rewards it
    saw, 0 when none, and says so in its reason: it failed, and must be trained on as such.
    `sum`: the sum of every reward seen, for environments that reward as they go. The sum of
    no rewards is 0: an agent that stopped without earning anything scored nothing, and
    must be trained on as such, or a policy that never acts would never be corrected.
    """

    def __init__(self, mode: str) -> None:
        if mode not in ("final", "sum"):
            raise EnvError(f"reward must be 'final' or 'sum', not {mode!r}")
        self.mode = mode
        self.finished = False
        self.final: float | None = None
        self.total = 0.0
        self.rewarded = False

    def see(self, reward: float | None, finished: bool) -> None:
        if reward is not None:
            self.total += reward
            self.rewarded = True
        if finished and not self.finished:
            self.finished = True
            self.final = reward

    def grade(self) -> Grade:
        if self.mode == "sum":
            if not self.rewarded:
                return Grade(reward=0.0, reason="no tool result carried a reward")
            return Grade(reward=self.total)
        if not self.finished:
            return Grade(
                reward=self.total,
                reason="the episode did not finish (no tool result had finished=True): graded by the sum "
                "of its rewards",
            )
        if self.final is None:
            return Grade(reward=None, reason="the tool result that finished the episode carried no reward")
        return Grade(reward=self.final)

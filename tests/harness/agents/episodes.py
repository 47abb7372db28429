"""Whole episodes for the harness tests: the quickstart's guess-the-number environment, the
gateway (serving HTTP), the episode runner and the grader on one bus, with a scripted policy."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from platoon.bus import Bus, running
from platoon.bus.events import EpisodeGraded, EpisodeRequested, Event, TaskRef, new_id
from platoon.envs import build_env_service
from platoon.gateway import Gateway, GatewayPolicy
from platoon.gateway.renderers import get_renderer
from platoon.programs import EntrySettings, EpisodeRunner, Grader
from platoon.testing.policies import ScriptedSamplerFactory

ROOT = Path(__file__).resolve().parents[3]
QUICKSTART = ROOT / "examples" / "quickstart"
AGENTS = Path(__file__).resolve().parent

if str(QUICKSTART) not in sys.path:  # for python://guess:GuessTheNumber and the example harness
    sys.path.insert(0, str(QUICKSTART))


def binary_search(messages: list[dict[str, Any]]) -> str:
    """The quickstart's scripted policy: the next binary-search guess as a Qwen3 tool call."""
    lo, hi, guess = 1, 100, None
    for message in messages:
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                arguments = call["function"]["arguments"]
                guess = (json.loads(arguments) if isinstance(arguments, str) else arguments)["number"]
        elif message.get("role") == "tool" and guess is not None:
            if "higher" in message["content"]:
                lo = guess + 1
            elif "lower" in message["content"]:
                hi = guess - 1
    call = {"name": "guess", "arguments": {"number": (lo + hi) // 2}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


@dataclass
class Guessing:
    """A running system; `play` runs one episode and returns its events."""

    bus: Bus
    seen: list[Event] = field(default_factory=list)

    async def play(
        self, task_id: str = "train-42", harness: str | None = None, seed: int | None = None
    ) -> list[Event]:
        episode_id = new_id()
        events: list[Event] = []
        async with self.bus.stream(Event, name="test:episode") as stream:
            task = TaskRef(env="guess", split="train", task_id=task_id)
            await self.bus.publish(
                EpisodeRequested(
                    episode_id=episode_id, group_id=new_id(), task=task, harness=harness, seed=seed
                )
            )
            async for event in stream:
                if getattr(event, "episode_id", None) == episode_id:
                    events.append(event)
                if isinstance(event, EpisodeGraded) and event.episode_id == episode_id:
                    break
        return events


@asynccontextmanager
async def guessing(
    tokenizer: Any,
    script: Callable[[list[dict[str, Any]]], str] | list[str],
    harness: str | dict[str, float],
    **entry: Any,
) -> AsyncIterator[Guessing]:
    """Guess-the-number played by `harness` against a scripted policy."""
    settings = EntrySettings(name="guess", harness=harness, **{"max_steps": 12, **entry})
    components = [
        build_env_service("guess", "python://guess:GuessTheNumber"),
        Gateway(
            GatewayPolicy(
                get_renderer("qwen3_instruct", tokenizer), ScriptedSamplerFactory(tokenizer, script)
            ),
        ),
        EpisodeRunner([settings], request_timeout=30),
        Grader(),
    ]
    async with Bus() as bus, running(bus, components):
        yield Guessing(bus)

"""Episode programs: how an episode's agents are arranged.

A program is `async def program(episode: Episode) -> AgentResult`. The single-agent program
lets the harness play the task; the recursive program lets agents spawn subagents. Programs
come from this registry, platoon's built-ins, or installed packages' `platoon.programs`
entry points.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from platoon import plugins
from platoon.bus import Bus
from platoon.bus.events import EpisodeRequested
from platoon.harness import AgentContext, AgentResult, Harness

__all__ = ["Episode", "Program", "ProgramError", "get_program", "program", "program_names"]

Program = Callable[["Episode"], Awaitable[AgentResult]]
P = TypeVar("P", bound=Program)

BUILTINS = {
    "single": "platoon.programs.single:single",
    "recursive": "platoon.programs.recursive:recursive",
}


class ProgramError(LookupError):
    """An unknown episode program."""


@dataclass
class Episode:
    """One episode as a program sees it: the request, its entry, the harness and the root agent."""

    bus: Bus
    request: EpisodeRequested
    entry: Any
    harness: Harness
    root: AgentContext
    options: dict[str, Any] = field(default_factory=dict)


_programs: dict[str, Program] = {}


def program(name: str) -> Callable[[P], P]:
    """Register an episode program under `name`."""

    def decorate(func: P) -> P:
        _programs[name] = func
        return func

    return decorate


def get_program(name: str) -> Program:
    if name in _programs:
        return _programs[name]
    ref = BUILTINS.get(name)
    try:
        obj = plugins.import_ref(ref) if ref else plugins.load("programs", name)
    except plugins.PluginError as exc:
        raise ProgramError(
            f"unknown episode program {name!r} (known: {', '.join(program_names())}); {exc}"
        ) from None
    _programs.setdefault(name, obj)
    return _programs[name]


def program_names() -> list[str]:
    return sorted({*_programs, *BUILTINS, *plugins.available("programs")})

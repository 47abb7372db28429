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

import msgspec

from platoon import plugins
from platoon.bus import Bus
from platoon.bus.events import EpisodeRequested
from platoon.harness import AgentContext, AgentResult, Harness
from platoon.naming import unknown_name

__all__ = [
    "Episode",
    "Program",
    "ProgramError",
    "get_program",
    "play_steps",
    "program",
    "program_names",
    "validate_program_options",
]

Program = Callable[["Episode"], Awaitable[AgentResult]]
P = TypeVar("P", bound=Program)

BUILTINS = {
    "single": "platoon.programs.single:single",
    "recursive": "platoon.programs.recursive:recursive",
    "compacting": "platoon.programs.compaction:compacting",
}


class ProgramError(LookupError):
    """An unknown episode program, or `program_options` it does not take."""


@dataclass
class Episode:
    """One episode as a program sees it: the request, its entry, the harness and the root agent.

    `options` are the entry's `program_options`, converted to the program's options type when
    it declares one.
    """

    bus: Bus
    request: EpisodeRequested
    entry: Any
    harness: Harness
    root: AgentContext
    options: Any = field(default_factory=dict)


_programs: dict[str, Program] = {}


async def play_steps(harness: Harness, ctx: AgentContext) -> AgentResult:
    """Let the harness play the task; on a multi-step task (`ctx.steps > 1`), once per step, each
    run with the next step's instruction, until the environment says the task is over or a run
    does not complete."""
    result = await harness.run(ctx)
    while ctx.steps > 1 and result.status == "completed" and await ctx.next_step() is not None:
        result = await harness.run(ctx)
    return result


def program(name: str, *, options: type | None = None) -> Callable[[P], P]:
    """Register an episode program under `name`. `options` is a msgspec Struct whose fields
    are the `program_options` it takes, checked before anything runs."""

    def decorate(func: P) -> P:
        func.options_type = options  # type: ignore[attr-defined]
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
        if ":" in name or ref:
            raise ProgramError(f"episode program {name!r}: {exc}") from None
        raise ProgramError(unknown_name("episode program", name, program_names())) from None
    _programs.setdefault(name, obj)
    return _programs[name]


def program_names() -> list[str]:
    return sorted({*_programs, *BUILTINS, *plugins.available("programs")})


def validate_program_options(name: str, options: dict[str, Any], path: str = "program_options") -> Any:
    """`options` converted to program `name`'s options type (as given when it declares none)."""
    kind = getattr(get_program(name), "options_type", None)
    if kind is None:
        return dict(options)
    try:
        return msgspec.convert(dict(options), kind, strict=False)
    except msgspec.ValidationError as exc:
        # msgspec says "Expected `int`, got `str` - at `$.compact_at_tokens`": name the config path.
        text, _, where = str(exc).partition(" - at `$")
        raise ProgramError(f"{path}{where.rstrip('`')}: {text.replace('`', '')} (program {name!r})") from None

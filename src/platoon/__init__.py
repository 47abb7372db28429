"""platoon: train LLM agents, and systems of agents, with reinforcement learning.

    import platoon as pt

    @pt.harness("my-agent")
    async def my_agent(ctx: pt.AgentContext) -> pt.AgentResult: ...

The names here are loaded on first use, so `import platoon` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from platoon import _openreward

__version__ = "0.2.0"

# ORS environments import the openreward SDK: quiet it, and let the anthropic, openai and
# google clients its `__init__` imports (2 s, for names an environment never uses) wait until
# something really uses them. Done here, so it holds before any environment module loads.
_openreward.quiet_sdk()
_openreward.defer_sdk_clients()

_EXPORTS = {
    "harness": "platoon.harness",
    "AgentContext": "platoon.harness",
    "AgentResult": "platoon.harness",
    "ToolResult": "platoon.harness",
    "ChatReply": "platoon.harness",
    "BudgetExhausted": "platoon.harness",
    "program": "platoon.programs",
    "Episode": "platoon.programs",
    "Bus": "platoon.bus",
    "Event": "platoon.bus",
    "register_event": "platoon.bus",
    "events": "platoon.bus",
    "load_config": "platoon.config",
    "run": "platoon.api",
}

__all__ = [
    "AgentContext",
    "AgentResult",
    "BudgetExhausted",
    "Bus",
    "ChatReply",
    "Episode",
    "Event",
    "ToolResult",
    "events",
    "harness",
    "load_config",
    "program",
    "register_event",
    "run",
]

if TYPE_CHECKING:
    from platoon.api import run
    from platoon.bus import Bus, Event, events, register_event
    from platoon.config import load_config
    from platoon.harness import AgentContext, AgentResult, BudgetExhausted, ChatReply, ToolResult, harness
    from platoon.programs import Episode, program


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'platoon' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

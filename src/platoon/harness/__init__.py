"""Harnesses: the agent code that plays an episode through an `AgentContext`."""

import sys
import types
from typing import Any

from platoon.harness.context import (
    AgentContext,
    AgentResult,
    Budget,
    BudgetExhausted,
    ChatError,
    ChatReply,
    ToolResult,
)
from platoon.harness.registry import (
    FunctionHarness,
    Harness,
    HarnessError,
    choose_harness,
    get_harness,
    harness,
    harness_names,
    validate_options,
)

__all__ = [
    "AgentContext",
    "AgentResult",
    "Budget",
    "BudgetExhausted",
    "ChatError",
    "ChatReply",
    "FunctionHarness",
    "Harness",
    "HarnessError",
    "ToolResult",
    "choose_harness",
    "get_harness",
    "harness",
    "harness_names",
    "validate_options",
]


class _HarnessModule(types.ModuleType):
    """`platoon.harness` is both this package and the `@pt.harness("name")` decorator.

    Once the package is imported, Python binds the name `harness` on `platoon` to the module,
    which would shadow the decorator; making the module callable keeps `pt.harness("name")`
    working whichever was looked up first.
    """

    def __call__(self, name: str, *, options: type | None = None) -> Any:
        return harness(name, options=options)


sys.modules[__name__].__class__ = _HarnessModule

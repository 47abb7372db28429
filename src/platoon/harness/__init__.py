"""Harnesses: the agent code that plays an episode through an `AgentContext`."""

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

"""`platoon-react`: the model calls the environment's tools until the episode is over.

Each turn the policy sees the conversation so far and the tools; every tool call it makes is
run (in order) and its result appended. The episode ends when the environment says so, when
the budget runs out, or, with `stop_on_text` (the default), when the model answers in plain
text, which becomes the final message.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from platoon.harness.context import AgentContext, AgentResult
from platoon.harness.registry import harness

__all__ = ["ReactOptions", "react"]

CONTINUE = "Continue: use the tools to finish the task."


class ReactOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    system_prompt: Annotated[str | None, msgspec.Meta(description="a system message before the task")] = None
    max_tool_output_chars: Annotated[
        int, msgspec.Meta(ge=1, description="longer tool results are cut to this many characters")
    ] = 8000
    stop_on_text: Annotated[
        bool, msgspec.Meta(description="end the episode when the model answers without a tool call")
    ] = True


@harness("platoon-react", options=ReactOptions)
async def react(ctx: AgentContext) -> AgentResult:
    """A tool-calling loop: the model calls the environment's tools until the episode is over."""
    options: ReactOptions = ctx.options or ReactOptions()
    tools = ctx.openai_tools()
    messages: list[dict[str, Any]] = []
    if options.system_prompt:
        messages.append({"role": "system", "content": options.system_prompt})
    messages.append({"role": "user", "content": ctx.instruction})
    while ctx.budget.remaining() > 0:
        reply = await ctx.chat(messages, tools=tools)
        messages.append({key: value for key, value in reply.message.items() if value is not None})
        if not reply.tool_calls:
            if options.stop_on_text:
                return AgentResult("completed", final_message=reply.text)
            messages.append({"role": "user", "content": CONTINUE})
            continue
        for call in reply.tool_calls:
            output, finished = await _run_call(ctx, call, options.max_tool_output_chars)
            messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": output})
            if finished:
                return AgentResult("completed", final_message=output)
    return AgentResult("limit", reason="out of model calls")


async def _run_call(ctx: AgentContext, call: dict[str, Any], limit: int) -> tuple[str, bool]:
    """Run one tool call; a malformed one is answered with an error the model can read."""
    result = await ctx.call_tool_call(call)
    return cut(result.as_text(), limit), result.finished


def cut(text: str, limit: int) -> str:
    """`text`, or its start and end around a note of how much was left out."""
    if len(text) <= limit:
        return text
    note = f"\n[... {len(text) - limit} characters cut ...]\n"
    head = limit // 2
    return text[:head] + note + text[len(text) - (limit - head) :]

"""`platoon-bash`: the model works in the task's sandbox through one `bash` tool.

The tool is the environment's `bash` (Harbor tasks have it: it runs in the task's sandbox);
an environment without one gets its own tools instead. The model calls tools until it
answers without a tool call, the environment says the episode is over (an agent time
limit), or the budget of model calls runs out.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from platoon.harness.context import AgentContext, AgentResult
from platoon.harness.registry import harness

__all__ = ["DEFAULT_SYSTEM_PROMPT", "BashOptions", "bash"]

DEFAULT_SYSTEM_PROMPT = (
    "You are working in a Linux sandbox. Use the bash tool to inspect files, run programs and "
    "write your results. Run one command at a time and read its output. When the task is done, "
    "reply with a short summary and no tool call."
)


class BashOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    system_prompt: Annotated[str, msgspec.Meta(description="the system message before the task")] = (
        DEFAULT_SYSTEM_PROMPT
    )
    max_output_chars: Annotated[
        int, msgspec.Meta(ge=1, description="longer command output is cut to this many characters")
    ] = 10_000
    command_timeout: Annotated[
        float, msgspec.Meta(gt=0, description="seconds a command may run unless the model asks otherwise")
    ] = 60.0


@harness("platoon-bash", options=BashOptions)
async def bash(ctx: AgentContext) -> AgentResult:
    """A tool-calling loop over the environment's bash tool (or its other tools without one)."""
    options: BashOptions = ctx.options or BashOptions()
    specs = await ctx.list_tools()
    tools = [t for t in ctx.openai_tools() if t["function"]["name"] == "bash"] or ctx.openai_tools()
    takes_timeout = any(t.name == "bash" and "timeout" in t.input_schema.get("properties", {}) for t in specs)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": options.system_prompt},
        {"role": "user", "content": ctx.instruction},
    ]
    while ctx.budget.remaining() > 0:
        reply = await ctx.chat(messages, tools=tools)
        messages.append({key: value for key, value in reply.message.items() if value is not None})
        if not reply.tool_calls:
            return AgentResult("completed", final_message=reply.text)
        for call in reply.tool_calls:
            output, finished = await _run_call(ctx, call, options, takes_timeout)
            messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": output})
            if finished:
                return AgentResult("completed", final_message=output)
    return AgentResult("limit", reason="out of model calls")


async def _run_call(
    ctx: AgentContext, call: dict[str, Any], options: BashOptions, takes_timeout: bool
) -> tuple[str, bool]:
    """Run one tool call; a malformed one is answered with an error the model can read."""
    name = (call.get("function") or {}).get("name", "")
    defaults = {"timeout": options.command_timeout} if name == "bash" and takes_timeout else {}
    result = await ctx.call_tool_call(call, **defaults)
    return _cut(result.as_text(), options.max_output_chars), result.finished


def _cut(text: str, limit: int) -> str:
    """`text`, or its start and end around a note of how much was left out."""
    if len(text) <= limit:
        return text
    note = f"\n[... {len(text) - limit} characters cut ...]\n"
    head = limit // 2
    return text[:head] + note + text[len(text) - (limit - head) :]

"""A root agent for the CPU demo (`cpu.yaml`): it delegates, so that a tiny random-init model's
run has subagents at all.

A random model never writes a `spawn_subagent` call, so on a laptop the recursive configs play
single agents. This root is a fixed program instead of a policy: it looks up a recipe of its
goal, fetches the base inputs itself and hands each crafted input to a `platoon-react` subagent
(the policy), then crafts the goal and finishes. The subagents are sampled, graded on their own
sub-targets (`child_reward: own`) and trained, with advantages taken per depth.
"""

from __future__ import annotations

import math
import re

import platoon as pt

GOAL = re.compile(r"^Craft (\d+) (.+?)\.$", re.M)
BASE = re.compile(r"^Base items: (.+)\.$", re.M)
RECIPE = re.compile(r"^- (.+) -> (\d+) (.+)$", re.M)


@pt.harness("rao-cpu-delegate")
async def delegate(ctx: pt.AgentContext) -> pt.AgentResult:
    goal, base = GOAL.search(ctx.instruction), BASE.search(ctx.instruction)
    if goal is None or base is None:
        return pt.AgentResult("error", reason="the instruction names no goal to delegate")
    count, target = int(goal.group(1)), goal.group(2)
    base_items = {b.strip() for b in base.group(1).split(",")}
    info = await ctx.call_tool("get_info", {"item": target})
    recipe = RECIPE.search(info.output)
    if recipe is None:
        return pt.AgentResult("error", reason=f"no recipe for {target}: {info.as_text()}")
    batches = math.ceil(count / int(recipe.group(2)))
    for part in recipe.group(1).split(" + "):
        n, item = part.split(" ", 1)
        needed = int(n) * batches
        if item in base_items:
            await ctx.call_tool("get_base", {"item": item, "count": needed})
        else:  # the policy's part: a subagent crafts it into the shared inventory
            await ctx.spawn(f"craft {needed} {item}", harness="platoon-react")
    await ctx.call_tool("craft", {"target": target, "count": count})
    done = await ctx.call_tool("finish", {})
    return pt.AgentResult("completed", final_message=done.as_text())

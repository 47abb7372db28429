"""The recursive program: agents that spawn subagents on subtasks, as in Recursive Agent
Optimization. Every agent is a model-call tree of its own, and all of them train from one
episode's outcome (and, as configured, their own grades).

An agent spawns through `ctx.spawn(instruction, tools=..., harness=...)` or, from a
tool-calling harness, the built-in `spawn_subagent` tool. The entry's `agents:` settings bound
the tree: `max_depth`, `max_children` spawns per episode, `max_concurrent_children`,
`child_max_steps` model calls per child, `child_timeout`, and `budget` (`shared`: the whole tree
draws on the episode's budget; `per_depth`: each depth has a budget of its own). A child's env
session forks its parent's as `fork` says (`shared` live state, a `copy`, or `fresh`); an
environment that defines subtasks gives the child a session on its own subtask.

A spawn never raises into its parent: a refused or failed one returns an `AgentResult` with
status `error` and a reason the parent (and its model) can read.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import anyio
import structlog

from platoon.bus import NoResponder, RequestTimeout
from platoon.bus.events import (
    AgentFinished,
    AgentOpened,
    AgentOpenRequested,
    AgentSpawned,
    Graded,
    GradeRequested,
    SessionOpened,
    SessionOpenRequested,
    ToolSpec,
    new_id,
)
from platoon.harness import AgentContext, AgentResult, Budget, BudgetExhausted, ToolResult, get_harness
from platoon.programs.registry import Episode, program

__all__ = ["SPAWN_TOOL", "AgentTree", "recursive"]

log = structlog.get_logger("platoon.programs")

SPAWN_TOOL = ToolSpec(
    name="spawn_subagent",
    description=(
        "Delegate a subtask to a subagent with the same tools. It works on its own and returns its "
        "final answer. Give it a complete, self-contained instruction."
    ),
    input_schema={
        "type": "object",
        "properties": {"instruction": {"type": "string", "description": "What the subagent must do."}},
        "required": ["instruction"],
    },
)


class _Defaults:
    max_depth = 1
    budget = "shared"
    fork = "shared"
    child_max_steps = 15
    child_timeout = None
    max_concurrent_children = 4
    max_children = 64
    child_reward = "root"


class AgentTree:
    """One episode's tree of agents: its limits, its counters, and how a child is born."""

    def __init__(self, episode: Episode) -> None:
        self.episode = episode
        agents = episode.entry.agents if episode.entry.agents is not None else _Defaults()
        self.settings = agents
        self.max_depth = agents.max_depth if agents.max_depth > 0 else _Defaults.max_depth
        self.limiter = anyio.CapacityLimiter(agents.max_concurrent_children)
        self.spawned = 0

    def equip(self, ctx: AgentContext) -> None:
        """Let `ctx`'s agent spawn children, if the depth limit allows it any."""
        if ctx.depth >= self.max_depth:
            return
        ctx._spawner = self.spawn

        async def spawn_tool(arguments: dict[str, Any]) -> ToolResult:
            instruction = arguments.get("instruction")
            if not isinstance(instruction, str) or not instruction.strip():
                return ToolResult(
                    name=SPAWN_TOOL.name, error="spawn_subagent needs an instruction (a string)"
                )
            result = await self.spawn(ctx, instruction)
            if result.status == "error" and result.reason:
                return ToolResult(name=SPAWN_TOOL.name, error=f"the subagent failed: {result.reason}")
            text = result.final_message or "(no final message)"
            return ToolResult(name=SPAWN_TOOL.name, output=f"Subagent finished ({result.status}): {text}")

        ctx.add_tool(SPAWN_TOOL, spawn_tool)

    async def spawn(
        self,
        parent: AgentContext,
        instruction: str,
        *,
        tools: list[str] | None = None,
        harness: str | None = None,
        max_steps: int | None = None,
    ) -> AgentResult:
        """Run a subagent of `parent` on `instruction` and return how it ended."""
        refusal = self._refusal(parent)
        if refusal is not None:
            return AgentResult("error", reason=f"spawn refused: {refusal}")
        self.spawned += 1
        async with self.limiter:
            try:
                child = await self._open(parent, instruction, tools, harness, max_steps)
            except _SpawnError as exc:
                return AgentResult("error", reason=f"spawn failed: {exc}")
            return await self._run(*child)

    def _refusal(self, parent: AgentContext) -> str | None:
        if parent.depth >= self.max_depth:
            return f"the depth limit ({self.max_depth}) is reached"
        if self.spawned >= self.settings.max_children:
            return f"the episode has spawned its {self.settings.max_children} subagents"
        if parent.budget.remaining() <= 0:
            return "the budget of model calls is used up"
        return None

    async def _open(
        self,
        parent: AgentContext,
        instruction: str,
        tools: list[str] | None,
        harness: str | None,
        max_steps: int | None,
    ) -> tuple[AgentContext, str]:
        bus, request = self.episode.bus, self.episode.request
        agent_id = new_id()
        depth = parent.depth + 1
        try:
            opened = await bus.request(
                SessionOpenRequested(
                    episode_id=request.episode_id,
                    agent_id=agent_id,
                    task=request.task,
                    fork_of=parent.agent_id,
                    fork=self.settings.fork,
                    instruction=instruction,
                ),
                timeout=parent.request_timeout,
            )
        except (NoResponder, RequestTimeout) as exc:
            raise _SpawnError(str(exc)) from None
        assert isinstance(opened, SessionOpened)
        if opened.error is not None:
            raise _SpawnError(opened.error)
        steps = max_steps or self.settings.child_max_steps
        per_depth = self.settings.budget == "per_depth"
        key = await bus.request(
            AgentOpenRequested(
                episode_id=request.episode_id,
                agent_id=agent_id,
                parent_id=parent.agent_id,
                depth=depth,
                budget_id=f"{request.episode_id}:depth{depth}" if per_depth else request.episode_id,
                max_model_calls=steps if per_depth else None,
                params=parent.params,
            ),
            timeout=parent.request_timeout,
        )
        assert isinstance(key, AgentOpened)
        name = harness or self.episode.harness.name
        await bus.publish(
            AgentSpawned(
                episode_id=request.episode_id,
                agent_id=agent_id,
                parent_id=parent.agent_id,
                depth=depth,
                harness=name,
                instruction=instruction,
            )
        )
        deadline = parent.budget.deadline
        if self.settings.child_timeout:
            child_deadline = time.monotonic() + self.settings.child_timeout
            deadline = min(deadline, child_deadline) if deadline else child_deadline
        ctx = AgentContext(
            bus=bus,
            task=request.task,
            episode_id=request.episode_id,
            agent_id=agent_id,
            instruction=instruction,
            tools=list(opened.tools),
            budget=Budget(steps, deadline=deadline),
            options=parent.options if harness is None else None,
            depth=depth,
            parent_id=parent.agent_id,
            gateway_url=key.base_url,
            api_key=key.key,
            params=parent.params,
            request_timeout=parent.request_timeout,
        )
        self.equip(ctx)
        if tools is not None:
            try:
                ctx.restrict_tools(tools)
            except ValueError as exc:
                raise _SpawnError(str(exc)) from None
        return ctx, name

    async def _run(self, ctx: AgentContext, name: str) -> AgentResult:
        timeout = self.settings.child_timeout
        try:
            with anyio.fail_after(timeout) if timeout else contextlib.nullcontext():
                result = await get_harness(name).run(ctx)
        except TimeoutError:
            result = AgentResult("timeout", reason=f"the subagent passed its {timeout} s timeout")
        except BudgetExhausted as exc:
            result = AgentResult("limit", reason=str(exc))
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True), anyio.move_on_after(1):
                await self._finished(ctx, AgentResult("error", reason="cancelled"), None, cancelled=True)
            raise
        except Exception as exc:
            result = AgentResult("error", reason=f"the subagent's harness raised {type(exc).__name__}: {exc}")
        reward = await self._own_grade(ctx) if self.settings.child_reward in ("own", "mix") else None
        await self._finished(ctx, result, reward)
        return result

    async def _own_grade(self, ctx: AgentContext) -> float | None:
        """The env's grade of the child's own session (its subtask), if the env gives one."""
        try:
            graded = await ctx.bus.request(
                GradeRequested(episode_id=ctx.episode_id, agent_id=ctx.agent_id, env=ctx.task.env),
                timeout=ctx.request_timeout,
            )
        except (NoResponder, RequestTimeout):
            return None
        assert isinstance(graded, Graded)
        return graded.reward if graded.error is None else None

    async def _finished(
        self, ctx: AgentContext, result: AgentResult, reward: float | None, *, cancelled: bool = False
    ) -> None:
        await ctx.bus.publish(
            AgentFinished(
                episode_id=ctx.episode_id,
                agent_id=ctx.agent_id,
                status="cancelled" if cancelled else result.status,
                final_message=result.final_message,
                reason=result.reason,
                reward=reward,
            )
        )


class _SpawnError(Exception):
    pass


@program("recursive")
async def recursive(episode: Episode) -> AgentResult:
    tree = AgentTree(episode)
    tree.equip(episode.root)
    return await episode.harness.run(episode.root)

"""The recursive program: agents that spawn subagents on subtasks, as in Recursive Agent
Optimization. Every agent is a model-call tree of its own, and all of them train from one
episode's outcome (and, as configured, their own grades).

An agent spawns through `ctx.spawn(instruction, tools=..., harness=..., max_steps=...)` or,
from a tool-calling harness, the built-in `spawn_subagent` tool. The entry's `agents:` settings
bound the tree: `max_depth`, `max_children` spawns per episode, `max_concurrent_children`
(children of one agent running at once), `child_max_steps` model calls per child, `child_timeout`, and `budget` (`shared`: the whole
tree draws on the episode's `max_steps`, each child at most `child_max_steps` of it;
`per_depth`: each depth below the root has a pool of `child_max_steps` calls of its own). A
child's env session forks its parent's as `fork` says (`shared` live state, a `copy`, or
`fresh`); an environment that defines subtasks gives the child a session on its own subtask.

A spawn never raises into its parent: a refused or failed one returns an `AgentResult` with
status `error` and a reason the parent (and its model) can read. Calls of `spawn_subagent` are
published as `ToolCalled`/`ToolReturned` with `env=""` (answered by platoon, not an env), so
the rollout tree and the event log show them.

`program_options: {compaction: {compact_at_tokens: N}}` gives every agent of the tree a
compacting context (see `platoon.harness.compaction`).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import anyio
import msgspec
import structlog

from platoon.bus import NoResponder, RequestTimeout
from platoon.bus.events import (
    AgentFinished,
    AgentOpenRequested,
    GradeRequested,
    SessionOpenRequested,
    ToolCalled,
    ToolReturned,
    ToolSpec,
    new_id,
)
from platoon.config.policies import DEFAULT_POLICY
from platoon.config.schema import AgentsConfig
from platoon.harness import (
    AgentContext,
    AgentResult,
    Budget,
    BudgetExhausted,
    Harness,
    HarnessError,
    ToolResult,
    get_harness,
    validate_options,
)
from platoon.harness.compaction import CompactingContext, CompactionOptions
from platoon.programs.agents import AgentOpenError, chosen_policy, open_agent, spawned
from platoon.programs.registry import Episode, play_steps, program

__all__ = ["LOCAL_ENV", "SPAWN_TOOL", "AgentTree", "RecursiveOptions", "recursive"]

log = structlog.get_logger("platoon.programs")

LOCAL_ENV = ""  # the `env` of tool calls that platoon answers itself; no entry has this name

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


class RecursiveOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The recursive program's `program_options`."""

    compaction: CompactionOptions | None = None


# The tree of an entry without `agents:`: the schema's defaults, but one level of children, since
# the program was chosen to have them.
_DEFAULT_AGENTS = AgentsConfig(max_depth=1)


class _ChildBudget(Budget):
    """A subagent's budget: what the gateway reports left (of the shared pool or its depth's),
    but never more than the calls of its own cap that it has not used."""

    def remaining(self) -> int:
        left = super().remaining()
        return left if self.max_steps is None else min(left, max(self.max_steps - self.used, 0))


class AgentTree:
    """One episode's tree of agents: its limits, its counters, and how a child is born."""

    def __init__(self, episode: Episode, compaction: CompactionOptions | None = None) -> None:
        self.episode = episode
        agents = episode.entry.agents if episode.entry.agents is not None else _DEFAULT_AGENTS
        self.settings = agents
        self.max_depth = agents.max_depth if agents.max_depth > 0 else _DEFAULT_AGENTS.max_depth
        self.compaction = compaction
        self.running: dict[str, anyio.Semaphore] = {}  # per parent: its children running now
        self.spawned = 0
        self.depth_left: dict[int, int] = {}  # per_depth: what the gateway last reported per depth

    def equip(self, ctx: AgentContext) -> AgentContext:
        """Let `ctx`'s agent spawn children; offer it the `spawn_subagent` tool if the depth
        limit allows it any. Returns the context the agent should run with."""
        if self.compaction is not None and not isinstance(ctx, CompactingContext):
            ctx = CompactingContext(ctx, self.compaction)
        ctx._spawner = self.spawn
        if ctx.depth >= self.max_depth:
            return ctx
        agent = ctx

        async def spawn_tool(arguments: dict[str, Any]) -> ToolResult:
            call = ToolCalled(
                episode_id=agent.episode_id,
                agent_id=agent.agent_id,
                env=LOCAL_ENV,
                name=SPAWN_TOOL.name,
                arguments=arguments,
            )
            await agent.bus.publish(call)
            started = time.perf_counter()
            result = await self._spawn_tool(agent, arguments)
            await agent.bus.publish(
                ToolReturned(
                    reply_to=call.request_id,
                    episode_id=agent.episode_id,
                    agent_id=agent.agent_id,
                    name=SPAWN_TOOL.name,
                    output=result.output,
                    error=result.error,
                    duration_s=time.perf_counter() - started,
                )
            )
            return result

        ctx.add_tool(SPAWN_TOOL, spawn_tool)
        return ctx

    async def _spawn_tool(self, parent: AgentContext, arguments: dict[str, Any]) -> ToolResult:
        instruction = arguments.get("instruction")
        if not isinstance(instruction, str) or not instruction.strip():
            return ToolResult(name=SPAWN_TOOL.name, error="spawn_subagent needs an instruction (a string)")
        result = await self.spawn(parent, instruction)
        if result.status != "completed":
            why = result.reason or "no reason given"
            return ToolResult(name=SPAWN_TOOL.name, error=f"the subagent ended ({result.status}): {why}")
        text = result.final_message or "(no final message)"
        return ToolResult(name=SPAWN_TOOL.name, output=f"Subagent finished: {text}")

    async def spawn(
        self,
        parent: AgentContext,
        instruction: str,
        *,
        tools: list[str] | None = None,
        harness: str | None = None,
        max_steps: int | None = None,
        role: str | None = None,
    ) -> AgentResult:
        """Run a subagent of `parent` on `instruction` and return how it ended. `role` names
        what it plays, for `agents.policy: {by: role}` (an unknown role is refused)."""
        refusal = self._refusal(parent)
        if refusal is not None:
            return AgentResult("error", reason=f"spawn refused: {refusal}")
        self.spawned += 1
        # Per parent, not per episode: a child waiting for its own children holds its slot, so
        # one episode-wide limit would deadlock a deep tree.
        slots = self.running.setdefault(
            parent.agent_id, anyio.Semaphore(self.settings.max_concurrent_children)
        )
        async with slots:
            try:
                ctx, chosen = await self._open(parent, instruction, tools, harness, max_steps, role)
            except AgentOpenError as exc:
                return AgentResult("error", reason=f"spawn failed: {exc}")
            result = await self._run(ctx, chosen)
        self._update_budgets(parent, ctx)
        return result

    def _refusal(self, parent: AgentContext) -> str | None:
        if parent.depth >= self.max_depth:
            return f"the depth limit ({self.max_depth}) is reached: an agent at depth {parent.depth} cannot spawn"
        if self.spawned >= self.settings.max_children:
            return f"the episode has spawned its {self.settings.max_children} subagents"
        if self.settings.budget == "per_depth":
            if self.depth_left.get(parent.depth + 1, 1) <= 0:
                return f"the budget of model calls at depth {parent.depth + 1} is used up"
        elif parent.budget.remaining() <= 0:
            return "the budget of model calls is used up"
        return None

    def _update_budgets(self, parent: AgentContext, child: AgentContext) -> None:
        """What the child last heard from the gateway about its pool is news to the tree."""
        reported = child.budget._reported
        if reported is None:
            return
        if self.settings.budget == "per_depth":
            self.depth_left[child.depth] = reported
        else:  # one pool: the parent's view of it is out of date by the child's calls
            parent.budget._reported = reported

    async def _open(
        self,
        parent: AgentContext,
        instruction: str,
        tools: list[str] | None,
        harness: str | None,
        max_steps: int | None,
        role: str | None = None,
    ) -> tuple[AgentContext, Harness]:
        bus, request = self.episode.bus, self.episode.request
        chosen, options = self._harness(parent, harness)
        agent_id = new_id()
        depth = parent.depth + 1
        policy = chosen_policy(
            self.settings.policy,
            depth=depth,
            harness=chosen.name,
            role=role,
            default=getattr(self.episode.entry, "default_policy", DEFAULT_POLICY),
        )
        steps = max_steps or self.settings.child_max_steps
        per_depth = self.settings.budget == "per_depth"
        session = SessionOpenRequested(
            episode_id=request.episode_id,
            agent_id=agent_id,
            task=request.task,
            fork_of=parent.agent_id,
            fork=self.settings.fork,
            instruction=instruction,
        )
        agent = AgentOpenRequested(
            episode_id=request.episode_id,
            agent_id=agent_id,
            parent_id=parent.agent_id,
            depth=depth,
            budget_id=f"{request.episode_id}:depth{depth}" if per_depth else request.episode_id,
            max_model_calls=steps if per_depth else None,
            # The entry's sampling settings (max tokens, temperature, stop), then the
            # parent's own overrides: a subagent samples as its root does.
            params={**self.episode.entry.params, **parent.params},
            policy_version=request.policy_versions.get(policy, request.policy_version),
            policy=policy,
            role=role or "",
            checks_tool_calls=getattr(chosen, "checks_tool_calls", False),
        )
        opened, key = await open_agent(bus, session, agent, timeout=parent.request_timeout)
        offered = list(opened.tools)
        if tools is not None:
            unknown = sorted(set(tools) - {t.name for t in offered} - {SPAWN_TOOL.name})
            if unknown:
                raise AgentOpenError(f"unknown tools {', '.join(unknown)}")
        await bus.publish(spawned(agent, harness=chosen.name, instruction=instruction))
        deadline = parent.budget.deadline
        if self.settings.child_timeout:
            child_deadline = time.monotonic() + self.settings.child_timeout
            deadline = min(deadline, child_deadline) if deadline else child_deadline
        ctx = AgentContext(
            bus=bus,
            task=request.task,
            episode_id=request.episode_id,
            agent_id=agent_id,
            instruction=opened.instruction or instruction,
            tools=offered,
            budget=_ChildBudget(steps, deadline=deadline),
            options=options,
            depth=depth,
            parent_id=parent.agent_id,
            gateway_url=key.base_url,
            api_key=key.key,
            params=parent.params,
            request_timeout=parent.request_timeout,
            env_faults=parent.env_faults,
            on_env_fault=parent.on_env_fault,
        )
        ctx = self.equip(ctx)
        if tools is not None:  # they name env tools: spawning stays as the depth limit allows
            ctx.restrict_tools([t.name for t in ctx._tools if t.name in tools or t.name == SPAWN_TOOL.name])
        return ctx, chosen

    def _harness(self, parent: AgentContext, name: str | None) -> tuple[Harness, Any]:
        """The child's harness and options: the parent's, or `name` with its default options."""
        if name is None:
            return self.episode.harness, parent.options
        try:
            chosen = get_harness(name)
            return chosen, validate_options(chosen, {}, f"the options of harness {name!r}")
        except (HarnessError, ValueError, OSError) as exc:
            raise AgentOpenError(str(exc)) from None

    async def _run(self, ctx: AgentContext, harness: Harness) -> AgentResult:
        timeout = self.settings.child_timeout
        try:
            with anyio.fail_after(timeout) if timeout else contextlib.nullcontext():
                result = await harness.run(ctx)
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


@program("recursive", options=RecursiveOptions)
async def recursive(episode: Episode) -> AgentResult:
    options = episode.options if isinstance(episode.options, RecursiveOptions) else RecursiveOptions()
    tree = AgentTree(episode, options.compaction)
    return await play_steps(episode.harness, tree.equip(episode.root))

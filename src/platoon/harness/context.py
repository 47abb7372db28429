"""What a harness sees: `AgentContext`, and what it returns: `AgentResult`.

A function harness is `async def my_harness(ctx: AgentContext) -> AgentResult`. Everything
it does goes through the context: `chat` samples the policy (through the gateway, which
records the exact tokens), `call_tool` runs one of the environment's tools, `budget` says how
many model calls are left. The context talks to the rest of platoon over the bus only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import anyio.lowlevel
import msgspec

from platoon.bus import Bus
from platoon.bus.chat import MessageReader, message_dict
from platoon.bus.events import (
    ChatRequested,
    StepRequested,
    TaskRef,
    ToolCalled,
    ToolSpec,
)

__all__ = [
    "AgentContext",
    "AgentResult",
    "Budget",
    "BudgetExhausted",
    "ChatError",
    "ChatReply",
    "ToolResult",
]

ResultStatus = Literal["completed", "limit", "timeout", "error"]


class BudgetExhausted(Exception):
    """The episode's budget of model calls or tokens (or the context window) is used up."""


class ChatError(Exception):
    """The gateway could not answer a chat call (bad request, sampler failure)."""


class AgentResult(msgspec.Struct, frozen=True):
    """How an agent ended: `completed`, `limit` (out of budget), `timeout` or `error`."""

    status: ResultStatus = "completed"
    final_message: str | None = None
    reason: str | None = None


class ToolResult(msgspec.Struct, frozen=True, kw_only=True):
    """A tool's answer. `finished` means the environment considers the episode over."""

    name: str
    output: str = ""
    reward: float | None = None
    finished: bool = False
    error: str | None = None

    def as_text(self) -> str:
        return f"Error: {self.error}" if self.error else self.output


class ChatReply(msgspec.Struct, frozen=True, kw_only=True):
    """The assistant message as an OpenAI-style dict, with shortcuts to its parts."""

    message: dict[str, Any]
    call_id: str
    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    parse_errors: list[str] = msgspec.field(default_factory=list)

    @property
    def text(self) -> str:
        content = self.message.get("content")
        return content if isinstance(content, str) else ""

    @property
    def reasoning(self) -> str | None:
        return self.message.get("reasoning_content")

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.message.get("tool_calls") or []


class Budget:
    """Model calls left to this agent, as the gateway last reported them."""

    def __init__(self, max_steps: int | None, *, deadline: float | None = None) -> None:
        self.max_steps = max_steps
        self.used = 0
        self.deadline = deadline
        self._reported: int | None = None

    def remaining(self) -> int:
        """Calls left (a large number when unlimited, 0 when the episode's time is up)."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return 0
        if self._reported is not None:
            return self._reported
        if self.max_steps is None:
            return 2**31
        return max(self.max_steps - self.used, 0)

    def _record(self, reported: int | None) -> None:
        self.used += 1
        self._reported = reported

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)


class AgentContext:
    """Everything a harness may use. Built by the episode runner, one per agent."""

    def __init__(
        self,
        *,
        bus: Bus,
        task: TaskRef,
        episode_id: str,
        agent_id: str,
        instruction: str,
        tools: list[ToolSpec],
        budget: Budget,
        options: Any = None,
        depth: int = 0,
        parent_id: str | None = None,
        gateway_url: str | None = None,
        api_key: str = "",
        params: dict[str, Any] | None = None,
        request_timeout: float | None = None,
        spawner: Callable[..., Awaitable[AgentResult]] | None = None,
        env_faults: list[str] | None = None,
        on_env_fault: Callable[[], None] | None = None,
        steps: int = 1,
    ) -> None:
        self.bus = bus
        self.task = task
        self.episode_id = episode_id
        self.agent_id = agent_id
        self.instruction = instruction
        self.budget = budget
        self.options = options
        self.depth = depth
        self.parent_id = parent_id
        self.gateway_url = gateway_url
        self.api_key = api_key
        self.params = dict(params or {})
        self.request_timeout = request_timeout
        # The environment's failures in this episode (shared with subagents): they make the
        # episode an error, however the agent carries on.
        self.env_faults = env_faults if env_faults is not None else []
        # Called on the first: the runner ends the episode there, instead of letting the agent call
        # a dead environment for every step it has left.
        self.on_env_fault = on_env_fault
        self.steps = steps  # a multi-step task's steps, played in turn (see `next_step`)
        self._tools = list(tools)
        self._sent = MessageReader()  # the messages of its last call, read
        self._spawner = spawner
        self._local: dict[str, Callable[[dict[str, Any]], Awaitable[ToolResult]]] = {}

    def add_tool(self, spec: ToolSpec, handler: Callable[[dict[str, Any]], Awaitable[ToolResult]]) -> None:
        """Give this agent a tool that platoon answers itself (such as `spawn_subagent`)."""
        self._tools = [t for t in self._tools if t.name != spec.name] + [spec]
        self._local[spec.name] = handler

    def restrict_tools(self, names: list[str]) -> None:
        """Keep only the named tools (a parent may give a subagent fewer tools than it has)."""
        unknown = sorted(set(names) - {t.name for t in self._tools})
        if unknown:
            raise ValueError(f"unknown tools {', '.join(unknown)}")
        self._tools = [t for t in self._tools if t.name in names]
        self._local = {n: h for n, h in self._local.items() if n in names}

    async def list_tools(self) -> list[ToolSpec]:
        return list(self._tools)

    def openai_tools(self) -> list[dict[str, Any]]:
        """The tools as OpenAI `tools=[...]` entries."""
        return [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
            }
            for t in self._tools
        ]

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> ToolResult:
        """Run a tool of the environment. Errors come back in `ToolResult.error`, not raised."""
        local = self._local.get(name)
        if local is not None:
            return await local(arguments or {})
        reply = await self.bus.request(
            ToolCalled(
                episode_id=self.episode_id,
                agent_id=self.agent_id,
                env=self.task.env,
                name=name,
                arguments=arguments or {},
            ),
            timeout=self.request_timeout,
        )
        if reply.env_fault:
            self.env_faults.append(reply.error or f"tool {name} failed")
            if self.on_env_fault is not None:
                self.on_env_fault()
                await anyio.lowlevel.checkpoint()  # the episode ends here, before the agent goes on
        return ToolResult(
            name=name, output=reply.output, reward=reply.reward, finished=reply.finished, error=reply.error
        )

    async def call_tool_call(self, call: Mapping[str, Any], **defaults: object) -> ToolResult:
        """Run a tool call as a chat reply carries it (`{"function": {"name", "arguments"}}`).

        Arguments that are not a JSON object come back as an error result the model can read,
        not as an exception. `defaults` fill arguments the call left out.
        """
        function = call.get("function") or {}
        name = function.get("name", "")
        raw = function.get("arguments") or "{}"
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError as exc:
            return ToolResult(name=name, error=f"the arguments of {name} are not valid JSON ({exc})")
        if not isinstance(arguments, dict):
            return ToolResult(name=name, error=f"the arguments of {name} must be a JSON object")
        return await self.call_tool(name, {**defaults, **arguments})

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        kind: Literal["policy", "aux", "judge"] = "policy",
        **params: Any,
    ) -> ChatReply:
        """Sample the policy on OpenAI-style messages; the call is recorded for training.

        Each message is read as a `platoon.bus.chat.ChatMessage`: keys other than its fields
        are dropped (they never reached the prompt). Raises `BudgetExhausted` when the episode
        has no model calls (or context) left and `ChatError` when the gateway cannot answer or
        a message does not fit (naming it and its field).
        """
        try:
            typed = self._sent.read(messages)
        except ValueError as exc:
            raise ChatError(str(exc)) from None
        reply = await self.bus.request(
            ChatRequested(
                episode_id=self.episode_id,
                agent_id=self.agent_id,
                messages=typed,
                tools=tools,
                params={**self.params, **params},
                kind=kind,
            ),
            timeout=self.request_timeout,
        )
        if reply.error is not None:
            if reply.error_kind in ("budget", "context_length"):
                self.budget._reported = 0
                raise BudgetExhausted(reply.error)
            raise ChatError(reply.error)
        if kind == "policy":
            self.budget._record(reply.budget_remaining)
        return ChatReply(
            message=message_dict(reply.message),
            call_id=reply.call_id,
            finish_reason=reply.finish_reason,
            prompt_tokens=reply.prompt_tokens,
            completion_tokens=reply.completion_tokens,
            parse_errors=reply.parse_errors,
        )

    async def next_step(self) -> str | None:
        """Done with this step of a multi-step task: the environment verifies it and begins the
        next, whose instruction becomes this context's (returned); None when the task is over.
        The programs call it between harness runs; a failure is the environment's."""
        reply = await self.bus.request(
            StepRequested(episode_id=self.episode_id, agent_id=self.agent_id, env=self.task.env),
            timeout=None,  # the step's verifier and the next step's setup have limits of their own
        )
        if reply.error is not None:
            self.env_faults.append(reply.error)
            return None
        if reply.instruction is not None:
            self.instruction = reply.instruction
        return reply.instruction

    async def spawn(self, instruction: str, **options: object) -> AgentResult:
        """Run a subagent on `instruction` and return its result (recursive programs only)."""
        if self._spawner is None:
            return AgentResult("error", reason="this episode's program does not spawn subagents")
        return await self._spawner(self, instruction, **options)

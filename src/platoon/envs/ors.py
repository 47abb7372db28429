"""`service: python://module:Class`: an ORS `Environment` class, run in this process.

Sessions go through the `openreward` SDK's own machinery: the class is built with
`task_spec=` and `secrets=` as the SDK's server builds it, `setup()` runs before the session
is handed out and `teardown()` when it closes, the tools and their JSON schemas come from
`list_tools()` (class toolsets and per-task tools included, the `@terminal` tool marked as
terminal), and calls are dispatched, validated and latched after `finished=True` by the SDK.

Two optional class attributes speak to platoon: `platoon_reward = "sum"` grades a session by
the sum of its rewards instead of the reward that finished it, and a `configure(**options)`
classmethod takes a config's `service_kwargs: {options: {...}}`.

The SDK itself is asyncio-only; under trio this backend runs environments whose tools are
`async def` (a plain-function tool would need the SDK's `asyncio.to_thread`).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping
from typing import Any, Literal

import anyio

from platoon.bus.events import ToolSpec
from platoon.envs._sdk import (
    Environment,
    RewardTracker,
    blocks_text,
    call_user,
    is_environment_class,
    on_asyncio,
    task_infos,
    terminal_spec,
    tool_spec,
)
from platoon.envs.service import EnvError, Grade, TaskInfo, ToolError, ToolResult
from platoon.plugins import PluginError, import_ref

__all__ = ["OrsBackend", "OrsSession"]


class OrsBackend:
    """Tasks and sessions of one ORS `Environment` class, in process.

    `reward` chooses how a session is graded (`final` or `sum`, see `RewardTracker`); the
    default is the class's `platoon_reward` attribute, else `final`. `options` are passed to
    the class's `configure(**options)` classmethod, which returns the class to serve.
    """

    def __init__(
        self,
        env_cls: type[Environment],
        *,
        reward: Literal["final", "sum"] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        if not is_environment_class(env_cls):
            raise EnvError(f"{env_cls!r} is not an openreward Environment class")
        if options:
            env_cls = _configure(env_cls, options)
        self.env_cls = env_cls
        self.reward: str = reward or str(getattr(env_cls, "platoon_reward", "final"))
        RewardTracker(self.reward)  # validates the mode now rather than at the first grade
        _check_surface(env_cls)

    @classmethod
    def from_ref(cls, ref: str, **kwargs: Any) -> OrsBackend:
        """The backend for `module:Class` (the part after `python://`)."""
        try:
            env_cls = import_ref(ref)
        except PluginError as exc:
            raise EnvError(str(exc)) from exc
        return cls(env_cls, **kwargs)

    async def list_splits(self) -> list[str]:
        splits = await call_user(self.env_cls.list_splits)
        return [split if isinstance(split, str) else split.name for split in splits]

    async def list_tasks(self, split: str) -> list[TaskInfo]:
        splits = await self.list_splits()
        if split not in splits:
            raise EnvError(f"unknown split {split!r} (splits: {', '.join(splits)})")
        return task_infos(split, await call_user(self.env_cls.list_tasks, split))

    async def open(self, task: TaskInfo, secrets: Mapping[str, str]) -> OrsSession:
        return await OrsSession.start(self.env_cls, task.spec, secrets, reward=self.reward)

    async def aclose(self) -> None:
        return None


class OrsSession:
    """One instance of the environment class: one task, set up, until `close()`."""

    def __init__(
        self,
        env: Environment,
        *,
        spec: Mapping[str, Any],
        secrets: Mapping[str, str],
        instruction: str,
        tools: list[ToolSpec],
        reward: str,
    ) -> None:
        self.env = env
        self.spec = dict(spec)
        self.secrets = dict(secrets)
        self.instruction = instruction
        self.tools = tools
        self.reward = reward
        self._tracker = RewardTracker(reward)
        self._closed = False
        self._terminated: str | None = None  # why no more tools run (one raised)

    @classmethod
    async def start(
        cls, env_cls: type[Environment], spec: Mapping[str, Any], secrets: Mapping[str, str], *, reward: str
    ) -> OrsSession:
        """Build the environment for `spec`, run its `setup()`, read its prompt and tools."""
        name = env_cls.__name__
        try:
            if env_cls.__init__ is Environment.__init__:
                env = env_cls(task_spec=dict(spec), secrets=dict(secrets))
            else:  # user code may be slow: keep it off the event loop, as the SDK's server does
                env = await call_user(env_cls, task_spec=dict(spec), secrets=dict(secrets))
        except Exception as exc:
            raise EnvError(f"{name}(task_spec=...) failed: {type(exc).__name__}: {exc}") from exc
        try:
            await _run_hook(env, "setup")
            try:
                instruction = blocks_text(await call_user(env.get_prompt))
                tools = await _session_tools(env)
            except Exception as exc:
                raise EnvError(
                    f"{name}: reading the prompt and tools failed: {type(exc).__name__}: {exc}"
                ) from exc
        except BaseException:
            with anyio.CancelScope(shield=True):
                await _teardown_quietly(env)
            raise
        return cls(env, spec=spec, secrets=secrets, instruction=instruction, tools=tools, reward=reward)

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if self._closed:
            raise EnvError("the session has closed")
        if not on_asyncio() and _is_sync_tool(self.env, name):
            raise EnvError(
                f"tool {name} is a plain function, which the openreward SDK runs with asyncio.to_thread: "
                "run platoon under asyncio for this environment"
            )
        if self._terminated is not None:
            raise EnvError(f"the session was terminated: {self._terminated}")
        try:
            outcome = (await self.env._call_tool(name, arguments)).root
        except Exception as exc:
            # The ORS contract: a tool handles its own retries, and an exception that escapes it
            # ends the rollout (the openreward client marks such a session dead), so a class
            # behaves the same in process as behind a server.
            self._terminated = f"tool {name} raised {type(exc).__name__}: {exc}"
            raise
        if not outcome.ok:
            if outcome.reason == "input_validation":
                raise ToolError(f"bad arguments for tool {name}: {outcome.error}")
            raise ToolError(outcome.error)
        output = outcome.output
        self._tracker.see(output.reward, output.finished)
        return ToolResult(output=blocks_text(output.blocks), reward=output.reward, finished=output.finished)

    async def grade(self) -> Grade:
        """The tracked reward; where there is none and the environment defines `grade()`
        (a platoon convention, for subtask sessions that never call a finishing tool), its
        value."""
        grade = self._tracker.grade()
        hook = getattr(self.env, "grade", None)
        unfinished = self._tracker.mode == "final" and not self._tracker.finished
        if (grade.reward is None or unfinished) and callable(hook):
            try:
                value = await call_user(hook)
            except Exception as exc:
                return Grade(
                    reward=None,
                    reason=f"{type(self.env).__name__}.grade() raised {type(exc).__name__}: {exc}",
                )
            return Grade(reward=float(value), reason=grade.reason)
        return grade

    @property
    def has_subtasks(self) -> bool:
        """Whether the environment can give a subagent a subtask (`child_task_spec`)."""
        return callable(getattr(self.env, "child_task_spec", None))

    async def subtask(self, instruction: str, mode: str) -> OrsSession:
        """A session on the subtask `instruction` names, for a subagent: the environment's
        `child_task_spec(instruction, mode=mode)` gives its task spec (with `shared`, it may
        share live state, such as an inventory, with this session)."""
        try:
            spec = await call_user(self.env.child_task_spec, instruction, mode=mode)
        except Exception as exc:
            raise EnvError(f"no subtask for {instruction!r}: {exc}") from exc
        return await OrsSession.start(type(self.env), spec, self.secrets, reward=self.reward)

    async def fork(self, mode: Literal["fresh", "copy"]) -> OrsSession:
        """`fresh`: a new instance of the same task, set up anew. `copy`: a deep copy of this
        instance's state (no second `setup()`), graded on its own rewards from here on."""
        if mode == "fresh":
            return await OrsSession.start(type(self.env), self.spec, self.secrets, reward=self.reward)
        if mode != "copy":
            raise EnvError(f"unknown fork mode {mode!r}")
        # The SDK's per-session asyncio locks must not be copied (a used lock holds its loop):
        # mapping them to None in the memo gives the copy fresh ones, created on first use.
        memo: dict[int, Any] = {}
        for attr in ("_tool_locks", "_exclusive_gate"):
            if attr in vars(self.env):
                memo[id(vars(self.env)[attr])] = None
        try:
            env = copy.deepcopy(self.env, memo)
        except Exception as exc:
            raise EnvError(
                f"{type(self.env).__name__} sessions cannot be copied ({type(exc).__name__}: {exc}); "
                "fork them 'fresh' or 'shared'"
            ) from exc
        return OrsSession(
            env,
            spec=self.spec,
            secrets=self.secrets,
            instruction=self.instruction,
            tools=list(self.tools),
            reward=self.reward,
        )

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await _run_hook(self.env, "teardown")


def _configure(env_cls: type[Environment], options: Mapping[str, Any]) -> type[Environment]:
    configure = getattr(env_cls, "configure", None)
    if not callable(configure):
        raise EnvError(f"{env_cls.__name__} takes no options (it has no configure() classmethod)")
    try:
        configured = configure(**options)
    except (TypeError, ValueError) as exc:
        raise EnvError(f"bad options for {env_cls.__name__}: {exc}") from exc
    if not is_environment_class(configured):
        raise EnvError(f"{env_cls.__name__}.configure() must return an Environment class, got {configured!r}")
    return configured


def _check_surface(env_cls: type[Environment]) -> None:
    """What the SDK's server checks at start-up, checked here before any episode runs."""
    name = env_cls.__name__
    try:
        listed = env_cls.list_tools()
    except Exception as exc:
        raise EnvError(f"{name}: invalid tools: {exc}") from exc
    if not listed.tools and listed.terminal_tool is None:
        raise EnvError(f"{name} has no tools: add at least one @tool method")
    if env_cls.get_prompt is Environment.get_prompt and env_cls.get_messages is Environment.get_messages:
        raise EnvError(f"{name} implements neither get_prompt() nor get_messages()")


async def _session_tools(env: Environment) -> list[ToolSpec]:
    listed = env.list_tools()
    tools = list(listed.tools)
    if type(env).list_task_tools is not Environment.list_task_tools:
        tools += list((await call_user(env.list_task_tools)).tools)
    term = listed.terminal_tool
    specs = [tool_spec(tool) for tool in tools if term is None or tool.name != term.name]
    if term is not None:
        specs.append(terminal_spec(term))
    return specs


async def _run_hook(env: Environment, name: str) -> None:
    if getattr(type(env), name) is getattr(Environment, name):
        return  # the base class's no-op: skip the thread hop
    try:
        await call_user(getattr(env, name))
    except Exception as exc:
        raise EnvError(f"{type(env).__name__}.{name}() failed: {type(exc).__name__}: {exc}") from exc


async def _teardown_quietly(env: Environment) -> None:
    try:
        await _run_hook(env, "teardown")
    except EnvError:
        pass  # the error that made us tear down is the one to report


def _is_sync_tool(env: Environment, name: str) -> bool:
    owners = [env, *getattr(type(env), "toolsets", ())]
    for owner in owners:
        fn = getattr(owner, name, None)
        if fn is not None and getattr(fn, "_env_tool", False):
            return not inspect.iscoroutinefunction(inspect.unwrap(fn))
    return False

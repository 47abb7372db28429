"""The env service: one bus component per environment entry of a config.

An `EnvService` answers the requests of the episode runner and the grader for the entry whose
name it carries, over a small backend protocol (`EnvBackend` / `EnvSession`) that in-process
ORS classes, ORS servers and Harbor datasets each implement:

    TasksRequested       -> TasksListed
    SessionOpenRequested -> SessionOpened     (a subagent's session forks its parent's)
    ToolCalled           -> ToolReturned
    AgentProcessRequested -> AgentProcessExited (a command-line agent run in the session's sandbox)
    GradeRequested       -> Graded
    EpisodeFinished      -> a tool still running for the episode is stopped
    StepRequested        -> StepStarted       (a multi-step task's next step, after the last is verified)
    EpisodeGraded        -> every session of that episode is closed

A backend with an `async prepare()` (a verifiers environment's venv) has it awaited before the
service answers anything. Requests run concurrently, one task each, but the calls to one live session run one at a time
in the order they arrived. Nothing raises into the bus: a failure becomes the reply's `error`.
Every session that is opened is closed, on the episode's grade, on shutdown or cancellation.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from contextlib import AsyncExitStack
from typing import Any, Literal, Protocol, runtime_checkable

import anyio
import msgspec
import msgspec.structs
import structlog

from platoon.bus import Bus, BusClosed, ComponentBase
from platoon.bus.events import (
    AgentProcessExited,
    AgentProcessRequested,
    EpisodeFinished,
    EpisodeGraded,
    Event,
    Graded,
    GradeRequested,
    Reply,
    SessionOpened,
    SessionOpenRequested,
    StepRequested,
    StepStarted,
    TaskRef,
    TasksListed,
    TasksRequested,
    ToolCalled,
    ToolReturned,
    ToolSpec,
)

__all__ = [
    "EnvBackend",
    "EnvError",
    "EnvService",
    "EnvSession",
    "Grade",
    "TaskInfo",
    "ToolError",
    "ToolResult",
]

log = structlog.get_logger("platoon.envs")

# How many graded episode ids to remember, so a session whose opening finishes after its
# episode was graded is closed at once instead of being left open.
_GRADED_MEMORY = 10_000


class EnvError(Exception):
    """An environment could not do what was asked; the message says why."""


class ToolError(EnvError):
    """A tool call the environment refused: unknown tool, bad arguments, episode over."""


class TaskInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One task of a backend: `spec` is what the backend needs to open it."""

    split: str
    task_id: str
    index: int
    spec: dict[str, Any] = msgspec.field(default_factory=dict)


class ToolResult(msgspec.Struct, frozen=True, kw_only=True):
    output: str
    reward: float | None = None
    finished: bool = False


class Grade(msgspec.Struct, frozen=True, kw_only=True):
    """A session's grade; `reward is None` with a `reason` when it cannot be graded."""

    reward: float | None
    rewards: dict[str, float] = msgspec.field(default_factory=dict)
    reason: str | None = None


@runtime_checkable
class EnvSession(Protocol):
    """One live session of one task, played by one agent (or shared by several)."""

    instruction: str
    tools: list[ToolSpec]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Run a tool. Raise `ToolError` when the call is refused; any other exception is a crash."""
        ...

    async def grade(self) -> Grade: ...

    async def fork(self, mode: Literal["fresh", "copy"]) -> EnvSession:
        """A new session for a subagent: `fresh` opens the same task anew, `copy` deep-copies
        this one's state. Raise `EnvError` for a mode the backend cannot do."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class SubtaskSession(EnvSession, Protocol):
    """A session whose environment can give a subagent a subtask of its own (ORS's
    `child_task_spec`): `has_subtasks` says whether this one can."""

    @property
    def has_subtasks(self) -> bool: ...

    async def subtask(self, instruction: str, mode: str) -> EnvSession: ...


@runtime_checkable
class EnvBackend(Protocol):
    """Where an env service's tasks and sessions come from."""

    async def list_splits(self) -> list[str]: ...

    async def list_tasks(self, split: str) -> list[TaskInfo]: ...

    async def open(self, task: TaskInfo, secrets: Mapping[str, str]) -> EnvSession: ...

    async def aclose(self) -> None:
        """Release what the backend holds (clients, caches); its sessions are closed first."""
        ...


class _Slot:
    """A live session and the queue that runs its calls one at a time, in arrival order.

    Each queued operation waits for the `done` event of the one queued before it. The queue
    position is taken synchronously when the request arrives, so the order does not depend
    on how the event loop schedules the tasks that carry the requests out.
    """

    __slots__ = ("calls", "closed", "ended", "session", "subtask", "tail", "task", "tool_names")

    def __init__(self, session: EnvSession, task: TaskInfo, *, subtask: bool = False) -> None:
        self.session = session
        self.task = task
        self.subtask = subtask  # a subagent's own subtask: its instruction is the env's prompt
        self.tool_names = {tool.name for tool in session.tools}
        self.tail: anyio.Event | None = None
        self.calls: dict[anyio.CancelScope, str] = {}  # tool calls running now -> their agent
        self.ended: set[str] = set()  # agents graded: done, so a tool of theirs still running is moot
        self.closed = False

    def enqueue(self) -> tuple[anyio.Event | None, anyio.Event]:
        previous, self.tail = self.tail, anyio.Event()
        return previous, self.tail


class EnvService(ComponentBase):
    """The bus component for one environment entry (see the module docstring).

    `tool_timeout` bounds one tool call, `open_timeout` the opening of a session (setup
    included), `close_timeout` its closing; None means no limit. `secrets` are handed to
    every session the backend opens: a mapping of names to values, or a list of names whose
    values are read from the process environment when a session opens.
    """

    # It subscribes when it starts (`run` with `task_status`), not in `attach`.
    subscribes = (
        TasksRequested,
        SessionOpenRequested,
        ToolCalled,
        AgentProcessRequested,
        GradeRequested,
        EpisodeFinished,
        StepRequested,
        EpisodeGraded,
    )
    publishes = (TasksListed, SessionOpened, ToolReturned, AgentProcessExited, Graded, StepStarted)

    def __init__(
        self,
        name: str,
        backend: EnvBackend,
        *,
        secrets: Mapping[str, str] | Iterable[str] | None = None,
        tool_timeout: float | None = 120.0,
        open_timeout: float | None = 600.0,
        close_timeout: float = 60.0,
        tool_errors: Literal["env", "agent"] = "env",
    ) -> None:
        self.name = name
        self.backend = backend
        self.tool_timeout = tool_timeout
        if tool_errors not in ("env", "agent"):
            raise EnvError(f"tool_errors must be 'env' or 'agent', got {tool_errors!r}")
        self.tool_errors = tool_errors
        self.open_timeout = open_timeout
        self.close_timeout = close_timeout
        self._secrets = secrets
        self._bus: Bus | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._slots: dict[tuple[str, str], _Slot] = {}
        self._by_episode: dict[str, set[str]] = {}
        self._graded: OrderedDict[str, None] = OrderedDict()
        self._live: set[EnvSession] = set()
        self._closing: set[EnvSession] = set()
        self._splits: list[str] | None = None
        self._tasks: dict[str, tuple[list[TaskInfo], dict[str, TaskInfo]]] = {}
        self._task_locks: dict[str, anyio.Lock] = {}

    @property
    def open_sessions(self) -> int:
        """Sessions opened and not yet fully closed (a shared session counts once)."""
        return len(self._live) + len(self._closing)

    # --- the component ------------------------------------------------------------------------

    async def run(
        self, bus: Bus, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve requests until the bus shuts down or this task is cancelled.

        `await task_group.start(service.run, bus)` returns once the service is subscribed.
        """
        self._bus = bus
        handlers: list[tuple[type[Event], Callable[[Any], None]]] = [
            (TasksRequested, self._on_tasks),
            (SessionOpenRequested, self._on_open),
            (ToolCalled, self._on_call),
            (AgentProcessRequested, self._on_agent_process),
            (GradeRequested, self._on_grade),
            (EpisodeFinished, self._on_episode_finished),
            (StepRequested, self._on_step),
            (EpisodeGraded, self._on_episode_graded),
        ]
        try:
            async with AsyncExitStack() as stack, anyio.create_task_group() as tg:
                self._tg = tg
                streams = [
                    await stack.enter_async_context(bus.stream(kind, name=f"env:{self.name}:{kind.__name__}"))
                    for kind, _ in handlers
                ]
                await self._prepare()
                task_status.started()
                for stream, (_, handle) in zip(streams, handlers, strict=True):
                    tg.start_soon(self._pump, stream, handle)
        finally:
            self._tg = None
            with anyio.CancelScope(shield=True):
                await self._close_all()

    async def _prepare(self) -> None:
        """A backend's `prepare()` (a venv to build: minutes, once) runs before the service answers
        anything, so no request's clock runs meanwhile; its failure is the answer to the requests
        that follow (the backend keeps it), never an exception into the bus."""
        prepare = getattr(self.backend, "prepare", None)
        if prepare is None:
            return
        try:
            await prepare()
        except EnvError as exc:
            log.warning("environment not ready", env=self.name, error=str(exc))

    async def _pump(self, stream: Any, handle: Callable[[Any], None]) -> None:
        async for event in stream:
            try:
                handle(event)
            except Exception as exc:  # a bug here must not stop the other requests
                log.exception("env service dispatch failed", env=self.name, error=str(exc))
        # The stream ends when the bus shuts down: stop everything else too.
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    def _spawn(self, func: Callable[..., Any], *args: Any) -> None:
        assert self._tg is not None
        self._tg.start_soon(func, *args)

    async def _reply(self, event: Reply) -> None:
        assert self._bus is not None
        try:
            await self._bus.publish(event)
        except BusClosed:
            log.warning("reply dropped: the bus has closed", env=self.name, reply=type(event).__name__)

    # --- dispatch (synchronous, in arrival order) ---------------------------------------------

    def _on_tasks(self, req: TasksRequested) -> None:
        if req.env == self.name:
            self._spawn(self._list_tasks, req)

    def _on_open(self, req: SessionOpenRequested) -> None:
        if req.task.env != self.name:
            return
        if req.fork_of is None:
            self._spawn(self._open, req)
            return
        parent = self._slots.get((req.episode_id, req.fork_of))
        if parent is None:
            error = f"cannot fork: agent {req.fork_of} of episode {req.episode_id} has no open session"
            self._spawn(self._reply, SessionOpened(reply_to=req.request_id, error=error))
            return
        self._spawn(self._fork, req, parent, *parent.enqueue())

    def _on_call(self, req: ToolCalled) -> None:
        if req.env != self.name:
            return
        slot = self._slots.get((req.episode_id, req.agent_id))
        if slot is None:
            reply = ToolReturned(
                reply_to=req.request_id,
                episode_id=req.episode_id,
                agent_id=req.agent_id,
                name=req.name,
                error=self._no_session(req.episode_id, req.agent_id),
            )
            self._spawn(self._reply, reply)
            return
        self._spawn(self._call, req, slot, *slot.enqueue())

    def _on_agent_process(self, req: AgentProcessRequested) -> None:
        if req.env != self.name:
            return
        slot = self._slots.get((req.episode_id, req.agent_id))
        if slot is None:
            error = self._no_session(req.episode_id, req.agent_id)
            self._spawn(self._reply, AgentProcessExited(reply_to=req.request_id, error=error))
        elif not callable(getattr(slot.session, "run_agent", None)):
            error = f"environment {self.name} has no sandbox to run an agent in"
            self._spawn(
                self._reply, AgentProcessExited(reply_to=req.request_id, error=error, unsupported=True)
            )
        else:
            # Not queued behind the session's tool calls: the agent runs beside them, for as long
            # as its episode; the agent's grade (or the session closing) ends it.
            self._spawn(self._agent_process, req, slot)

    def _on_grade(self, req: GradeRequested) -> None:
        if req.env != self.name:
            return
        slot = self._slots.get((req.episode_id, req.agent_id))
        if slot is None:
            reason = self._no_session(req.episode_id, req.agent_id)
            self._spawn(self._reply, Graded(reply_to=req.request_id, error=reason, reason=reason))
            return
        # The agent is done (the episode ended, perhaps by its timeout): a tool call still
        # running would only hold up the grade, for as long as the tool timeout.
        slot.ended.add(req.agent_id)  # a shared (forked) session serves other agents too
        for scope, agent in list(slot.calls.items()):
            if agent == req.agent_id:
                scope.cancel()
        self._spawn(self._grade, req, slot, *slot.enqueue())

    def _on_episode_finished(self, event: EpisodeFinished) -> None:
        """The episode is over (done, timed out, failed): a tool still running for any of its
        agents has nobody left to answer, and its session must not wait on it to grade or close."""
        for agent_id in self._by_episode.get(event.episode_id, ()):
            slot = self._slots.get((event.episode_id, agent_id))
            if slot is None:
                continue
            slot.ended.add(agent_id)
            for scope, agent in list(slot.calls.items()):
                if agent == agent_id:
                    scope.cancel()

    def _on_step(self, req: StepRequested) -> None:
        if req.env != self.name:
            return
        slot = self._slots.get((req.episode_id, req.agent_id))
        if slot is None:
            error = self._no_session(req.episode_id, req.agent_id)
            self._spawn(self._reply, StepStarted(reply_to=req.request_id, error=error))
            return
        self._spawn(self._step, req, slot, *slot.enqueue())

    def _on_episode_graded(self, event: EpisodeGraded) -> None:
        self._graded[event.episode_id] = None
        if len(self._graded) > _GRADED_MEMORY:
            self._graded.popitem(last=False)
        slots: dict[int, _Slot] = {}
        for agent_id in self._by_episode.pop(event.episode_id, ()):
            slot = self._slots.pop((event.episode_id, agent_id))
            slots[id(slot)] = slot  # a shared session is closed once
        for slot in slots.values():
            slot.closed = True
            self._spawn(self._close_slot, slot, *slot.enqueue())

    @staticmethod
    def _no_session(episode_id: str, agent_id: str) -> str:
        return f"no open env session for agent {agent_id} of episode {episode_id}"

    # --- requests -----------------------------------------------------------------------------

    async def _list_tasks(self, req: TasksRequested) -> None:
        try:
            tasks, _ = await self._split_tasks(req.split)
            refs = [TaskRef(env=self.name, split=t.split, task_id=t.task_id, index=t.index) for t in tasks]
            reply = TasksListed(reply_to=req.request_id, tasks=refs)
        except Exception as exc:
            reply = TasksListed(reply_to=req.request_id, error=_describe(exc))
        await self._reply(reply)

    async def _open(self, req: SessionOpenRequested) -> None:
        try:
            task = await self._resolve(req.task)
            with anyio.fail_after(self.open_timeout):
                session = await self.backend.open(task, self._resolve_secrets())
        except TimeoutError:
            error = f"opening task {req.task.split}:{req.task.task_id} timed out after {self.open_timeout:g}s"
            await self._reply(SessionOpened(reply_to=req.request_id, error=error))
            return
        except Exception as exc:
            await self._reply(SessionOpened(reply_to=req.request_id, error=_describe(exc)))
            return
        # No checkpoint between the backend handing the session over and tracking it, so
        # a cancellation cannot lose it.
        self._live.add(session)
        await self._register(req, _Slot(session, task))

    async def _fork(
        self, req: SessionOpenRequested, parent: _Slot, previous: anyio.Event | None, done: anyio.Event
    ) -> None:
        slot: _Slot | None = None
        error: str | None = None
        try:
            if previous is not None:
                await previous.wait()
            if parent.closed:
                error = f"cannot fork: the session of agent {req.fork_of} has closed"
            elif (
                req.instruction and isinstance(parent.session, SubtaskSession) and parent.session.has_subtasks
            ):
                with anyio.fail_after(self.open_timeout):
                    session = await parent.session.subtask(req.instruction, req.fork)
                self._live.add(session)
                slot = _Slot(session, parent.task, subtask=True)
            elif req.fork == "shared":
                slot = parent
            else:
                with anyio.fail_after(self.open_timeout):
                    session = await parent.session.fork(req.fork)
                self._live.add(session)
                slot = _Slot(session, parent.task)
        except TimeoutError:
            error = f"forking ({req.fork}) the session of agent {req.fork_of} timed out after {self.open_timeout:g}s"
        except Exception as exc:
            error = _describe(exc)
        finally:
            done.set()
        if slot is None:
            await self._reply(SessionOpened(reply_to=req.request_id, error=error))
        else:
            await self._register(req, slot, owned=slot is not parent)

    async def _register(self, req: SessionOpenRequested, slot: _Slot, *, owned: bool = True) -> None:
        """Give the agent its session, or close it (when `owned`) if the agent cannot have it."""
        key = (req.episode_id, req.agent_id)
        error = None
        if req.episode_id in self._graded:
            error = f"episode {req.episode_id} was graded before its session opened"
        elif key in self._slots:
            error = f"agent {req.agent_id} of episode {req.episode_id} already has a session"
        if error is not None:
            if owned:
                await self._close_session(slot.session)
            await self._reply(SessionOpened(reply_to=req.request_id, error=error))
            return
        self._slots[key] = slot
        self._by_episode.setdefault(req.episode_id, set()).add(req.agent_id)
        use_own = slot.subtask or req.instruction is None
        instruction = slot.session.instruction if use_own or req.instruction is None else req.instruction
        steps = getattr(slot.session, "step_count", 1)
        await self._reply(
            SessionOpened(
                reply_to=req.request_id, instruction=instruction, tools=list(slot.session.tools), steps=steps
            )
        )

    async def _call(
        self, req: ToolCalled, slot: _Slot, previous: anyio.Event | None, done: anyio.Event
    ) -> None:
        result: ToolResult | None = None
        error: str | None = None
        env_fault = False
        duration = 0.0
        try:
            if previous is not None:
                await previous.wait()
            start = time.perf_counter()
            if slot.closed:
                error = f"the env session of agent {req.agent_id} has closed"
            elif req.agent_id in slot.ended:
                error = f"tool {req.name} was not run: the agent's episode has ended"
            elif req.name not in slot.tool_names:
                error = f"unknown tool {req.name!r} (tools: {', '.join(sorted(slot.tool_names)) or 'none'})"
            else:
                with anyio.move_on_after(self.tool_timeout) as scope:
                    slot.calls[scope] = req.agent_id
                    try:
                        result = await slot.session.call_tool(req.name, dict(req.arguments))
                    finally:
                        slot.calls.pop(scope, None)
                if scope.cancelled_caught and req.agent_id in slot.ended:
                    result, error = None, f"tool {req.name} was stopped: the agent's episode ended first"
                elif scope.cancelled_caught:
                    result, error = None, f"tool {req.name} timed out after {self.tool_timeout:g}s"
                    env_fault = True
            duration = time.perf_counter() - start
        except ToolError as exc:  # the tool refused the call: the agent's doing
            error = str(exc)
        except EnvError as exc:  # a failure the backend already explained
            error = str(exc)
            env_fault = True
        except Exception as exc:  # the environment broke
            error = f"tool {req.name} failed: {_describe(exc)}"
            env_fault = True
        finally:
            done.set()
        reply = ToolReturned(
            reply_to=req.request_id,
            episode_id=req.episode_id,
            agent_id=req.agent_id,
            name=req.name,
            output=result.output if result is not None else "",
            reward=result.reward if result is not None else None,
            finished=result.finished if result is not None else False,
            error=error,
            duration_s=duration,
            env_fault=env_fault and self.tool_errors == "env",
        )
        await self._reply(reply)

    async def _step(
        self, req: StepRequested, slot: _Slot, previous: anyio.Event | None, done: anyio.Event
    ) -> None:
        """Verify the step the agent played and begin the next (a session without steps has none)."""
        instruction: str | None = None
        error: str | None = None
        try:
            if previous is not None:
                await previous.wait()
            next_step = getattr(slot.session, "next_step", None)
            if slot.closed or req.agent_id in slot.ended:
                error = "the agent's episode has ended"
            elif next_step is not None:
                instruction = await next_step()
        except Exception as exc:
            error = f"the next step failed: {_describe(exc)}"
        finally:
            done.set()
        await self._reply(StepStarted(reply_to=req.request_id, instruction=instruction, error=error))

    async def _agent_process(self, req: AgentProcessRequested, slot: _Slot) -> None:
        start = time.perf_counter()
        reply: AgentProcessExited | None = None
        with anyio.CancelScope() as scope:
            slot.calls[scope] = req.agent_id
            try:
                if slot.closed or req.agent_id in slot.ended:
                    reply = AgentProcessExited(reply_to=req.request_id, error="the agent's episode has ended")
                else:
                    reply = await slot.session.run_agent(req)  # type: ignore[attr-defined]
            except Exception as exc:
                reply = AgentProcessExited(
                    reply_to=req.request_id, error=f"running the agent failed: {_describe(exc)}"
                )
            finally:
                slot.calls.pop(scope, None)
        if reply is None:
            reply = AgentProcessExited(
                reply_to=req.request_id, error="the agent was stopped: its episode ended"
            )
        reply = msgspec.structs.replace(
            reply, reply_to=req.request_id, duration_s=time.perf_counter() - start
        )
        await self._reply(reply)

    async def _grade(
        self, req: GradeRequested, slot: _Slot, previous: anyio.Event | None, done: anyio.Event
    ) -> None:
        try:
            if previous is not None:
                await previous.wait()
            if slot.closed:
                reason = f"the env session of agent {req.agent_id} has closed"
                reply = Graded(reply_to=req.request_id, error=reason, reason=reason)
            else:
                files = await _read_files(slot.session, req.files) if req.files else {}
                grade = await slot.session.grade()
                reply = Graded(
                    reply_to=req.request_id,
                    reward=grade.reward,
                    rewards=dict(grade.rewards),
                    reason=grade.reason,
                    task=dict(slot.task.spec) if req.with_task else None,
                    files=files,
                )
        except Exception as exc:
            reason = f"grading failed: {_describe(exc)}"
            reply = Graded(reply_to=req.request_id, error=reason, reason=reason)
        finally:
            done.set()
        await self._reply(reply)

    # --- closing ------------------------------------------------------------------------------

    async def _close_slot(self, slot: _Slot, previous: anyio.Event | None, done: anyio.Event) -> None:
        try:
            if previous is not None:
                await previous.wait()
        finally:
            await self._close_session(slot.session)
            done.set()

    async def _close_session(self, session: EnvSession) -> None:
        if session not in self._live:
            return
        self._live.discard(session)
        self._closing.add(session)
        try:
            with anyio.move_on_after(self.close_timeout, shield=True) as scope:
                await session.close()
            if scope.cancelled_caught:
                log.warning("closing an env session timed out", env=self.name, timeout=self.close_timeout)
        except Exception as exc:
            log.warning("closing an env session failed", env=self.name, error=_describe(exc))
        finally:
            self._closing.discard(session)

    async def _close_all(self) -> None:
        self._slots.clear()
        self._by_episode.clear()
        async with anyio.create_task_group() as tg:
            for session in list(self._live):
                tg.start_soon(self._close_session, session)
        try:
            with anyio.move_on_after(self.close_timeout):
                await self.backend.aclose()
        except Exception as exc:
            log.warning("closing the env backend failed", env=self.name, error=_describe(exc))

    # --- tasks and secrets --------------------------------------------------------------------

    async def _split_tasks(self, split: str) -> tuple[list[TaskInfo], dict[str, TaskInfo]]:
        cached = self._tasks.get(split)
        if cached is not None:
            return cached
        lock = self._task_locks.setdefault(split, anyio.Lock())
        async with lock:
            if split not in self._tasks:
                if self._splits is None:
                    self._splits = list(await self.backend.list_splits())
                if split not in self._splits:
                    raise EnvError(f"unknown split {split!r} (splits: {', '.join(self._splits) or 'none'})")
                tasks = list(await self.backend.list_tasks(split))
                self._tasks[split] = (tasks, {t.task_id: t for t in tasks})
        return self._tasks[split]

    async def _resolve(self, ref: TaskRef) -> TaskInfo:
        tasks, by_id = await self._split_tasks(ref.split)
        if ref.index is not None and 0 <= ref.index < len(tasks) and tasks[ref.index].task_id == ref.task_id:
            return tasks[ref.index]
        task = by_id.get(ref.task_id)
        if task is None:
            raise EnvError(f"unknown task {ref.task_id!r} in split {ref.split!r} of {self.name}")
        return task

    def _resolve_secrets(self) -> dict[str, str]:
        if self._secrets is None:
            return {}
        if isinstance(self._secrets, Mapping):
            return {str(k): str(v) for k, v in self._secrets.items()}
        missing = [name for name in self._secrets if name not in os.environ]
        if missing:
            raise EnvError(f"secrets not set in the environment: {', '.join(missing)}")
        return {name: os.environ[name] for name in self._secrets}


def _describe(exc: BaseException) -> str:
    """An error message for a reply: ours as they are, anything else with its type."""
    if isinstance(exc, EnvError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


FILE_CHARS = 65_536


async def _read_files(session: Any, paths: list[str]) -> dict[str, str]:
    """The files a judge's rubric names, read from the session before it is graded (the agent's
    work as it left it). A session without `read_file` (no sandbox) answers why for each."""
    reader = getattr(session, "read_file", None)
    out: dict[str, str] = {}
    for path in paths:
        if reader is None:
            out[path] = "[this environment has no files to read]"
            continue
        try:
            text = await reader(path)
        except Exception as exc:
            out[path] = f"[could not read {path}: {_describe(exc)}]"
            continue
        out[path] = text if len(text) <= FILE_CHARS else text[:FILE_CHARS] + "\n[... cut ...]"
    return out

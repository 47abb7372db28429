"""Helpers for the env service tests: a scripted backend, and running a service on a bus."""

from __future__ import annotations

import copy
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.lowlevel

from platoon.bus import Bus
from platoon.bus.events import (
    SessionOpened,
    SessionOpenRequested,
    TaskRef,
    ToolCalled,
    ToolReturned,
    ToolSpec,
)
from platoon.envs import EnvError, EnvService, Grade, TaskInfo, ToolError, ToolResult


class ScriptedSession:
    """A session whose tools do what their names say; `log` records the calls in order."""

    tools = [
        ToolSpec(name="echo"),
        ToolSpec(name="add"),
        ToolSpec(name="nap"),
        ToolSpec(name="hang"),
        ToolSpec(name="boom"),
        ToolSpec(name="refuse"),
        ToolSpec(name="finish", terminal=True),
    ]

    def __init__(self, backend: ScriptedBackend, task: TaskInfo, total: int = 0) -> None:
        self.backend = backend
        self.task = task
        self.instruction = f"solve {task.task_id}"
        self.total = total
        self.reward: float | None = None
        backend.live.add(self)

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        self.backend.log.append((self.task.task_id, name, dict(arguments)))
        if name == "echo":
            return ToolResult(output=str(arguments.get("text", "")))
        if name == "add":
            self.total += int(arguments["n"])
            return ToolResult(output=str(self.total))
        if name == "nap":
            await anyio.sleep(float(arguments["seconds"]))
            return ToolResult(output=f"slept {arguments['seconds']}")
        if name == "hang":
            await anyio.sleep_forever()
        if name == "boom":
            raise RuntimeError("kaboom")
        if name == "refuse":
            raise ToolError("bad arguments for tool refuse: nope")
        self.reward = float(self.total)
        return ToolResult(output="done", reward=self.reward, finished=True)

    async def grade(self) -> Grade:
        if self.reward is None:
            return Grade(reward=None, reason="not finished")
        return Grade(reward=self.reward, rewards={"total": float(self.total)})

    async def fork(self, mode: str) -> ScriptedSession:
        if mode == "fresh":
            return await self.backend.open(self.task, {})
        if self.backend.copyable:
            return ScriptedSession(self.backend, self.task, total=copy.deepcopy(self.total))
        raise EnvError("this backend cannot copy sessions")

    async def close(self) -> None:
        await anyio.lowlevel.checkpoint()
        self.backend.live.discard(self)
        self.backend.closed += 1


class ScriptedBackend:
    """Tasks `t0`..`t4` of split `train`; task `fail` raises on open, `slow` takes 0.3 s."""

    def __init__(self, *, copyable: bool = True) -> None:
        self.copyable = copyable
        self.live: set[ScriptedSession] = set()
        self.closed = 0
        self.log: list[tuple[str, str, dict[str, Any]]] = []
        self.secrets: list[Mapping[str, str]] = []
        self.backend_closed = False

    async def list_splits(self) -> list[str]:
        return ["train"]

    async def list_tasks(self, split: str) -> list[TaskInfo]:
        ids = ["t0", "t1", "t2", "t3", "t4", "fail", "slow"]
        return [TaskInfo(split=split, task_id=task_id, index=i) for i, task_id in enumerate(ids)]

    async def open(self, task: TaskInfo, secrets: Mapping[str, str]) -> ScriptedSession:
        self.secrets.append(dict(secrets))
        if task.task_id == "fail":
            raise EnvError("the sandbox would not start")
        if task.task_id == "slow":
            await anyio.sleep(0.3)
        return ScriptedSession(self, task)

    async def aclose(self) -> None:
        self.backend_closed = True


@asynccontextmanager
async def serving(service: EnvService) -> AsyncIterator[Bus]:
    """A bus with `service` running on it; the service is cancelled on the way out."""
    async with Bus() as bus, anyio.create_task_group() as tg:
        await tg.start(service.run, bus)
        try:
            yield bus
        finally:
            tg.cancel_scope.cancel()


async def open_session(
    bus: Bus,
    env: str,
    task_id: str,
    *,
    episode: str = "ep",
    agent: str = "root",
    split: str = "train",
    **kw: Any,
) -> SessionOpened:
    task = TaskRef(env=env, split=split, task_id=task_id)
    req = SessionOpenRequested(episode_id=episode, agent_id=agent, task=task, **kw)
    reply = await bus.request(req, timeout=10)
    assert isinstance(reply, SessionOpened)
    return reply


async def call_tool(
    bus: Bus,
    env: str,
    name: str,
    arguments: dict[str, Any] | None = None,
    *,
    episode: str = "ep",
    agent: str = "root",
) -> ToolReturned:
    req = ToolCalled(episode_id=episode, agent_id=agent, env=env, name=name, arguments=arguments or {})
    reply = await bus.request(req, timeout=10)
    assert isinstance(reply, ToolReturned)
    return reply


async def wait_until(predicate: Any, timeout: float = 5.0) -> None:
    """Poll state that other code changes (env classes, a server's sessions) without an event."""
    with anyio.fail_after(timeout):
        while not predicate():  # noqa: ASYNC110
            await anyio.sleep(0.01)


@asynccontextmanager
async def sdk_server(*classes: type) -> AsyncIterator[str]:
    """The openreward SDK's own `Server` on a free loopback port (uvicorn, in this loop)."""
    import uvicorn
    from openreward.environments import Server
    from sse_starlette.sse import AppStatus

    # sse-starlette keeps one process-wide event, bound to the first loop that waits on it:
    # each test has its own loop, so each server needs a fresh one.
    AppStatus.should_exit_event = None
    app = Server(list(classes)).app
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: server.serve(sockets=[sock]))
        with anyio.fail_after(10):
            while not server.started:  # noqa: ASYNC110 - uvicorn offers no event
                await anyio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
    sock.close()

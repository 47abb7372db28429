"""`service: http://host:port[/EnvName]`: an ORS environment server, over the ORS HTTP protocol.

Sessions go through the `openreward` client (`AsyncEnvironmentsAPI.get(name, base_url=...)`,
the object `AsyncOpenReward().environments` is), so any server that speaks ORS works: the
SDK's own `Server`, platoon's `platoon env serve`, or a hosted one. A path names one of the
server's environments; without one the server's first (default) environment is used.

The client is built on aiohttp, so this backend needs asyncio.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from openreward.api.environments.client import AsyncEnvironment, AsyncEnvironmentsAPI, AsyncSession
from openreward.api.environments.types import Task
from openreward.api.errors import ToolCallError

from platoon.envs._sdk import RewardTracker, blocks_text, on_asyncio, task_infos, terminal_spec, tool_spec
from platoon.envs.service import EnvError, Grade, TaskInfo, ToolError, ToolResult
from platoon.serving import published_key_for

__all__ = ["RemoteBackend", "RemoteSession"]


class RemoteBackend:
    """Tasks and sessions of one environment on an ORS server.

    `api_key` is sent as the server's `X-API-Key` (default: the key this user's `platoon env
    serve` published for a server on loopback, else `$OPENREWARD_API_KEY`, else none). `reward` chooses how sessions are graded (`final` or `sum`, see `RewardTracker`).
    """

    def __init__(
        self, url: str, *, api_key: str | None = None, reward: Literal["final", "sum"] = "final"
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise EnvError(f"an ORS server URL looks like http://host:port[/EnvName], not {url!r}")
        segments = [s for s in parts.path.split("/") if s]
        if len(segments) > 1:
            raise EnvError(f"an ORS server URL names at most one environment: {url!r}")
        self.url = url
        self.base_url = f"{parts.scheme}://{parts.netloc}"
        self.variant = segments[0] if segments else None
        published = published_key_for(self.base_url)
        self.api_key = api_key or published or os.environ.get("OPENREWARD_API_KEY") or None
        self.reward = reward
        RewardTracker(reward)
        self._api: AsyncEnvironmentsAPI | None = None
        self._env: AsyncEnvironment | None = None
        self._environment_names: dict[str, str] = {}

    def _environment(self) -> AsyncEnvironment:
        if not on_asyncio():
            raise EnvError("ORS servers are reached with the openreward client, which needs asyncio")
        if self._env is None:
            # Built lazily: the client's aiohttp sessions belong to the running event loop.
            self._api = AsyncEnvironmentsAPI(base_url=self.base_url, api_key=self.api_key)
            self._env = self._api.get(self.variant or "default", variant=self.variant, base_url=self.base_url)
        return self._env

    async def list_splits(self) -> list[str]:
        try:
            return list(await self._environment().list_splits())
        except EnvError:
            raise
        except Exception as exc:
            raise EnvError(f"listing the splits of {self.url} failed: {_describe(exc)}") from exc

    async def list_tasks(self, split: str) -> list[TaskInfo]:
        splits = await self.list_splits()
        if split not in splits:
            raise EnvError(f"unknown split {split!r} (splits: {', '.join(splits)})")
        try:
            tasks = await self._environment().list_tasks(split)
        except Exception as exc:
            raise EnvError(f"listing the tasks of {self.url} failed: {_describe(exc)}") from exc
        if tasks:
            self._environment_names[split] = tasks[0].environment_name
        return task_infos(split, [task.task_spec for task in tasks])

    async def open(self, task: TaskInfo, secrets: Mapping[str, str]) -> RemoteSession:
        env = self._environment()
        ors_task = Task(
            server_name=env.server,
            environment_name=self._environment_names.get(task.split, self.variant or ""),
            task_spec=task.spec,
            namespace=env.namespace,
        )
        # A plain string secret must be one of the SDK's well-known names; a (value, domains)
        # pair may have any name. The domains only matter to hosted sandboxes.
        session = env.session(task=ors_task, secrets={k: (v, []) for k, v in secrets.items()} or None)
        return await RemoteSession.start(self, task, secrets, session)

    async def aclose(self) -> None:
        if self._api is not None:
            api, self._api, self._env = self._api, None, None
            await api.aclose()


class RemoteSession:
    """One session on the server, kept alive by the client's pings until `close()`."""

    def __init__(
        self,
        backend: RemoteBackend,
        task: TaskInfo,
        secrets: Mapping[str, str],
        session: AsyncSession,
        instruction: str,
        tools: list[Any],
    ) -> None:
        self.backend = backend
        self.task = task
        self.secrets = dict(secrets)
        self.session = session
        self.instruction = instruction
        self.tools = tools
        self._tracker = RewardTracker(backend.reward)
        self._closed = False
        self._died: Exception | None = None  # what ended the session on the server's side

    @classmethod
    async def start(
        cls, backend: RemoteBackend, task: TaskInfo, secrets: Mapping[str, str], session: AsyncSession
    ) -> RemoteSession:
        entered = False
        try:
            await session.__aenter__()
            entered = True
            instruction = blocks_text(await session.get_prompt())
            tools = [tool_spec(t) for t in await session.list_tools()]
            term = await session.terminal_tool()
        except BaseException as exc:
            if entered:
                await _exit_quietly(session)
            if isinstance(exc, Exception):
                raise EnvError(f"opening a session on {backend.url} failed: {_describe(exc)}") from exc
            raise
        if term is not None:
            tools = [t for t in tools if t.name != term.name] + [terminal_spec(term)]
        return cls(backend, task, secrets, session, instruction, tools)

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if self._closed:
            raise EnvError("the session has closed")
        if self._died is not None:
            # Not the SDK's call: on a dead session it drops the request coroutine it was handed
            # unawaited ('coroutine resumable_sse was never awaited') before raising this again.
            raise EnvError(f"the session was terminated: {self._died}") from self._died
        try:
            output = await self.session.call_tool(name, arguments)
        except ToolCallError as exc:
            if exc.reason == "input_validation":
                raise ToolError(f"bad arguments for tool {name}: {exc.detail}") from exc
            raise ToolError(str(exc.detail)) from exc
        except Exception as exc:
            self._died = exc
            raise
        self._tracker.see(output.reward, output.finished)
        return ToolResult(output=blocks_text(output.blocks), reward=output.reward, finished=output.finished)

    async def grade(self) -> Grade:
        return self._tracker.grade()

    async def fork(self, mode: Literal["fresh", "copy"]) -> RemoteSession:
        if mode != "fresh":
            raise EnvError(
                f"a session on an ORS server cannot be forked {mode!r}: fork it 'fresh' or 'shared'"
            )
        return await self.backend.open(self.task, self.secrets)

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await _exit_quietly(self.session)


async def _exit_quietly(session: AsyncSession) -> None:
    try:
        await session.__aexit__(None, None, None)
    except Exception:
        pass  # the client already swallows its delete errors; this is the same


def _describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, EnvError) else f"{type(exc).__name__}: {exc}"

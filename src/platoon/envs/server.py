"""platoon's own ORS environment server (`platoon env serve module:Class --port N`).

It serves ORS `Environment` classes over the ORS HTTP protocol, the one the `openreward`
client and the SDK's own `Server` speak, on starlette and hypercorn:

    GET  /health  /version  /list_environments
    POST /create_session (SSE: the new sid)  /create  /ping  /delete  /delete_session
    GET  /[env/]splits  /[env/]tools
    POST /[env/]tasks  /[env/]num_tasks  /[env/]task  /[env/]task_range
    GET  /[env/]prompt  /[env/]messages  /[env/]task_tools       (X-Session-ID)
    POST /[env/]call (SSE: task_id, then the RunToolOutput JSON in chunks, or an error)

A path without an environment segment goes to the first environment. `/create` builds the
instance and starts its `setup()` in the background; calls wait for it, and after
`setup_wait` seconds answer 503 with `X-Backend-State: starting` so the client retries.
A session that is not pinged for `session_ttl` seconds is torn down, and so is every
session when the server stops. Group scoring (`/score_group`) is not served.
"""

from __future__ import annotations

import argparse
import base64
import functools
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypeVar

import anyio
import hypercorn.config
import structlog
from openreward.environments import CreateSession, Split, ToolCall
from openreward.environments.session import list_session_tools
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from platoon.envs._sdk import Environment, call_user, is_environment_class, on_asyncio
from platoon.envs.service import EnvError
from platoon.plugins import PluginError, import_ref
from platoon.serving import (
    Guard,
    ServingError,
    bind_socket,
    hypercorn_config,
    new_key,
    published_key,
    require_key,
)

__all__ = ["EnvServer", "main", "running_env_server", "serve_env"]

log = structlog.get_logger("platoon.envs.server")

T = TypeVar("T")
# What a route answers: a response of its own, or a JSON value sent as one.
Reply = Response | Mapping[str, object] | Sequence[object]

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_CHUNK = 4096
_PING_EVERY = 10.0
_RESULT_LINGER = 60.0


class HTTPError(Exception):
    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers


class _Served:
    """One session: its environment instance and the state of its `setup()`."""

    def __init__(self, env: Environment) -> None:
        self.env = env
        self.ready = anyio.Event()
        self.error: BaseException | None = None
        self.last_ping = time.monotonic()
        self.setup_scope = anyio.CancelScope()
        self.calls: set[anyio.CancelScope] = set()  # tool calls running now


class _Call:
    """One `/call`: it runs to the end even if the client disconnects (but not past the end of
    its session), and a client that reconnects with its `task_id` gets the same result."""

    def __init__(self) -> None:
        self.id = uuid.uuid4().hex
        self.done = anyio.Event()
        self.result: str | None = None
        self.error: str | None = None


class EnvServer:
    """The ORS protocol for some environment classes, as an ASGI app (`.app`)."""

    def __init__(
        self,
        envs: Sequence[type[Environment]],
        *,
        setup_wait: float = 25.0,
        session_ttl: float = 900.0,
        reap_every: float = 5.0,
        api_key: str | None = None,
        max_body: int = 16 * 2**20,
    ) -> None:
        if not envs:
            raise EnvError("an env server needs at least one environment class")
        self.envs: dict[str, type[Environment]] = {}
        for cls in envs:
            if not is_environment_class(cls):
                raise EnvError(f"{cls!r} is not an openreward Environment class")
            key = cls.name().lower()
            if key in self.envs:
                raise EnvError(f"two environments are named {key!r}")
            self.envs[key] = cls
        self.setup_wait = setup_wait
        self.session_ttl = session_ttl
        self.reap_every = reap_every
        self.sessions: dict[str, _Served] = {}
        self._calls: dict[str, _Call] = {}
        self._tasks: dict[tuple[str, str], list[Mapping[str, object]]] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._root: dict[tuple[str, str], Callable[[Request], Awaitable[Reply]]] = {
            ("GET", "health"): self._health,
            ("GET", "version"): self._version,
            ("GET", "list_environments"): self._list_environments,
            ("POST", "create_session"): self._create_session,
            ("POST", "create"): self._create,
            ("POST", "ping"): self._ping,
            ("POST", "delete"): self._delete,
            ("POST", "delete_session"): self._delete_session,
        }
        self._per_env: dict[tuple[str, str], Callable[[Request, str], Awaitable[Reply]]] = {
            ("GET", "splits"): self._splits,
            ("GET", "tools"): self._tools,
            ("POST", "tasks"): self._list_tasks,
            ("POST", "num_tasks"): self._num_tasks,
            ("POST", "task"): self._task,
            ("POST", "task_range"): self._task_range,
            ("GET", "prompt"): self._prompt,
            ("GET", "messages"): self._messages,
            ("GET", "task_tools"): self._task_tools,
            ("POST", "call"): self._call,
        }
        # The key (the `X-API-Key` openreward's client sends), when set, guards every route.
        self.app = Guard(
            Starlette(
                routes=[Route("/{path:path}", self._dispatch, methods=["GET", "POST"])],
                lifespan=self._lifespan,
            ),
            api_key=api_key,
            max_body=max_body,
        )

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._reap)
            try:
                yield
            finally:
                with anyio.CancelScope(shield=True):
                    for sid in list(self.sessions):
                        await self._end(sid)
                tg.cancel_scope.cancel()

    async def _dispatch(self, request: Request) -> Response:
        segments = [s for s in request.url.path.split("/") if s]
        try:
            if len(segments) == 1 and (request.method, segments[0]) in self._root:
                body = await self._root[request.method, segments[0]](request)
            elif 1 <= len(segments) <= 2:
                env_name = segments[0].lower() if len(segments) == 2 else next(iter(self.envs))
                handler = self._per_env.get((request.method, segments[-1]))
                if handler is None:
                    raise HTTPError(404, "Not Found")
                if env_name not in self.envs:
                    raise HTTPError(404, f"unknown environment {env_name!r}")
                body = await handler(request, env_name)
            else:
                raise HTTPError(404, "Not Found")
        except HTTPError as exc:
            return JSONResponse({"detail": exc.detail}, exc.status, headers=exc.headers)
        except ValidationError as exc:
            return JSONResponse({"detail": exc.errors(include_url=False, include_context=False)}, 422)
        except Exception as exc:
            log.warning("request failed", path=request.url.path, error=f"{type(exc).__name__}: {exc}")
            return JSONResponse({"detail": f"{type(exc).__name__}: {exc}"}, 500)
        return body if isinstance(body, Response) else JSONResponse(body)

    # --- the server ---------------------------------------------------------------------------

    async def _health(self, request: Request) -> Reply:
        return {"status": "ok"}

    async def _version(self, request: Request) -> Reply:
        try:
            platoon_version = version("platoon")
        except PackageNotFoundError:
            platoon_version = "unknown"
        return {"version": f"platoon {platoon_version}", "build_sha": None}

    async def _list_environments(self, request: Request) -> Reply:
        return list(self.envs)

    async def _create_session(self, request: Request) -> Response:
        sid = str(uuid.uuid4())
        events = _sse("task_id", sid) + _sse("end", "")
        return Response(events, media_type="text/event-stream", headers=_SSE_HEADERS)

    async def _create(self, request: Request) -> Reply:
        sid = _sid(request)
        if sid in self.sessions:
            raise HTTPError(400, "Session already exists")
        create = CreateSession.model_validate(await _json(request))
        env_name = (create.env_name or next(iter(self.envs))).lower()
        if env_name not in self.envs:
            raise HTTPError(404, f"unknown environment {env_name!r}")
        if create.toolset_name is not None:
            raise HTTPError(400, f"toolset {create.toolset_name!r}: session toolsets are not served here")
        env_cls = self.envs[env_name]
        if create.task_spec is not None:
            spec = dict(create.task_spec)
        else:
            assert create.split is not None and create.index is not None
            spec = dict(_index(await self._split_tasks(env_name, create.split), create.index))
        secrets = _secrets(request)
        if env_cls.__init__ is Environment.__init__:
            env = env_cls(task_spec=spec, secrets=secrets)
        else:
            env = await call_user(env_cls, task_spec=spec, secrets=secrets)
        if sid in self.sessions:  # created meanwhile by a concurrent request with the same sid
            raise HTTPError(400, "Session already exists")
        served = self.sessions[sid] = _Served(env)
        assert self._tg is not None
        self._tg.start_soon(self._setup, served)
        return {"sid": sid}

    async def _setup(self, served: _Served) -> None:
        with served.setup_scope:
            try:
                if type(served.env).setup is not Environment.setup:
                    await call_user(served.env.setup)
            except Exception as exc:
                log.warning("environment setup failed", error=f"{type(exc).__name__}: {exc}")
                served.error = exc
        served.ready.set()

    async def _ping(self, request: Request) -> Reply:
        served = self.sessions.get(_sid(request))
        if served is None:
            raise HTTPError(404, "Active environment not found")
        served.last_ping = time.monotonic()
        return {"status": "ok"}

    async def _delete(self, request: Request) -> Reply:
        sid = _sid(request)
        await self._end(sid)
        return {"sid": sid}

    async def _delete_session(self, request: Request) -> Reply:
        return {"sid": _sid(request)}

    async def _end(self, sid: str) -> None:
        """Tear a session down: cancel a setup still running, then `teardown()`."""
        served = self.sessions.pop(sid, None)
        if served is None:
            return
        served.setup_scope.cancel()
        for scope in list(served.calls):
            scope.cancel()
        if not served.ready.is_set():
            served.error = HTTPError(410, "Session deleted")
            served.ready.set()
        if type(served.env).teardown is not Environment.teardown:
            try:
                await call_user(served.env.teardown)
            except Exception as exc:
                log.warning("environment teardown failed", error=f"{type(exc).__name__}: {exc}")

    async def _reap(self) -> None:
        while True:
            await anyio.sleep(self.reap_every)
            now = time.monotonic()
            for sid, served in list(self.sessions.items()):
                if now - served.last_ping > self.session_ttl:
                    log.info("tearing down a session that stopped pinging", sid=sid)
                    await self._end(sid)

    # --- classes and tasks --------------------------------------------------------------------

    async def _splits(self, request: Request, env_name: str) -> Reply:
        return [_split(s).model_dump() for s in await call_user(self.envs[env_name].list_splits)]

    async def _tools(self, request: Request, env_name: str) -> Reply:
        return self.envs[env_name].list_tools().model_dump()

    async def _split_tasks(self, env_name: str, split: str) -> list[Mapping[str, object]]:
        env_cls = self.envs[env_name]
        if (env_name, split) not in self._tasks:
            names = [_split(s).name for s in await call_user(env_cls.list_splits)]
            if split not in names:
                raise HTTPError(400, "Invalid split")
            self._tasks[env_name, split] = list(await call_user(env_cls.list_tasks, split))
        return self._tasks[env_name, split]

    async def _list_tasks(self, request: Request, env_name: str) -> Reply:
        split = _field(await _json(request), "split", str)
        return {"tasks": await self._split_tasks(env_name, split), "env_name": env_name}

    async def _num_tasks(self, request: Request, env_name: str) -> Reply:
        split = _field(await _json(request), "split", str)
        return {"num_tasks": len(await self._split_tasks(env_name, split))}

    async def _task(self, request: Request, env_name: str) -> Reply:
        body = await _json(request)
        tasks = await self._split_tasks(env_name, _field(body, "split", str))
        return {"task": _index(tasks, _field(body, "index", int)), "env_name": env_name}

    async def _task_range(self, request: Request, env_name: str) -> Reply:
        body = await _json(request)
        tasks = await self._split_tasks(env_name, _field(body, "split", str))
        return {"tasks": tasks[_bound(body, "start") : _bound(body, "stop")], "env_name": env_name}

    # --- sessions -----------------------------------------------------------------------------

    def _existing(self, request: Request) -> _Served:
        served = self.sessions.get(_sid(request))
        if served is None:
            raise HTTPError(404, "Active environment not found")
        served.last_ping = time.monotonic()
        if served.error is not None:
            raise served.error
        return served

    async def _ready(self, request: Request) -> _Served:
        served = self._existing(request)
        with anyio.move_on_after(self.setup_wait):
            await served.ready.wait()
        if not served.ready.is_set():
            raise HTTPError(
                503, "Environment still starting.", {"X-Backend-State": "starting", "Retry-After": "2"}
            )
        if served.error is not None:
            raise served.error
        return served

    async def _prompt(self, request: Request, env_name: str) -> Reply:
        served = await self._ready(request)
        return [block.model_dump() for block in await call_user(served.env.get_prompt)]

    async def _messages(self, request: Request, env_name: str) -> Reply:
        served = await self._ready(request)
        return [message.model_dump() for message in await call_user(served.env.get_messages)]

    async def _task_tools(self, request: Request, env_name: str) -> Reply:
        served = self._existing(request)
        return (await list_session_tools(served.env, None)).model_dump()

    async def _call(self, request: Request, env_name: str) -> Response:
        served = await self._ready(request)
        tool_call = ToolCall.model_validate(await _json(request))
        if tool_call.task_id is not None:
            call = self._calls.get(tool_call.task_id)
            if call is None:
                return Response(_sse("error", "unknown task_id"), media_type="text/event-stream")
        else:
            call = _Call()
            self._calls[call.id] = call
            assert self._tg is not None
            self._tg.start_soon(self._run_call, call, served, tool_call)
        return StreamingResponse(
            self._call_events(call), media_type="text/event-stream", headers=_SSE_HEADERS
        )

    async def _run_call(self, call: _Call, served: _Served, tool_call: ToolCall) -> None:
        """Run a tool to the end, or until its session ends: a client that gave up on it (its
        tool timeout) deletes the session, and a tool still running then is cancelled, as it is
        when the same environment runs in process."""
        try:
            with anyio.CancelScope() as scope:
                served.calls.add(scope)
                try:
                    outcome = await served.env._call_tool(tool_call.name, dict(tool_call.input))
                    call.result = outcome.model_dump_json()
                except Exception as exc:
                    call.error = str(exc) or type(exc).__name__
                finally:
                    served.calls.discard(scope)
            if scope.cancelled_caught:
                call.error = f"tool {tool_call.name} was stopped: its session ended"
        finally:
            call.done.set()
        await anyio.sleep(_RESULT_LINGER)
        self._calls.pop(call.id, None)

    async def _call_events(self, call: _Call) -> AsyncIterator[str]:
        yield _sse("task_id", call.id)
        while not call.done.is_set():
            with anyio.move_on_after(_PING_EVERY):
                await call.done.wait()
            if not call.done.is_set():
                yield ": ping\n\n"
        if call.error is not None:
            yield _sse("error", call.error)
            return
        assert call.result is not None
        pieces = _chunks(call.result)
        for n, piece in enumerate(pieces):
            yield _sse("end" if n == len(pieces) - 1 else "chunk", piece)


# --- helpers ------------------------------------------------------------------------------------


def _sse(event: str, data: str) -> str:
    lines = data.splitlines() or [""]
    return f"event: {event}\n" + "".join(f"data: {line}\n" for line in lines) + "\n"


def _chunks(text: str) -> list[str]:
    """Pieces of about `_CHUNK` characters. A piece never starts with whitespace: SSE clients
    strip it from the start of a data line, which would corrupt the JSON it belongs to."""
    pieces, start = [], 0
    while start < len(text):
        end = min(start + _CHUNK, len(text))
        while end < len(text) and text[end].isspace():
            end += 1
        pieces.append(text[start:end])
        start = end
    return pieces or [""]


def _sid(request: Request) -> str:
    sid = request.headers.get("X-Session-ID", "").strip()
    if not sid:
        raise HTTPError(400, "X-Session-ID header is required")
    return sid


def _secrets(request: Request) -> dict[str, str]:
    raw = request.headers.get("X-Secrets")
    if not raw:
        return {}
    try:
        payload = json.loads(base64.b64decode(raw))
        return {str(key): str(entry["value"]) for key, entry in payload.items()}
    except Exception as exc:
        raise HTTPError(400, f"malformed X-Secrets header: {exc}") from exc


async def _json(request: Request) -> dict[str, object]:
    try:
        body = await request.json()
    except ValueError as exc:
        raise HTTPError(400, f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise HTTPError(400, "the body must be a JSON object")
    return body


def _field(body: Mapping[str, object], name: str, kind: type[T]) -> T:
    value = body.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise HTTPError(400, f"{name!r} must be a {kind.__name__}")
    return value


def _bound(body: Mapping[str, object], name: str) -> int | None:
    """A slice bound of the body: an integer, or absent."""
    value = body.get(name)
    return None if value is None else _field(body, name, int)


def _index(tasks: list[Mapping[str, object]], index: int) -> Mapping[str, object]:
    if not 0 <= index < len(tasks):
        raise HTTPError(400, "Invalid index")
    return tasks[index]


def _split(split: object) -> Split:
    if isinstance(split, Split):
        return split
    return Split(name=split, type=split if split in ("train", "validation", "test") else "validation")


# --- running it -----------------------------------------------------------------------------------


def load_env_classes(targets: str | type | Sequence[str | type]) -> list[type[Environment]]:
    """Environment classes from classes, `module:Class` refs (`python://` allowed) or
    named environments (`NAME[@VERSION]`)."""
    # the ors extra (the openreward SDK): the env server needs it, its importers may not
    from platoon.envs.named import load_named_env

    items = [targets] if isinstance(targets, str | type) else list(targets)
    classes = []
    for item in items:
        if isinstance(item, str):
            ref = item.removeprefix("python://")
            try:
                item = import_ref(ref) if ":" in ref else load_named_env(ref)
            except PluginError as exc:
                raise EnvError(str(exc)) from exc
        if not is_environment_class(item):
            raise EnvError(f"{item!r} is not an openreward Environment class")
        classes.append(item)
    return classes


def _hypercorn_config(bind: str) -> hypercorn.config.Config:
    config = hypercorn_config(bind)
    config.loglevel = "WARNING"
    config.graceful_timeout = 2.0
    return config


async def serve_env(
    target: str | type | Sequence[str | type],
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    shutdown_trigger: Callable[[], Awaitable[object]] | None = None,
    sock: socket.socket | None = None,
    **server_options: Any,
) -> None:
    """Serve environment classes until `shutdown_trigger` returns (or SIGINT/SIGTERM without one).

    Loopback by default: pass `host="0.0.0.0"` and an `api_key` to serve other machines. `sock`
    is a socket already listening on host:port (so a taken port fails before anything starts).
    """
    require_key(host, server_options.get("api_key"), "the env server")
    if not on_asyncio():
        raise EnvError("the env server runs under asyncio (the openreward SDK needs it)")
    from hypercorn.asyncio import serve

    server = EnvServer(load_env_classes(target), **server_options)
    sock = sock or bind_socket(host, port)
    config = _hypercorn_config(f"fd://{sock.detach()}")
    await serve(server.app, config, shutdown_trigger=shutdown_trigger)  # type: ignore[arg-type]


@asynccontextmanager
async def running_env_server(
    target: str | type | Sequence[str | type], *, host: str = "127.0.0.1", **server_options: Any
) -> AsyncIterator[str]:
    """Serve environment classes on a free port for the block's duration; yields the base URL."""
    require_key(host, server_options.get("api_key"), "the env server")
    if not on_asyncio():
        raise EnvError("the env server runs under asyncio (the openreward SDK needs it)")
    from hypercorn.asyncio import serve

    server = EnvServer(load_env_classes(target), **server_options)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(128)  # listening before hypercorn starts: early connections wait in the backlog
    port = sock.getsockname()[1]
    stop, stopped = anyio.Event(), anyio.Event()

    async def run() -> None:
        try:
            config = _hypercorn_config(f"fd://{sock.detach()}")
            await serve(server.app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
        finally:
            stopped.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        try:
            yield f"http://{host}:{port}"
        finally:
            # Stop gracefully (sessions torn down) even when the block failed: cancelling
            # hypercorn mid-serve would skip the app's shutdown.
            stop.set()
            with anyio.move_on_after(30, shield=True):
                await stopped.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """`platoon env serve TARGET... [--host H] [--port N]`: serve until interrupted."""
    parser = argparse.ArgumentParser(prog="platoon env serve", description=main.__doc__)
    parser.add_argument("targets", nargs="+", metavar="TARGET", help="module:Class or NAME[@VERSION]")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: loopback)")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument(
        "--api-key",
        default=os.environ.get("PLATOON_SERVER_API_KEY"),
        help="require this X-API-Key on every request (default: $PLATOON_SERVER_API_KEY, else one "
        "made up and printed, which this user's clients on this machine find; required beyond 127.0.0.1)",
    )
    args = parser.parse_args(argv)
    try:
        require_key(args.host, args.api_key, "the env server")
    except ServingError as exc:
        print(f"platoon: error: {exc}", file=sys.stderr)
        return 2
    classes = load_env_classes(args.targets)
    names = ", ".join(cls.name().lower() for cls in classes)
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        print(f"platoon: error: {exc}", file=sys.stderr)
        return 1
    # Loopback too has a key: another user of the machine, or a sandbox on the host's network,
    # reaches it. One made up is published for this user's clients (`service: http://...` finds it).
    key = args.api_key or new_key()
    url = f"http://{args.host}:{sock.getsockname()[1]}"
    if not args.api_key:
        print(f"key {key}  (this user's clients on this machine find it; others send it as X-API-Key)")
    print(f"serving {names} on {url}", flush=True)
    serve = functools.partial(serve_env, classes, args.host, args.port, api_key=key, sock=sock)
    with published_key(url, key):
        anyio.run(serve)
    return 0

"""Serving ASGI apps (gateway, env servers, the embedded Tinker server) under anyio, guarded.

`serve_asgi` binds the socket itself, so port 0 picks a free port and the caller learns the
URL before anyone connects, then runs hypercorn on the current backend (asyncio or trio).
Use it with `task_group.start`, which returns the base URL once the server accepts.

What every server of ours shares at its door (`Guard`): a key checked in constant time on
every route, a cap on the request body (and `read_body_limited` for a compressed one, so a
small zstd bomb cannot expand before a check), a cap on requests in flight, and deadlines for a request's
headers (hypercorn's idle timeout) and body, so a client that sends slowly is dropped. `require_key` refuses to serve beyond
loopback without a key: anyone who can reach the port would otherwise own the service.

Loopback is no wall either (another user of the machine, a sandbox on the host's network reach
it), so every server platoon starts has a key: the operator's, or one made up for it (`new_key`).
Its own clients get it in the process, or, for a server on this machine's loopback, from a file
only its user can read (`published_key`, `published_key_for`), as Jupyter's clients find its
servers' tokens: a `platoon train` finds the key of the `platoon serve tinker` it is pointed at.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
import sniffio

__all__ = [
    "BodyApp",
    "BodyTooLarge",
    "Guard",
    "ServingError",
    "bind_socket",
    "header",
    "is_loopback",
    "new_key",
    "presented_key",
    "published_key",
    "published_key_for",
    "read_body_limited",
    "require_key",
    "serve_asgi",
]

# hypercorn closes a connection idle this long, and a request's headers count as idle until
# they are complete: a client trickling its headers (slowloris) is dropped too.
IDLE_TIMEOUT_S = 20.0
BODY_TIMEOUT_S = 60.0  # the whole request body must arrive within this

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
# An endpoint given the request body `Guard` read: (scope, body, receive, send).
BodyApp = Callable[[Scope, bytes, Receive, Send], Awaitable[None]]


class ServingError(RuntimeError):
    """A server that must not start as asked (the message says why and what to do)."""


class BodyTooLarge(ValueError):
    """A request body (or what it decompresses to) over the server's limit.

    `prefix` holds the first decoded bytes when there are any, so a server can still read
    which request it refuses.
    """

    prefix: bytes = b""


def is_loopback(host: str) -> bool:
    """Whether `host` (an address to listen on) is reachable only from this machine."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def require_key(host: str, api_key: str | None, what: str) -> None:
    """Refuse to listen beyond loopback without a key."""
    if not api_key and not is_loopback(host):
        raise ServingError(
            f"{what} would listen on {host} with no key, open to anyone who reaches the port: "
            "give it one with --api-key (or $PLATOON_SERVER_API_KEY), or listen on 127.0.0.1"
        )


def new_key(prefix: str = "") -> str:
    """A random key for a server (`prefix`: what its clients expect, `tml-` for Tinker's)."""
    return prefix + secrets.token_urlsafe(24)


def keys_dir() -> Path:
    """Where the keys of this user's servers on loopback are published: `$PLATOON_RUNTIME_DIR`,
    else `$XDG_RUNTIME_DIR/platoon`, else `~/.local/share/platoon/runtime`; 0700."""
    configured = os.environ.get("PLATOON_RUNTIME_DIR")
    if configured:
        return Path(configured)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "platoon"
    return Path.home() / ".local" / "share" / "platoon" / "runtime"


def _key_file(url: str) -> Path | None:
    """The file of the server on this machine's loopback at `url`'s port (any loopback name)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.hostname is None or port is None or not is_loopback(parts.hostname):
        return None
    return keys_dir() / f"server-{port}.json"


@contextlib.contextmanager
def published_key(url: str, key: str) -> Iterator[None]:
    """While the server at `url` (on loopback) runs, its key is in a file only this user reads
    (0600 in a 0700 folder), for this user's clients that are pointed at it."""
    path = _key_file(url)
    if path is None:
        yield
        return
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.parent.chmod(0o700)
        record = json.dumps({"url": url.rstrip("/"), "key": key, "pid": os.getpid()}).encode()
        staging = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(record)
        os.replace(staging, path)
    except OSError:  # a home that cannot be written: the clients given the key still have it
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(path.read_bytes()).get("pid") == os.getpid():
                path.unlink()


def published_key_for(url: str | None) -> str | None:
    """The key this user's server at `url` published, if it runs on loopback and is alive."""
    path = _key_file(url) if url else None
    if path is None:
        return None
    try:
        record = json.loads(path.read_bytes())
        os.kill(int(record["pid"]), 0)  # a key left by a server that died is no one's
    except (OSError, ValueError, KeyError, TypeError):
        return None
    key = record.get("key")
    return key if isinstance(key, str) else None


def presented_key(scope: Scope) -> str | None:
    """The key a request presents: an `Authorization: Bearer` token, else `X-API-Key`."""
    api_key = None
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
        elif name == b"x-api-key":
            api_key = value.decode("latin-1")
    return api_key


def header(scope: Scope, name: bytes) -> str | None:
    """A request header's first value; `name` in lower case (as ASGI servers give names)."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None


def _content_length(scope: Scope) -> int | None:
    value = header(scope, b"content-length")
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


class Guard:
    """ASGI middleware: key on every route, body cap, in-flight cap.

    The body is read (up to `max_body` bytes) before the app runs and replayed to it, so a
    body over the cap is refused with 413 whatever the app does with it. A request that
    `bodied(scope)` gives an endpoint for goes to that endpoint with the body instead (an app's
    busiest routes, without the replay and the app's routing).
    """

    def __init__(
        self,
        app: Any,
        *,
        api_key: str | None = None,
        max_body: int = 64 * 2**20,
        max_in_flight: int = 256,
        body_timeout: float = BODY_TIMEOUT_S,
        on_oversized: Callable[[Scope, bytes], None] | None = None,
        bodied: Callable[[Scope], BodyApp | None] | None = None,
    ) -> None:
        self.app = app
        self.bodied = bodied
        self.on_oversized = on_oversized  # told of a refused oversized body, with its first bytes
        self.api_key = api_key
        self.max_body = max_body
        self.max_in_flight = max_in_flight
        self.body_timeout = body_timeout
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.api_key is not None:
            presented = presented_key(scope) or ""
            if not hmac.compare_digest(presented.encode(), self.api_key.encode()):
                await _refuse(send, 401, "invalid or missing API key (X-API-Key or Authorization: Bearer)")
                return
        if self.in_flight >= self.max_in_flight:
            await _refuse(send, 503, "too many requests in flight; retry shortly", retry_after=True)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body:
            if self.on_oversized is not None:
                with anyio.move_on_after(self.body_timeout):
                    self.on_oversized(scope, await _head(receive, OVERSIZED_HEAD))
            await _refuse(send, 413, f"request body over {self.max_body} bytes")
            return
        self.in_flight += 1
        try:
            body = await self._body(scope, receive, send)
            if body is None:
                return
            endpoint = self.bodied(scope) if self.bodied is not None else None
            if endpoint is not None:
                await endpoint(scope, body, receive, send)
                return
            replayed = False

            async def replay() -> Message:
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            await self.app(scope, replay, send)
        finally:
            self.in_flight -= 1

    async def _body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The request body, whole; None when the request is over (the client left, or it was
        refused: 413 over the cap, 408 past the deadline)."""
        body: bytes | bytearray = b""
        parts: bytearray | None = None  # a body in several messages is gathered here
        with anyio.move_on_after(self.body_timeout):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return None
                chunk = message.get("body", b"")
                if not chunk:
                    pass  # hypercorn ends every body with an empty message
                elif not body:
                    body = chunk
                else:
                    if parts is None:
                        parts = bytearray(body)
                    parts += chunk
                    body = parts
                if len(body) > self.max_body:
                    if self.on_oversized is not None:
                        self.on_oversized(scope, bytes(body[:OVERSIZED_HEAD]))
                    await _refuse(send, 413, f"request body over {self.max_body} bytes")
                    return None
                if not message.get("more_body"):
                    return bytes(body)
        await _refuse(send, 408, f"request body not received within {self.body_timeout} s")
        return None


OVERSIZED_HEAD = 4096  # bytes of a refused body read for `on_oversized`


async def _head(receive: Receive, size: int) -> bytes:
    head = b""
    while len(head) < size:
        message = await receive()
        if message["type"] != "http.request":
            break
        head += message.get("body", b"")
        if not message.get("more_body"):
            break
    return head[:size]


async def _refuse(send: Send, status: int, message: str, *, retry_after: bool = False) -> None:
    """Answer before the request's body is read (all of it): the connection then closes, and
    says so. Without `connection: close`, a client reused it for its next request, which the
    server, closing it meanwhile, never answered ("Server disconnected without sending a
    response", seen once in a full run)."""
    body = json.dumps({"error": message, "category": "user"}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    if retry_after:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def read_body_limited(body: bytes, encoding: str | None, limit: int) -> bytes:
    """`body` decoded from its content encoding, never expanding past `limit` bytes."""
    if not encoding or encoding == "identity":
        if len(body) > limit:
            raise BodyTooLarge(f"request body over {limit} bytes")
        return body
    if encoding == "zstd":
        import io

        import zstandard

        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body)) as reader:
            out = reader.read(limit + 1)
    elif encoding == "gzip":
        import zlib

        decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out = decompressor.decompress(body, limit + 1)
    else:
        raise BodyTooLarge(f"unsupported content-encoding {encoding!r}")
    if len(out) > limit:
        error = BodyTooLarge(f"request body decompresses to over {limit} bytes")
        error.prefix = out[:4096]
        raise error
    return out


def hypercorn_config(bind: str, *, idle_timeout: float = IDLE_TIMEOUT_S) -> Any:
    """hypercorn settings every server of ours shares."""
    from hypercorn.config import Config

    config = Config()
    config.bind = [bind]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.5
    config.keep_alive_timeout = idle_timeout
    config.h11_max_incomplete_size = 64 * 1024  # request line and headers
    return config


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _quiet_cancelled_connections(loop: asyncio.AbstractEventLoop) -> None:
    """Drop the traceback Python 3.11's asyncio streams print for a cancelled connection task.

    At shutdown hypercorn cancels the connections still open (a client that keeps its
    connection alive, like the tinker SDK's); 3.11's `StreamReaderProtocol` then calls
    `task.exception()` on the cancelled task, which raises, and the loop logs "Exception in
    callback" with a traceback for what is an orderly stop (3.12 checks `cancelled()` first).
    """
    previous = loop.get_exception_handler()
    if getattr(previous, "quiets_cancelled_connections", False):
        return

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), asyncio.CancelledError):
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    handler.quiets_cancelled_connections = True  # type: ignore[attr-defined]
    loop.set_exception_handler(handler)


async def serve_asgi(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    idle_timeout: float = IDLE_TIMEOUT_S,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` until cancelled; `task_status.started(base_url)` once it listens."""
    sock = bind_socket(host, port)
    config = hypercorn_config(f"fd://{os.dup(sock.fileno())}", idle_timeout=idle_timeout)
    bound_host, bound_port = sock.getsockname()[:2]
    url = f"http://[{bound_host}]:{bound_port}" if ":" in bound_host else f"http://{bound_host}:{bound_port}"
    if sniffio.current_async_library() == "trio":
        from hypercorn.trio import serve as trio_serve

        serve: Callable[..., Awaitable[None]] = trio_serve
    else:
        from hypercorn.asyncio import serve as asyncio_serve

        serve = asyncio_serve
        _quiet_cancelled_connections(asyncio.get_running_loop())
    shutdown = anyio.Event()

    async def run() -> None:
        # Shielded: on cancellation hypercorn is asked to stop (below) and closes its
        # connections itself, instead of being torn down mid-request.
        with anyio.CancelScope(shield=True):
            await serve(app, config, shutdown_trigger=shutdown.wait)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            # The socket already listens, so connections queue until hypercorn accepts them.
            task_status.started(url)
            try:
                await anyio.sleep_forever()
            finally:
                shutdown.set()
    finally:
        sock.close()

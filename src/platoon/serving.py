"""Serving ASGI apps (gateway, env servers, the embedded Tinker server) under anyio.

`serve_asgi` binds the socket itself, so port 0 picks a free port and the caller learns the
URL before anyone connects, then runs hypercorn on the current backend (asyncio or trio).
Use it with `task_group.start`, which returns the base URL once the server accepts.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import anyio
import anyio.abc
import sniffio

__all__ = ["bind_socket", "serve_asgi"]


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


async def serve_asgi(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` until cancelled; `task_status.started(base_url)` once it listens."""
    from hypercorn.config import Config

    sock = bind_socket(host, port)
    config = Config()
    config.bind = [f"fd://{os.dup(sock.fileno())}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.5
    config.keep_alive_timeout = 75
    bound_host, bound_port = sock.getsockname()[:2]
    url = f"http://[{bound_host}]:{bound_port}" if ":" in bound_host else f"http://{bound_host}:{bound_port}"
    if sniffio.current_async_library() == "trio":
        from hypercorn.trio import serve
    else:
        from hypercorn.asyncio import serve
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

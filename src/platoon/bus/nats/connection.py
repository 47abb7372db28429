"""One bridge's connection to NATS: where (URLs), as whom (credentials, TLS), whether the
server asks anyone who they are (`auth_required`), and staying connected (reconnect forever,
with an exponential, jittered backoff from `reconnect_wait` to `reconnect_max_wait`, over the
least-tried server of a cluster).

`connect_timeout` bounds the first connection only. The bridge hears of each drop and return
through two callbacks, and never sees nats-py's own options.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import random
import ssl
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TypedDict, TypeVar
from urllib.parse import urlsplit

import anyio
import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client as NatsClient
from nats.aio.client import Server
from nats.aio.subscription import Subscription as NatsSubscription
from nats.js import JetStreamContext

from platoon.bus.nats.settings import ConnectionSettings
from platoon.bus.nats.stats import BridgeStats
from platoon.bus.nats.wire import NatsBridgeError

log = structlog.get_logger("platoon.bus.nats")

SCHEMES = ("nats", "tls", "ws", "wss")
T = TypeVar("T")


class Login(TypedDict, total=False):
    """nats-py's connect options that say who we are (from a credentials file)."""

    user: str
    password: str
    user_credentials: str


class Connection:
    """Connects, reconnects forever, and leaves cleanly. `server` is the URL it is connected
    to, without user and password (fit for events and logs); `last_error` the last error the
    client reported; `auth_required` whether the server asked us to log in (its INFO says so)."""

    def __init__(
        self,
        urls: list[str],
        settings: ConnectionSettings,
        *,
        name: str,
        stats: BridgeStats,
        closing: Callable[[], bool] = lambda: False,
        disconnected: Callable[[], None] = lambda: None,
        reconnected: Callable[[], None] = lambda: None,
    ) -> None:
        for one in urls:
            check_url(one)
        self.urls = urls
        self.settings = settings
        self.name = name
        self.stats = stats
        credentials = settings.credentials
        self.login = read_credentials(Path(credentials)) if credentials is not None else Login()
        self.server = public_url(urls[0])
        self.last_error = ""
        self.auth_required: bool | None = None  # known once connected
        self.nc: NatsClient | None = None
        self._closing = closing
        self._disconnected = disconnected
        self._reconnected = reconnected

    async def connect(self) -> NatsClient:
        nc = NatsClient()
        try:
            with anyio.fail_after(self.settings.connect_timeout):
                await nc.connect(
                    servers=self.urls,
                    name=self.name,
                    no_echo=True,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    # nats-py annotates these two as int; it takes seconds, fractions too.
                    reconnect_time_wait=self.settings.reconnect_wait,  # type: ignore[arg-type]
                    connect_timeout=min(self.settings.connect_timeout, 2.0),  # type: ignore[arg-type]
                    reconnect_to_server_handler=self._next_server,
                    error_cb=self._on_error,
                    disconnected_cb=self._on_disconnected,
                    reconnected_cb=self._on_reconnected,
                    tls=self.settings.tls,
                    **self.login,
                )
        except TimeoutError:
            await close_quietly(nc)
            raise NatsBridgeError(
                f"could not connect to NATS at {self.server} within {self.settings.connect_timeout} s"
                + (f": {self.last_error}" if self.last_error else "")
            ) from None
        except (OSError, nats.errors.Error, ssl.SSLError) as exc:
            await close_quietly(nc)
            raise NatsBridgeError(f"could not connect to NATS at {self.server}: {exc}") from exc
        self._remember_server(nc)
        # nats-py keeps the server's INFO only here; a server without users or tokens leaves
        # `auth_required` out, and then anyone who reaches it may publish anything.
        self.auth_required = bool(nc._server_info.get("auth_required"))
        self.nc = nc
        return nc

    async def jetstream_call(self, call: Awaitable[T]) -> T:
        """Await a JetStream set-up call, turning "no JetStream here" into a clear error."""
        try:
            return await call
        except (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError) as exc:
            raise NatsBridgeError(
                f"NATS at {self.server} has no JetStream (start nats-server with -js): {exc}"
            ) from exc
        except nats.js.errors.APIError as exc:
            raise NatsBridgeError(f"JetStream set-up failed at {self.server}: {exc}") from exc

    async def connected(self, nc: NatsClient) -> None:
        """Return once `nc` is connected (at once if it is); fail if it was closed."""
        while not nc.is_connected:
            if nc.is_closed:
                raise NatsBridgeError(f"the connection to NATS at {self.server} is closed")
            await anyio.sleep(0.01)

    async def leave(
        self, nc: NatsClient, subscriptions: Iterable[NatsSubscription | JetStreamContext.PullSubscription]
    ) -> None:
        """Unsubscribe and wait until the server has seen it, then close. Closing alone leaves
        our queue-group member in place until the server notices the dead socket, and work
        sent to it meanwhile would be lost."""
        try:
            for sub in subscriptions:
                try:
                    await sub.unsubscribe()
                except nats.errors.BadSubscriptionError:
                    pass  # a membership the server has ended already
            if nc.is_connected:
                await synced(nc)
        except (TimeoutError, nats.errors.Error) as exc:
            log.debug("leaving NATS uncleanly", error=f"{type(exc).__name__}: {exc}")
        await close_quietly(nc)

    def _next_server(self, servers: list[Server], info: dict[str, object]) -> tuple[Server, float]:
        """Reconnect policy: the least-tried server, after an exponential, jittered backoff."""
        server = min(servers, key=lambda s: s.reconnects)
        if server.reconnects == 0:
            return server, 0.0
        delay = min(
            self.settings.reconnect_wait * 2 ** min(server.reconnects - 1, 30),
            self.settings.reconnect_max_wait,
        )
        return server, delay * random.uniform(0.75, 1.25)

    def _remember_server(self, nc: NatsClient) -> None:
        if nc.connected_url is not None:
            self.server = public_url(nc.connected_url.geturl())

    async def _on_error(self, exc: Exception) -> None:
        if isinstance(exc, nats.errors.SlowConsumerError):
            self.stats.slow_consumer_drops += 1
            return
        self.last_error = f"{type(exc).__name__}: {exc}".rstrip(": ")
        log.debug("nats error", server=self.server, error=self.last_error)

    async def _on_disconnected(self) -> None:
        if self._closing():
            return
        self.stats.disconnects += 1
        log.warning("bridge disconnected", server=self.server, reason=self.last_error)
        self._disconnected()

    async def _on_reconnected(self) -> None:
        if self._closing():
            return
        if self.nc is not None:
            self._remember_server(self.nc)
        self._reconnected()


def require_asyncio() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise NatsBridgeError(
            "the NATS bridge needs anyio's asyncio backend (nats-py is asyncio-only); "
            "run the bus under asyncio, e.g. anyio.run(main, backend='asyncio')"
        ) from None


def read_credentials(path: Path) -> Login:
    """nats-py connect options from a credentials file: a `.creds` file, or platoon's JSON."""
    if not path.is_file():
        raise NatsBridgeError(f"NATS credentials file {path} does not exist")
    if path.suffix == ".creds":
        if importlib.util.find_spec("nkeys") is None:
            raise NatsBridgeError("NATS .creds files need the nkeys package: pip install nkeys")
        return {"user_credentials": str(path)}
    try:
        data = json.loads(path.read_text())
        return {"user": str(data["user"]), "password": str(data["password"])}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise NatsBridgeError(
            f"NATS credentials file {path}: expected a .creds file or the JSON `platoon nats init` "
            f"writes ({type(exc).__name__}: {exc})"
        ) from None


def check_url(url: str) -> None:
    try:
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        port = parts.port
    except ValueError as exc:
        raise NatsBridgeError(f"bad NATS URL {url!r}: {exc}") from None
    if port is not None and port < 1:
        raise NatsBridgeError(f"bad NATS URL {url!r}: port {port}")
    if parts.scheme not in SCHEMES:
        raise NatsBridgeError(f"bad NATS URL {url!r}: the scheme must be one of {', '.join(SCHEMES)}")
    if not parts.hostname:
        raise NatsBridgeError(f"bad NATS URL {url!r}: no host")


def public_url(url: str) -> str:
    """The URL without user and password, fit for events and logs."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}"


async def synced(nc: NatsClient) -> None:
    """Return once the server has processed every command sent so far.

    `flush()` alone does not promise that: nats-py writes its PING straight to the socket,
    ahead of commands still queued for its flusher task, so the PONG can come back before
    the server has seen our SUB (and a publish from another connection then finds nobody).
    """
    with anyio.fail_after(10):
        while nc.pending_data_size and nc.is_connected:  # noqa: ASYNC110 - nats-py has no event for it
            await anyio.sleep(0.001)
    await nc.flush()


async def close_quietly(nc: NatsClient) -> None:
    try:
        await nc.close()
    except Exception as exc:  # a half-made connection may fail to close; nothing to keep
        log.debug("closing the NATS connection failed", error=f"{type(exc).__name__}: {exc}")

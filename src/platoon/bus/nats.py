"""The NATS bridge: the same bus spread over several machines through an existing broker.

    bridge = NatsBridge(
        "nats://broker:4222", run="exp1",
        mirror=[PolicyUpdated],               # every bus sees these, both ways
        work=[EpisodeRequested],              # each reaches exactly one worker (a queue group)
        durable=[ModelCallFinished, EpisodeGraded],   # JetStream: none lost, none twice
        consume_work=True,                    # a worker: take work from NATS
    )
    async with Bus() as bus:
        bus.start_soon(bridge.run, bus)

Events travel on subjects `platoon.<run>.<EventTag>` in the bus's msgpack wire form. How each
kind travels, and why:

* **mirror**: core NATS publish/subscribe. Every bridged bus sees the event; at most once,
  like NATS itself, so use it for facts whose loss the next one repairs (a newer policy).
* **work**: offered to a queue group, and kept only by a consumer that claims it. The
  producer sends each event as a NATS request with a fresh nonce; the server hands it to one
  member of the group, which claims it (a proof of the nonce, on the request's reply subject),
  and plays it only once the producer confirms. An offer nobody holds (no member), or that is
  not claimed within `offer_timeout` (a member that hangs), is offered again, so work is never
  lost to a hung or absent consumer, and none is played twice. Membership is short: a consumer
  joins the group for `take_at_once` offers, then joins again, which only a consumer whose
  event loop runs can do; a hung one (SIGSTOP, a stalled loop) drops out of the group by
  itself after at most `take_at_once` offers, and is back once it runs. An event of a type in
  `withdraw` ends the offering of its episode's work (the trainer gave that episode up). A
  bridge may both produce and consume work: the server never hands an event back to the
  connection that sent it. When an offer of an episode's work is claimed, the producing bridge
  publishes `WorkClaimed` on its own bus (never over NATS): the trainer's lease of that
  episode starts there, not at the request.
* **durable**: JetStream. The sender waits for the stream's acknowledgement and publishes
  again after a timeout or a disconnect; a bridge with `consume_durable=True` reads a durable
  consumer (`durable_name`) and acknowledges a message only after the local bus accepted it.
  Each message carries the event's natural id (`call_id`, `episode_id` or `request_id`, else
  a hash of its bytes) as `Nats-Msg-Id`, so the stream drops re-sends, and a bounded set of
  seen ids drops redeliveries. Bridges that share a `durable_name` share its messages.

No echo: every message carries this bridge's origin id, and an event that came in from NATS
is never sent back out; messages of our own origin that come back are dropped. Run one
bridge per bus: the origin id belongs to the bridge.

Disconnects: the client reconnects forever, with exponential backoff from `reconnect_wait` to
`reconnect_max_wait`, and the bridge publishes `BridgeDisconnected` / `BridgeReconnected` on
the local bus (`buffered`: the most events the bridge held at once during the outage).
Meanwhile outgoing events wait in a buffer of `buffer_limit` events; when it is
full, `publish` on the local bus waits (backpressure, as everywhere on the bus) instead of
dropping, because silently losing a result costs training data. (A mirrored or work event
sent while the *receiving* side is still reconnecting is lost, as core NATS goes; durable
events are not.) At shutdown the bridge spends up to `close_timeout` sending what is
buffered and logs what it could not.

Facts (`state=`): event types whose latest value matters to whoever comes later, such as the
current policy and the run's end. A bridge with `write_state=True` also keeps each one it sends
in the run's state stream (`platoon-<run>-state`, one message per type); a bridge with
`read_state=True` reads them at start and after every reconnect, so a worker that was down, or
started after the trainer said something once, still learns it. A writer clears the stream when
it starts, so a trainer that reuses a run name does not inherit its predecessor's end (a worker
started before it may still read that end and stop: start the trainer first, or use a new run).

Leases (`leases=`): who was given an episode may report on it, nobody else. A bridge with
`issue_leases=True` (the trainer's) sends each work event with a fresh token in the
`Platoon-Lease` header and drops any incoming event of an episode whose header does not hold a
token it issued for that episode; a worker's bridges remember the token of each work event they
take and attach it to every event of that episode they send. With the server's permissions
(`platoon nats init`), a worker may take work only through the queue group, so the token of an
episode reaches the one worker that plays it.

Credentials: a NATS `.creds` file (JWT and nkey), or the JSON file `platoon nats init` writes
for a role (`{"user": ..., "password": ...}`).

`attach(bus)` (called by `run_components`, or by `run` itself) subscribes to the outgoing
types before the connection exists, so nothing published early is missed.

nats-py is asyncio-only, so the bridge needs anyio's asyncio backend; under trio `run` fails
with `NatsBridgeError`.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import importlib.util
import json
import random
import re
import secrets
import ssl
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import anyio
import msgspec
import structlog
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from platoon.bus.codec import decode, encode
from platoon.bus.components import ComponentBase
from platoon.bus.core import Bus, Subscription
from platoon.bus.events import (
    BridgeDisconnected,
    BridgeReconnected,
    Event,
    WorkClaimed,
    event_types,
    new_id,
)

try:
    import nats
    import nats.errors
    import nats.js.errors
    from nats.aio.client import Client as NatsClient
    from nats.aio.msg import Msg
    from nats.js import JetStreamContext, api
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("platoon.bus.nats needs nats-py: pip install 'platoon[nats]'") from exc

__all__ = ["BridgeStats", "Leases", "NatsBridge", "NatsBridgeError", "event_id", "subject_for"]

log = structlog.get_logger("platoon.bus.nats")

ORIGIN_HEADER = "Platoon-Origin"
MSG_ID_HEADER = "Nats-Msg-Id"
LEASE_HEADER = "Platoon-Lease"
OFFER_HEADER = "Platoon-Offer"
WORK_QUEUE = "platoon-work"  # the queue group work is offered to
OFFERS_AT_ONCE = 32  # offers a producer has out at a time; the rest wait their turn
ID_FIELDS = ("call_id", "request_id", "reply_to", "agent_id", "episode_id")
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_SCHEMES = ("nats", "tls", "ws", "wss")


class NatsBridgeError(RuntimeError):
    """The bridge cannot run: a bad URL or option, no server, or the wrong async backend."""


class BridgeStats(msgspec.Struct):
    """Counters of one bridge, for logs and benchmarks."""

    sent: int = 0
    received: int = 0
    echoes: int = 0
    duplicates: int = 0
    republished: int = 0
    undecodable: int = 0
    slow_consumer_drops: int = 0
    disconnects: int = 0
    unsent_at_close: int = 0
    unleased: int = 0  # events of an episode, dropped for want of its lease token
    offers_unclaimed: int = 0  # offers a member took and did not claim in time (it hangs)
    offers_unheld: int = 0  # offers made while no consumer was in the group
    claims_too_late: int = 0  # offers this consumer claimed after the producer gave up on it


class _Out(msgspec.Struct):
    subject: str
    durable: bool
    event: Event


class _Pending(msgspec.Struct):
    subject: str
    data: bytes
    headers: dict[str, str]
    ack: asyncio.Future[Any] | None
    deadline: float  # when to give up waiting for `ack` and publish again
    connection: int  # which connection it went out on (the count of disconnects then)


class Leases:
    """Per-episode tokens: issued with work (trainer), remembered and attached (worker)."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._tokens: OrderedDict[str, list[str]] = OrderedDict()

    def issue(self, episode_id: str) -> str:
        token = secrets.token_urlsafe(18)
        self._tokens.setdefault(episode_id, []).append(token)  # a re-request keeps the old ones
        self._trim(episode_id)
        return token

    def remember(self, episode_id: str, token: str) -> None:
        self._tokens[episode_id] = [token]
        self._trim(episode_id)

    def token_for(self, episode_id: str) -> str | None:
        tokens = self._tokens.get(episode_id)
        return tokens[-1] if tokens else None

    def revoke(self, episode_id: str, token: str) -> None:
        """Forget a token that never reached anyone who may use it (an offer not claimed)."""
        tokens = self._tokens.get(episode_id)
        if tokens and token in tokens:
            tokens.remove(token)

    def valid(self, episode_id: str, token: str | None) -> bool:
        return bool(token) and any(
            secrets.compare_digest(token, issued) for issued in self._tokens.get(episode_id, ())
        )

    def _trim(self, episode_id: str) -> None:
        self._tokens.move_to_end(episode_id)
        while len(self._tokens) > self.limit:
            self._tokens.popitem(last=False)


def _episode(event: Event) -> str | None:
    value = getattr(event, "episode_id", None)
    return value if isinstance(value, str) and value else None


@functools.cache
def _tag(event_type: type[Event]) -> str:
    return str(msgspec.inspect.type_info(event_type).tag)


def subject_for(run: str, event_type: type[Event]) -> str:
    """The NATS subject of an event type in a run: `platoon.<run>.<EventTag>`."""
    return f"platoon.{run}.{_tag(event_type)}"


def event_id(event: Event) -> str:
    """The id that deduplicates a durable event: its tag and natural id, else a hash of it."""
    tag = _tag(type(event))
    for field in ID_FIELDS:
        value = getattr(event, field, None)
        if isinstance(value, str) and value:
            return f"{tag}:{value}"
    return f"{tag}:{hashlib.blake2b(encode(event), digest_size=16).hexdigest()}"


class NatsBridge(ComponentBase):
    """A component that carries chosen event types between the local bus and NATS.

    `url` is one server or a list (a cluster); `credentials` a `.creds` file (needs `nkeys`);
    `tls` an `ssl.SSLContext`. `connect_timeout` bounds the first connection only: after
    that the bridge reconnects forever. Durable knobs: `ack_timeout` (how long a sender waits
    for the stream before publishing again), `ack_wait` (how long JetStream waits for our
    ack before redelivering: keep it above the longest stall of the local bus),
    `duplicate_window` and `max_age` (the stream's), `seen_limit` (ids remembered here).
    Work knobs: `offer_timeout` (how long a producer waits for a claim), `take_at_once` (the
    offers a consumer takes per membership), `withdraw` (see the module docstring).
    """

    name = "nats-bridge"
    # Any event its settings name; an instance declares its own (see `__init__`).
    subscribes = (Event,)
    publishes = (Event,)

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        run: str,
        mirror: Sequence[type[Event]] = (),
        work: Sequence[type[Event]] = (),
        durable: Sequence[type[Event]] = (),
        consume_work: bool = False,
        consume_durable: bool = False,
        durable_name: str = "platoon",
        credentials: str | Path | None = None,
        tls: ssl.SSLContext | None = None,
        buffer_limit: int = 1024,
        connect_timeout: float = 10.0,
        reconnect_wait: float = 0.1,
        reconnect_max_wait: float = 5.0,
        ack_timeout: float = 5.0,
        ack_wait: float = 60.0,
        duplicate_window: float = 120.0,
        max_age: float = 7 * 24 * 3600.0,
        seen_limit: int = 100_000,
        close_timeout: float = 5.0,
        leases: Leases | None = None,
        issue_leases: bool = False,
        state: Sequence[type[Event]] = (),
        write_state: bool = False,
        read_state: bool = False,
        offer_timeout: float = 5.0,
        take_at_once: int = 4,
        withdraw: Sequence[type[Event]] = (),
    ) -> None:
        self.urls = [url] if isinstance(url, str) else list(url)
        for one in self.urls:
            _check_url(one)
        if not _NAME.match(run):
            raise NatsBridgeError(
                f"run name {run!r} must be letters, digits, '-' or '_' (it is a subject token)"
            )
        if not _NAME.match(durable_name):
            raise NatsBridgeError(f"durable_name {durable_name!r} must be letters, digits, '-' or '_'")
        if buffer_limit < 1:
            raise NatsBridgeError("buffer_limit must be at least 1")
        if offer_timeout <= 0 or take_at_once < 1:
            raise NatsBridgeError("offer_timeout must be positive and take_at_once at least 1")
        self.run_name = run
        self.mirror = _check_types("mirror", mirror)
        self.work = _check_types("work", work)
        self.durable = _check_types("durable", durable)
        seen: dict[type[Event], str] = {}
        for kind, types in (("mirror", self.mirror), ("work", self.work), ("durable", self.durable)):
            for event_type in types:
                if event_type in seen:
                    raise NatsBridgeError(
                        f"{event_type.__name__} is both {seen[event_type]} and {kind}: pick one"
                    )
                seen[event_type] = kind
        if WorkClaimed in seen:
            raise NatsBridgeError("WorkClaimed is this bridge's own fact, never carried over NATS")
        self._login: dict[str, str] = {}
        if credentials is not None:
            self._login = _read_credentials(Path(credentials))
        if issue_leases and leases is None:
            leases = Leases(seen_limit)
        self.leases = leases
        self.issue_leases = issue_leases
        self.state = _check_types("state", state)
        self.write_state = write_state
        self.read_state = read_state
        self.state_stream = f"platoon-{run}-state"
        self.offer_timeout = offer_timeout
        self.take_at_once = take_at_once
        self.withdraw = _check_types("withdraw", withdraw)
        self._offering = 0  # offers out now
        self._withdrawn: OrderedDict[str, None] = OrderedDict()
        self._no_takers_logged = -1e9
        self._last_claim = -1e9
        self._js: JetStreamContext | None = None
        self.consume_work = consume_work
        self.consume_durable = consume_durable
        self.durable_name = durable_name
        self.credentials = credentials
        self.tls = tls
        self.buffer_limit = buffer_limit
        self.connect_timeout = connect_timeout
        self.reconnect_wait = reconnect_wait
        self.reconnect_max_wait = reconnect_max_wait
        self.ack_timeout = ack_timeout
        self.ack_wait = ack_wait
        self.duplicate_window = duplicate_window
        self.max_age = max_age
        self.seen_limit = seen_limit
        self.close_timeout = close_timeout
        self.stream_name = f"platoon-{run}"
        self.origin = new_id()
        self.stats = BridgeStats()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._server = _public_url(self.urls[0])
        self._last_error = ""
        # Per run: what came in from NATS (by identity, until our own forwarder sees it), the
        # local subscriptions and the outbox they fill, and our NATS subscriptions.
        self._from_nats: dict[int, Event] = {}
        self._attached = False
        self._bus: Bus | None = None
        self._nc: NatsClient | None = None
        self._outgoing: list[Subscription[Any]] = []
        self._outbox: MemoryObjectSendStream[_Out] | None = None
        self._outbox_out: MemoryObjectReceiveStream[_Out] | None = None
        self._notices: MemoryObjectSendStream[Event] | None = None
        self._subs: list[Any] = []
        self._members: set[Any] = set()  # our memberships of work groups now (two per subject)
        self._unsent = 0  # events handed to the bridge and not yet out (see `flush`)
        self._outage_peak: int | None = None  # the most events held at once while disconnected
        self._idle: anyio.Event | None = None
        self._closing = False
        # It takes what it sends out and publishes what it brings in, and its notices.
        self.subscribes = (*self.mirror, *self.work, *self.durable, *self.withdraw)
        brought = [
            *self.mirror,
            *(self.work if consume_work else ()),
            *(self.durable if consume_durable else ()),
        ]
        brought += [t for t in (self.state if read_state else ()) if t not in brought]
        notices = (BridgeDisconnected, BridgeReconnected, *((WorkClaimed,) if self.work else ()))
        self.publishes = (*brought, *notices)

    # --- the component ---------------------------------------------------------------------

    def on_attach(self, bus: Bus) -> None:
        """Subscribe to the outgoing types now, so that what is published before the bridge
        has connected waits in its buffer instead of being missed (again after `run` ended)."""
        self._closing = False
        self._bus, self._from_nats, self._unsent, self._idle = bus, {}, 0, anyio.Event()
        self._outbox, self._outbox_out = anyio.create_memory_object_stream[_Out](self.buffer_limit)
        for durable, types in ((False, self.mirror + self.work), (True, self.durable)):
            for event_type in types:
                self._outgoing.append(
                    bus.subscribe(
                        event_type,
                        self._forwarder(subject_for(self.run_name, event_type), durable),
                        name=f"{self.name}:{event_type.__name__}",
                        buffer=min(self.buffer_limit, 64),
                    )
                )
        for event_type in self.withdraw:
            self._outgoing.append(
                bus.subscribe(
                    event_type, self._on_withdraw, name=f"{self.name}:withdraw:{event_type.__name__}"
                )
            )

    def _on_withdraw(self, event: Event) -> None:
        episode = _episode(event)
        if episode is not None:
            self._withdrawn[episode] = None  # its offers end at their next try
            while len(self._withdrawn) > self.seen_limit:
                self._withdrawn.popitem(last=False)

    def _detach(self) -> None:
        for sub in self._outgoing:
            sub.close()
        self._outgoing, self._attached = [], False
        if self._outbox is not None:
            self._outbox.close()  # the sender ends once it has sent what is left

    async def run(self, bus: Bus, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Bridge until cancelled. With `await tg.start(bridge.run, bus)`, returns once live."""
        try:
            _require_asyncio()
            self.attach(bus)
            self._subs, self._members = [], set()
            nc = self._nc = await self._connect()
            try:
                await self._bridge(bus, nc, task_status)
            finally:
                self._closing = True
                with anyio.CancelScope(shield=True), anyio.move_on_after(self.close_timeout):
                    await self._leave(nc)
        finally:
            self._closing = True
            self._detach()
            if self._unsent:
                self.stats.unsent_at_close += self._unsent
                log.warning(
                    "bridge closed with events not sent to NATS", server=self._server, unsent=self._unsent
                )
            if self._idle is not None:
                self._idle.set()  # wake `flush` callers: nothing more will go out

    async def _bridge(self, bus: Bus, nc: NatsClient, task_status: TaskStatus[None]) -> None:
        assert self._outbox_out is not None
        js = nc.jetstream() if self.durable or self.state else None
        self._js = js
        if js is not None and self.durable:
            await self._jetstream_call(self._ensure_stream(js))
        if js is not None and self.write_state:
            await self._jetstream_call(self._ensure_state_stream(js))
        notices_send, notices = anyio.create_memory_object_stream[Event](64)
        inflight_send, inflight = anyio.create_memory_object_stream[_Pending](self.buffer_limit)
        self._notices = notices_send
        # The senders are shielded from cancellation so that, at shutdown, they can empty the
        # buffers; closing the outbox ends them, and `close_timeout` bounds how long they try.
        send_scope, ack_scope = anyio.CancelScope(shield=True), anyio.CancelScope(shield=True)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._send_loop, send_scope, nc, js, self._outbox_out, inflight_send)
            tg.start_soon(self._ack_loop, ack_scope, nc, js, inflight)
            try:
                tg.start_soon(self._announce, bus, notices)
                await self._subscribe_nats(tg, bus, nc, js)
                await _synced(nc)
                await self._read_facts(bus)
                log.info("bridge up", server=self._server, run=self.run_name, origin=self.origin)
                task_status.started()
                await anyio.sleep_forever()
            finally:
                # Let our forwarders move what the bus still holds for us into the outbox, stop
                # taking more, and give the senders until the deadline to empty it.
                deadline = anyio.current_time() + self.close_timeout
                with anyio.CancelScope(shield=True, deadline=deadline):
                    await bus.drained()
                self._detach()
                send_scope.deadline = ack_scope.deadline = deadline

    async def flush(self) -> None:
        """Wait until every event published on the bus so far is out: published to NATS or,
        if durable, stored by JetStream. While NATS is away this waits for it to come back;
        once the bridge has stopped it returns at once (see `stats.unsent_at_close`)."""
        if self._bus is not None and not self._closing:
            await self._bus.drained()
        while self._unsent and self._idle is not None and not self._closing:
            if self._idle.is_set():
                self._idle = anyio.Event()
            await self._idle.wait()

    def _sent(self) -> None:
        self._unsent -= 1
        self.stats.sent += 1
        if not self._unsent and self._idle is not None:
            self._idle.set()

    # --- connecting ------------------------------------------------------------------------

    async def _connect(self) -> NatsClient:
        nc = NatsClient()
        options: dict[str, Any] = {
            "servers": self.urls,
            "name": f"platoon:{self.run_name}:{self.origin[:8]}",
            "no_echo": True,
            "allow_reconnect": True,
            "max_reconnect_attempts": -1,
            "reconnect_time_wait": self.reconnect_wait,
            "connect_timeout": min(self.connect_timeout, 2.0),
            "reconnect_to_server_handler": self._next_server,
            "error_cb": self._on_error,
            "disconnected_cb": self._on_disconnected,
            "reconnected_cb": self._on_reconnected,
        }
        if self.tls is not None:
            options["tls"] = self.tls
        options.update(self._login)
        try:
            with anyio.fail_after(self.connect_timeout):
                await nc.connect(**options)
        except TimeoutError:
            await _close_quietly(nc)
            raise NatsBridgeError(
                f"could not connect to NATS at {self._server} within {self.connect_timeout} s"
                + (f": {self._last_error}" if self._last_error else "")
            ) from None
        except (OSError, nats.errors.Error, ssl.SSLError) as exc:
            await _close_quietly(nc)
            raise NatsBridgeError(f"could not connect to NATS at {self._server}: {exc}") from exc
        self._remember_server(nc)
        return nc

    async def _jetstream_call(self, call: Any) -> Any:
        """Await a JetStream set-up call, turning "no JetStream here" into a clear error."""
        try:
            return await call
        except (nats.js.errors.ServiceUnavailableError, nats.errors.NoRespondersError) as exc:
            raise NatsBridgeError(
                f"NATS at {self._server} has no JetStream (start nats-server with -js): {exc}"
            ) from exc
        except nats.js.errors.APIError as exc:
            raise NatsBridgeError(f"JetStream set-up failed at {self._server}: {exc}") from exc

    async def _leave(self, nc: NatsClient) -> None:
        """Unsubscribe and wait until the server has seen it, then close. Closing alone leaves
        our queue-group member in place until the server notices the dead socket, and work
        sent to it meanwhile would be lost."""
        try:
            for sub in [*self._subs, *self._members]:
                try:
                    await sub.unsubscribe()
                except nats.errors.BadSubscriptionError:
                    pass  # a membership the server has ended already
            if nc.is_connected:
                await _synced(nc)
        except (TimeoutError, nats.errors.Error) as exc:
            log.debug("leaving NATS uncleanly", error=f"{type(exc).__name__}: {exc}")
        await _close_quietly(nc)

    def _next_server(self, servers: list[Any], info: dict[str, Any]) -> tuple[Any, float]:
        """Reconnect policy: the least-tried server, after an exponential, jittered backoff."""
        server = min(servers, key=lambda s: s.reconnects)
        if server.reconnects == 0:
            return server, 0.0
        delay = min(self.reconnect_wait * 2 ** min(server.reconnects - 1, 30), self.reconnect_max_wait)
        return server, delay * random.uniform(0.75, 1.25)

    def _remember_server(self, nc: NatsClient) -> None:
        if nc.connected_url is not None:
            self._server = _public_url(nc.connected_url.geturl())

    async def _on_error(self, exc: Exception) -> None:
        if isinstance(exc, nats.errors.SlowConsumerError):
            self.stats.slow_consumer_drops += 1
            return
        self._last_error = f"{type(exc).__name__}: {exc}".rstrip(": ")
        log.debug("nats error", server=self._server, error=self._last_error)

    async def _on_disconnected(self) -> None:
        if self._closing:
            return
        self.stats.disconnects += 1
        self._outage_peak = self._unsent
        log.warning("bridge disconnected", server=self._server, reason=self._last_error)
        self._notify(BridgeDisconnected(url=self._server, reason=self._last_error))

    async def _on_reconnected(self) -> None:
        if self._closing:
            return
        if self._nc is not None:
            self._remember_server(self._nc)
        # By now the senders may have emptied the buffers: report how full they got instead.
        buffered, self._outage_peak = max(self._outage_peak or 0, self._unsent), None
        log.info("bridge reconnected", server=self._server, buffered=buffered)
        self._notify(BridgeReconnected(url=self._server, buffered=buffered))

    def _notify(self, event: Event) -> None:
        # nats-py calls back from its own asyncio tasks: hand the event to a task of ours.
        if self._notices is not None:
            try:
                self._notices.send_nowait(event)
            except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
                log.warning("bridge notice dropped", event=type(event).__name__)

    async def _announce(self, bus: Bus, notices: MemoryObjectReceiveStream[Event]) -> None:
        async with notices:
            async for event in notices:
                await bus.publish(event)
                if isinstance(event, BridgeReconnected):
                    await self._read_facts(bus)  # what was said while we were away

    # --- facts: the last value of each state type ------------------------------------------

    def _state_subject(self, event_type: type[Event]) -> str:
        return f"platoon.{self.run_name}.state.{_tag(event_type)}"

    async def _ensure_state_stream(self, js: JetStreamContext) -> None:
        """Create the run's state stream, or clear the facts an earlier writer (a trainer this
        one replaces, under the same run name) left there."""
        try:
            await js.stream_info(self.state_stream)
            await js.purge_stream(self.state_stream)
        except nats.js.errors.NotFoundError:
            try:
                await js.add_stream(
                    name=self.state_stream,
                    subjects=[f"platoon.{self.run_name}.state.>"],
                    max_msgs_per_subject=1,
                    max_age=self.max_age,
                )
            except nats.js.errors.BadRequestError:
                pass  # another bridge made it first

    async def _write_fact(self, event: Event, data: bytes) -> None:
        """Keep `event` as the last value of its type (best effort: the mirror still carries it)."""
        if self._js is None:
            return
        try:
            with anyio.fail_after(self.ack_timeout):
                await self._js.publish(self._state_subject(type(event)), data)
        except (TimeoutError, nats.errors.Error) as exc:
            log.warning(
                "could not keep a fact in the state stream", type=type(event).__name__, error=str(exc)
            )

    async def _read_facts(self, bus: Bus) -> None:
        if not self.read_state or self._js is None:
            return
        for event_type in self.state:
            try:
                with anyio.fail_after(self.ack_timeout):
                    msg = await self._js.get_last_msg(self.state_stream, self._state_subject(event_type))
            except (TimeoutError, nats.errors.Error) as exc:
                log.debug("no fact in the state stream", type=event_type.__name__, error=str(exc))
                continue
            event = self._decode(msg)
            if event is not None:
                await self._deliver(bus, event)

    async def _connected(self, nc: NatsClient) -> None:
        while not nc.is_connected:
            if nc.is_closed:
                raise NatsBridgeError(f"the connection to NATS at {self._server} is closed")
            await anyio.sleep(0.01)

    # --- local bus -> NATS -----------------------------------------------------------------

    def _forwarder(self, subject: str, durable: bool) -> Any:
        async def forward(event: Event) -> None:
            if self._from_nats.get(id(event)) is event:
                del self._from_nats[id(event)]  # it came from NATS: never send it back
                return
            assert self._outbox is not None
            self._unsent += 1
            if self._outage_peak is not None:
                self._outage_peak = max(self._outage_peak, self._unsent)
            try:
                await _send(self._outbox, _Out(subject, durable, event))
            except BaseException:
                self._unsent -= 1
                raise

        return forward

    async def _send_loop(
        self,
        scope: anyio.CancelScope,
        nc: NatsClient,
        js: JetStreamContext | None,
        outbox: MemoryObjectReceiveStream[_Out],
        inflight: MemoryObjectSendStream[_Pending],
    ) -> None:
        core_headers = {ORIGIN_HEADER: self.origin}
        with scope:
            offering = anyio.Semaphore(OFFERS_AT_ONCE)
            async with outbox, inflight, anyio.create_task_group() as offers:
                # Taking what is buffered without yielding lets nats-py write a batch per syscall.
                while (out := await _receive(outbox)) is not None:
                    data = encode(out.event)
                    if type(out.event) in self.work:
                        offers.start_soon(self._offer, nc, out, data, offering)
                        continue
                    lease = self._lease_out(out.event)
                    if out.durable:
                        assert js is not None
                        headers = {ORIGIN_HEADER: self.origin, MSG_ID_HEADER: event_id(out.event)}
                        if lease:
                            # In the id too, so a forged event of the same episode, sent first,
                            # cannot make the stream drop the real one as a duplicate.
                            headers[MSG_ID_HEADER] += (
                                ":" + hashlib.blake2b(lease.encode(), digest_size=8).hexdigest()
                            )
                            headers[LEASE_HEADER] = lease
                        ack = await self._publish_async(nc, js, out.subject, data, headers)
                        deadline = anyio.current_time() + self.ack_timeout
                        pending = _Pending(out.subject, data, headers, ack, deadline, self.stats.disconnects)
                        await _send(inflight, pending)
                    else:
                        headers = {**core_headers, LEASE_HEADER: lease} if lease else core_headers
                        await self._publish_core(nc, out.subject, data, headers)
                        if self.write_state and type(out.event) in self.state:
                            await self._write_fact(out.event, data)
                        self._sent()
                # Closing: work nobody has claimed by now stays unsent (see `unsent_at_close`).
                offers.cancel_scope.cancel()

    async def _offer(self, nc: NatsClient, out: _Out, data: bytes, offering: anyio.Semaphore) -> None:
        """Offer one piece of work until a consumer claims it or its episode is withdrawn."""
        episode = _episode(out.event) or ""
        self._offering += 1
        settled = False  # claimed or withdrawn; not: cut off by closing
        try:
            async with offering:
                tries = 0
                while episode not in self._withdrawn:
                    outcome = await self._offer_once(nc, out, data, episode)
                    if outcome == "claimed":
                        break
                    tries += 1
                    if outcome != "unclaimed":  # (that one has waited `offer_timeout` already)
                        await anyio.sleep(self._retry_delay(tries))
            settled = True
        finally:
            self._offering -= 1
            if settled:
                self._sent()

    async def _offer_once(self, nc: NatsClient, out: _Out, data: bytes, episode: str) -> str:
        """One offer with a fresh nonce (and lease token): "claimed", "unclaimed" (a member took
        it and did not claim it in time), "no member", or "failed" (the connection failed)."""
        nonce = secrets.token_urlsafe(18)
        lease = self._lease_out(out.event)
        headers = {ORIGIN_HEADER: self.origin, OFFER_HEADER: nonce}
        if lease:
            headers[LEASE_HEADER] = lease
        await self._connected(nc)
        outcome = "failed"
        try:
            claim = await nc.request(out.subject, data, timeout=self.offer_timeout, headers=headers)
        except nats.errors.NoRespondersError:
            outcome = "no member"
            self.stats.offers_unheld += 1
            self._no_takers(episode)
        except (TimeoutError, nats.errors.Error) as exc:
            if isinstance(exc, TimeoutError) and nc.is_connected:
                outcome = "unclaimed"
                self.stats.offers_unclaimed += 1
                log.warning(
                    "work was not claimed in time: its worker hangs; offering it to another",
                    episode=episode,
                    offer_timeout=self.offer_timeout,
                )
        else:
            if claim.reply and secrets.compare_digest(claim.data, _proof("claim", nonce)):
                await self._report_claim(out.event)
                try:
                    await nc.publish(claim.reply, _proof("yours", nonce))
                except nats.errors.Error as exc:  # lost: the lease keeper re-requests the episode
                    log.debug("confirming a claim failed", episode=episode, error=str(exc))
                self._last_claim = anyio.current_time()
                return "claimed"
            outcome = "unclaimed"
            log.warning("a claim without the offer's proof: ignored", episode=episode)
        if lease and self.leases is not None:
            self.leases.revoke(episode, lease)  # nobody may report on an offer nobody holds
        return outcome

    async def _report_claim(self, event: Event) -> None:
        """Say on the local bus that a consumer holds this work now (its lease starts)."""
        episode = _episode(event)
        if episode is None or self._notices is None:
            return
        attempt = getattr(event, "attempt", 0)
        claimed = WorkClaimed(episode_id=episode, attempt=attempt if isinstance(attempt, int) else 0)
        try:
            await _send(self._notices, claimed)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # closing: nobody is left to time the lease

    def _retry_delay(self, tries: int) -> float:
        """After "no member": workers that just took work join again within a round trip, so
        try again soon while work is being claimed, and back off while it is not."""
        busy = anyio.current_time() - self._last_claim < 1.0
        cap = 0.05 if busy else self.reconnect_max_wait
        return min(0.005 * 2 ** min(tries, 30), cap) * random.uniform(0.5, 1.0)

    def _no_takers(self, episode: str) -> None:
        now = anyio.current_time()
        if now - self._no_takers_logged >= 30:
            self._no_takers_logged = now
            log.info("work waits: no worker is taking work now", episode=episode, waiting=self._offering)

    async def _publish_core(self, nc: NatsClient, subject: str, data: bytes, headers: dict[str, str]) -> None:
        while True:
            await self._connected(nc)
            try:
                await nc.publish(subject, data, headers=headers)
                return
            except nats.errors.OutboundBufferLimitError:
                await anyio.sleep(self.reconnect_wait)  # disconnected between the check and now

    async def _publish_async(
        self, nc: NatsClient, js: JetStreamContext, subject: str, data: bytes, headers: dict[str, str]
    ) -> asyncio.Future[Any] | None:
        await self._connected(nc)
        try:
            return await js.publish_async(subject, data, headers=dict(headers))
        except nats.errors.Error as exc:
            log.debug("durable publish failed, will retry", subject=subject, error=str(exc))
            return None  # the ack loop publishes it again

    async def _ack_loop(
        self,
        scope: anyio.CancelScope,
        nc: NatsClient,
        js: JetStreamContext | None,
        inflight: MemoryObjectReceiveStream[_Pending],
    ) -> None:
        with scope:
            async with inflight:
                while (pending := await _receive(inflight)) is not None:
                    assert js is not None
                    if not await self._acknowledged(pending):
                        await self._republish(nc, js, pending)
                    self._sent()

    async def _acknowledged(self, pending: _Pending) -> bool:
        ack = pending.ack
        if ack is None:
            return False
        if not ack.done() and pending.connection != self.stats.disconnects:
            return False  # sent on a connection that has dropped since: its ack will not come
        try:
            with anyio.fail_after(max(pending.deadline - anyio.current_time(), 0)):
                await ack
            return True
        except (TimeoutError, nats.errors.Error):
            return False

    async def _republish(self, nc: NatsClient, js: JetStreamContext, pending: _Pending) -> None:
        """Publish until the stream acknowledges; the message id makes repeats harmless."""
        attempt = 0
        while True:
            await self._connected(nc)
            try:
                await js.publish(
                    pending.subject, pending.data, headers=dict(pending.headers), timeout=self.ack_timeout
                )
                self.stats.republished += 1
                return
            except nats.js.errors.NoStreamResponseError:
                with anyio.move_on_after(self.ack_timeout):
                    await self._ensure_stream(js)  # a server that came back without its store
            except (TimeoutError, nats.errors.Error) as exc:
                log.debug("durable publish retry", subject=pending.subject, error=str(exc))
            attempt += 1
            await anyio.sleep(min(self.reconnect_wait * 2 ** min(attempt, 30), self.reconnect_max_wait))

    # --- NATS -> local bus -----------------------------------------------------------------

    async def _subscribe_nats(
        self, tg: TaskGroup, bus: Bus, nc: NatsClient, js: JetStreamContext | None
    ) -> None:
        # nats-py hands each subscription's messages to a callback in a task of its own; the
        # callbacks feed one bounded stream, and one task of ours publishes on the bus.
        inbound_send, inbound = anyio.create_memory_object_stream[Msg](self.buffer_limit)

        async def take(msg: Msg) -> None:
            try:
                await _send(inbound_send, msg)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass  # shutting down

        for event_type in self.mirror:
            self._subs.append(await nc.subscribe(subject_for(self.run_name, event_type), cb=take))
        tg.start_soon(self._receive_core, bus, inbound)
        for event_type in self.work if self.consume_work else ():
            subject = subject_for(self.run_name, event_type)
            tg.start_soon(self._take_work, tg, bus, nc, subject, await self._join(nc, subject))
        if self.consume_durable and js is not None:
            pull = await self._jetstream_call(self._durable_consumer(js))
            self._subs.append(pull)
            tg.start_soon(self._receive_durable, bus, nc, pull)

    async def _join(self, nc: NatsClient, subject: str) -> Any:
        """Join the work queue group for the next `take_at_once` offers; the server ends the
        membership after them, so a consumer that stops running drops out by itself."""
        member = await nc.subscribe(subject, queue=WORK_QUEUE)
        await member.unsubscribe(limit=self.take_at_once)
        self._members.add(member)
        return member

    async def _take_work(self, tg: TaskGroup, bus: Bus, nc: NatsClient, subject: str, member: Any) -> None:
        """Take one membership's offers. Its first offer joins the group again (we run, so we
        are healthy): the next membership is in place before this one ends, so offers never
        find a running consumer between memberships, and a hung one holds fewer than
        2 x `take_at_once` offers."""
        for taken in range(self.take_at_once):
            offer = await member.next_msg(timeout=None)
            tg.start_soon(self._claim, bus, nc, offer)
            if taken == 0:
                tg.start_soon(self._take_work, tg, bus, nc, subject, await self._join(nc, subject))
        self._members.discard(member)  # ended by the server

    async def _claim(self, bus: Bus, nc: NatsClient, offer: Msg) -> None:
        """Claim an offer and play it only once its producer confirms it is ours."""
        nonce = (offer.headers or {}).get(OFFER_HEADER)
        if nonce and offer.reply:
            inbox = nc.new_inbox()
            answers = await nc.subscribe(inbox)
            confirmed = False
            try:
                await nc.publish(offer.reply, _proof("claim", nonce), reply=inbox)
                with anyio.move_on_after(2 * self.offer_timeout):
                    while not confirmed:
                        answer = await answers.next_msg(timeout=None)
                        confirmed = secrets.compare_digest(answer.data, _proof("yours", nonce))
            except nats.errors.Error as exc:
                log.debug("claiming work failed", error=str(exc))
            finally:
                with anyio.CancelScope(shield=True):
                    try:
                        await answers.unsubscribe()
                    except nats.errors.Error:
                        pass
            if not confirmed:
                self.stats.claims_too_late += 1
                log.warning(
                    "work offered to this worker went to another: it was claimed too late",
                    subject=offer.subject,
                    offer_timeout=self.offer_timeout,
                )
                return
        event = self._decode(offer)
        if event is not None:
            await self._deliver(bus, event)

    async def _receive_core(self, bus: Bus, inbound: MemoryObjectReceiveStream[Msg]) -> None:
        async with inbound:
            while (msg := await _receive(inbound)) is not None:
                event = self._decode(msg)
                if event is not None:
                    await self._deliver(bus, event)

    async def _receive_durable(self, bus: Bus, nc: NatsClient, pull: Any) -> None:
        batch = min(self.buffer_limit, 256)
        while True:
            try:
                msgs = await pull.fetch(batch, timeout=1.0)
            except (TimeoutError, nats.errors.Error):
                if not nc.is_connected:
                    await self._connected(nc)
                continue
            for msg in msgs:
                event = self._decode(msg)
                if event is None:
                    await _settle(msg.term)  # never deliverable here: do not let it come back forever
                    continue
                key = event_id(event)
                if key in self._seen:
                    self.stats.duplicates += 1
                else:
                    await self._deliver(bus, event)
                    self._remember(key)
                await _settle(msg.ack)

    def _decode(self, msg: Msg) -> Event | None:
        if msg.headers and msg.headers.get(ORIGIN_HEADER) == self.origin:
            self.stats.echoes += 1
            return None
        try:
            event = decode(msg.data)
        except msgspec.DecodeError as exc:
            self.stats.undecodable += 1
            log.error(
                "undecodable event from NATS; is its plugin installed?", subject=msg.subject, error=str(exc)
            )
            return None
        return self._lease_in(event, (msg.headers or {}).get(LEASE_HEADER))

    def _lease_out(self, event: Event) -> str | None:
        """The lease token to send with `event`: a new one with work we hand out, else the
        one of its episode we were given."""
        episode = _episode(event)
        if self.leases is None or episode is None:
            return None
        if self.issue_leases and type(event) in self.work:
            return self.leases.issue(episode)
        return self.leases.token_for(episode)

    def _lease_in(self, event: Event, token: str | None) -> Event | None:
        episode = _episode(event)
        if self.leases is None or episode is None:
            return event
        if type(event) in self.work and self.consume_work:
            if token:
                self.leases.remember(episode, token)
            return event
        if self.issue_leases and not self.leases.valid(episode, token):
            self.stats.unleased += 1
            log.warning(
                "dropped an event of an episode its sender was not given",
                type=type(event).__name__,
                episode=episode,
                dropped=self.stats.unleased,
            )
            return None
        return event

    async def _deliver(self, bus: Bus, event: Event) -> None:
        self._from_nats[id(event)] = event
        await bus.publish(event)
        self.stats.received += 1

    def _remember(self, key: str) -> None:
        self._seen[key] = None
        if len(self._seen) > self.seen_limit:
            self._seen.popitem(last=False)

    # --- JetStream set-up ------------------------------------------------------------------

    def _durable_subjects(self) -> list[str]:
        return [subject_for(self.run_name, t) for t in self.durable]

    async def _ensure_stream(self, js: JetStreamContext) -> None:
        """Create the run's stream, or widen it to this bridge's durable subjects."""
        subjects = self._durable_subjects()
        try:
            info = await js.stream_info(self.stream_name)
        except nats.js.errors.NotFoundError:
            try:
                await js.add_stream(
                    name=self.stream_name,
                    subjects=subjects,
                    duplicate_window=self.duplicate_window,
                    max_age=self.max_age,
                    storage=api.StorageType.FILE,
                )
                return
            except nats.js.errors.BadRequestError:
                info = await js.stream_info(self.stream_name)  # another bridge made it first
        known = list(info.config.subjects or [])
        missing = [s for s in subjects if s not in known]
        if missing:
            await js.update_stream(config=info.config.evolve(subjects=known + missing))

    async def _durable_consumer(self, js: JetStreamContext) -> Any:
        subjects = self._durable_subjects()
        config = api.ConsumerConfig(
            durable_name=self.durable_name,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait,
            max_ack_pending=max(self.buffer_limit, 256),
            **({"filter_subject": subjects[0]} if len(subjects) == 1 else {"filter_subjects": subjects}),
        )
        await js.add_consumer(self.stream_name, config=config)
        return await js.pull_subscribe_bind(durable=self.durable_name, stream=self.stream_name)


def _require_asyncio() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise NatsBridgeError(
            "the NATS bridge needs anyio's asyncio backend (nats-py is asyncio-only); "
            "run the bus under asyncio, e.g. anyio.run(main, backend='asyncio')"
        ) from None


def _read_credentials(path: Path) -> dict[str, str]:
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


def _check_url(url: str) -> None:
    try:
        parts = urlsplit(url if "://" in url else f"nats://{url}")
        port = parts.port
    except ValueError as exc:
        raise NatsBridgeError(f"bad NATS URL {url!r}: {exc}") from None
    if port is not None and port < 1:
        raise NatsBridgeError(f"bad NATS URL {url!r}: port {port}")
    if parts.scheme not in _SCHEMES:
        raise NatsBridgeError(f"bad NATS URL {url!r}: the scheme must be one of {', '.join(_SCHEMES)}")
    if not parts.hostname:
        raise NatsBridgeError(f"bad NATS URL {url!r}: no host")


def _public_url(url: str) -> str:
    """The URL without user and password, fit for events and logs."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}"


def _check_types(kind: str, types: Sequence[type[Event]]) -> tuple[type[Event], ...]:
    registered = set(event_types())
    for event_type in types:
        if not (isinstance(event_type, type) and issubclass(event_type, Event)):
            raise NatsBridgeError(f"{kind}: {event_type!r} is not an Event type")
        if event_type not in registered:
            raise NatsBridgeError(
                f"{kind}: {event_type.__name__} is not registered; decorate it with @register_event"
            )
        if not _NAME.match(_tag(event_type)):
            raise NatsBridgeError(
                f"{kind}: the tag {_tag(event_type)!r} of {event_type.__name__} is not a NATS subject token"
            )
    return tuple(dict.fromkeys(types))


T = TypeVar("T")


async def _send(stream: MemoryObjectSendStream[T], item: T) -> None:
    """Send without a checkpoint while there is room (as the bus does), else wait for room."""
    try:
        stream.send_nowait(item)
    except anyio.WouldBlock:
        await stream.send(item)


async def _receive(stream: MemoryObjectReceiveStream[T]) -> T | None:
    """The next item, without a checkpoint while items are buffered; None once closed."""
    try:
        return stream.receive_nowait()
    except anyio.WouldBlock:
        try:
            return await stream.receive()
        except anyio.EndOfStream:
            return None
    except anyio.EndOfStream:
        return None


async def _synced(nc: NatsClient) -> None:
    """Return once the server has processed every command sent so far.

    `flush()` alone does not promise that: nats-py writes its PING straight to the socket,
    ahead of commands still queued for its flusher task, so the PONG can come back before
    the server has seen our SUB (and a publish from another connection then finds nobody).
    """
    with anyio.fail_after(10):
        while nc.pending_data_size and nc.is_connected:  # noqa: ASYNC110 - nats-py has no event for it
            await anyio.sleep(0.001)
    await nc.flush()


def _proof(purpose: str, nonce: str) -> bytes:
    """What shows knowledge of an offer's nonce without revealing it (claims travel on inboxes
    that others with the same credentials may read)."""
    return hashlib.blake2b(f"{purpose}:{nonce}".encode(), digest_size=16).hexdigest().encode()


async def _settle(acknowledge: Any) -> None:
    """Ack or term a JetStream message; if that is lost, the seen-set drops the redelivery."""
    try:
        await acknowledge()
    except nats.errors.Error as exc:
        log.debug("ack lost", error=str(exc))


async def _close_quietly(nc: NatsClient) -> None:
    try:
        await nc.close()
    except Exception as exc:  # a half-made connection may fail to close; nothing to keep
        log.debug("closing the NATS connection failed", error=f"{type(exc).__name__}: {exc}")

"""The bridge itself: a component that carries chosen event types between the local bus and
NATS, composed of its parts (connection, work offers and claims, durable results, facts,
leases). It owns what they share: the local subscriptions and the outbox they fill, the
origin id that prevents echoes, and the count of events not yet out (`flush`).

`attach(bus)` (called by `run_components`, or by `run` itself) subscribes to the outgoing
types before the connection exists, so nothing published early is missed.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Literal

import anyio
import msgspec
import nats.errors
import structlog
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription
from nats.js import JetStreamContext

from platoon.bus.codec import decode, encode
from platoon.bus.components import ComponentBase
from platoon.bus.core import Bus, Subscription
from platoon.bus.events import BridgeDisconnected, BridgeReconnected, Event, WorkClaimed, new_id
from platoon.bus.nats.buffers import receive, send
from platoon.bus.nats.connection import Connection, check_url, require_asyncio, synced
from platoon.bus.nats.durable import Durable, Pending
from platoon.bus.nats.facts import Facts
from platoon.bus.nats.leases import LeaseGate, Leases
from platoon.bus.nats.stats import BridgeStats
from platoon.bus.nats.wire import (
    BATCH_HEADER,
    LEASE_HEADER,
    LOCAL_ONLY,
    NAME,
    ORIGIN_HEADER,
    Carried,
    NatsBridgeError,
    check_types,
    subject_for,
    unpack_batch,
)
from platoon.bus.nats.work import Offers, Taker

log = structlog.get_logger("platoon.bus.nats")


class _Out(msgspec.Struct):
    subject: str
    durable: bool
    event: Event


class NatsBridge(ComponentBase):
    """A component that carries chosen event types between the local bus and NATS.

    `url` is one server or a list (a cluster); `credentials` a `.creds` file (needs `nkeys`);
    `tls` an `ssl.SSLContext`. `connect_timeout` bounds the first connection only: after
    that the bridge reconnects forever. Durable knobs: `ack_timeout` (how long a sender waits
    for the stream before publishing again), `ack_wait` (how long JetStream waits for our
    ack before redelivering: keep it above the longest stall of the local bus),
    `duplicate_window` and `max_age` (the stream's), `seen_limit` (ids remembered here).
    Work knobs: `offer_timeout` (how long a producer waits for a claim), `take_at_once` (the
    offers a consumer takes per membership; a batch of work is one offer), `withdraw` (see
    `platoon.bus.nats.work`).

    `unauthenticated`: what to do on a server that lets anyone in (no `auth_required` in its
    INFO), where anyone who reaches it may publish what steers a run: `allow` it, `warn`, or
    `refuse` (`run` fails with `NatsBridgeError` before it subscribes to anything).
    """

    name = "nats-bridge"
    # Any event its settings name; an instance declares its own (see `__init__`).
    subscribes: tuple[type[Event], ...] = (Event,)
    publishes: tuple[type[Event], ...] = (Event,)

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
        unauthenticated: Literal["allow", "warn", "refuse"] = "allow",
    ) -> None:
        self.urls = [url] if isinstance(url, str) else list(url)
        for one in self.urls:
            check_url(one)
        if not NAME.match(run):
            raise NatsBridgeError(
                f"run name {run!r} must be letters, digits, '-' or '_' (it is a subject token)"
            )
        if not NAME.match(durable_name):
            raise NatsBridgeError(f"durable_name {durable_name!r} must be letters, digits, '-' or '_'")
        if buffer_limit < 1:
            raise NatsBridgeError("buffer_limit must be at least 1")
        if offer_timeout <= 0 or take_at_once < 1:
            raise NatsBridgeError("offer_timeout must be positive and take_at_once at least 1")
        self.run_name = run
        self.mirror = check_types("mirror", mirror)
        self.work = check_types("work", work)
        self.durable = check_types("durable", durable)
        seen: dict[type[Event], str] = {}
        for kind, types in (("mirror", self.mirror), ("work", self.work), ("durable", self.durable)):
            for event_type in types:
                if event_type in seen:
                    raise NatsBridgeError(
                        f"{event_type.__name__} is both {seen[event_type]} and {kind}: pick one"
                    )
                seen[event_type] = kind
        for event_type in LOCAL_ONLY:
            if event_type in seen:
                raise NatsBridgeError(
                    f"{event_type.__name__} is this bridge's own fact, never carried over NATS"
                )
        if issue_leases and leases is None:
            leases = Leases(seen_limit)
        self.leases = leases
        self.issue_leases = issue_leases
        self.state = check_types("state", state)
        self.write_state = write_state
        self.read_state = read_state
        self.offer_timeout = offer_timeout
        self.take_at_once = take_at_once
        self.withdraw = check_types("withdraw", withdraw)
        self.unauthenticated = unauthenticated
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
        self.origin = new_id()
        self.stats = BridgeStats()
        # The parts, each with its own concern (see their modules).
        self.connection = Connection(
            self.urls,
            name=f"platoon:{run}:{self.origin[:8]}",
            stats=self.stats,
            credentials=credentials,
            tls=tls,
            connect_timeout=connect_timeout,
            reconnect_wait=reconnect_wait,
            reconnect_max_wait=reconnect_max_wait,
            closing=lambda: self._closing,
            disconnected=self._on_disconnected,
            reconnected=self._on_reconnected,
        )
        self.gate = LeaseGate(
            leases, issue=issue_leases, work=self.work, consume_work=consume_work, stats=self.stats
        )
        self.offers = Offers(
            connection=self.connection,
            gate=self.gate,
            stats=self.stats,
            origin=self.origin,
            offer_timeout=offer_timeout,
            withdrawn_limit=seen_limit,
            claimed=self._say,
        )
        self.taker = Taker(take_at_once=take_at_once, offer_timeout=offer_timeout, stats=self.stats)
        self.store = Durable(
            run,
            self.durable,
            connection=self.connection,
            stats=self.stats,
            origin=self.origin,
            durable_name=durable_name,
            ack_timeout=ack_timeout,
            ack_wait=ack_wait,
            duplicate_window=duplicate_window,
            max_age=max_age,
            buffer_limit=buffer_limit,
            seen_limit=seen_limit,
        )
        self.facts = Facts(
            run, self.state, write=write_state, read=read_state, timeout=ack_timeout, max_age=max_age
        )
        self.stream_name = self.store.stream
        self.state_stream = self.facts.stream
        self._js: JetStreamContext | None = None
        # Per run: what came in from NATS (by identity, until our own forwarder sees it), the
        # local subscriptions and the outbox they fill, and our NATS subscriptions.
        self._from_nats: dict[int, Event] = {}
        self._attached = False
        self._bus: Bus | None = None
        self._outgoing: list[Subscription[Event]] = []
        self._outbox: MemoryObjectSendStream[_Out] | None = None
        self._outbox_out: MemoryObjectReceiveStream[_Out] | None = None
        self._notices: MemoryObjectSendStream[Event] | None = None
        self._subs: list[NatsSubscription | JetStreamContext.PullSubscription] = []
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

    @property
    def server(self) -> str:
        """The server this bridge is (or was last) connected to, without credentials."""
        return self.connection.server

    # --- the component ---------------------------------------------------------------------

    def on_attach(self, bus: Bus) -> None:
        """Subscribe to the outgoing types now, so that what is published before the bridge
        has connected waits in its buffer instead of being missed (again after `run` ended)."""
        self._closing = False
        self._bus, self._from_nats, self._unsent, self._idle = bus, {}, 0, anyio.Event()
        self._outbox = self._outbox_out = None  # opened by the first event out, or by `run`
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
                    event_type, self.offers.withdraw, name=f"{self.name}:withdraw:{event_type.__name__}"
                )
            )

    def _open_outbox(self) -> MemoryObjectSendStream[_Out]:
        """The buffer between the bus and the NATS sender, opened when first needed, so that a
        bridge attached to a bus and never run holds no stream to close."""
        if self._outbox is None:
            self._outbox, self._outbox_out = anyio.create_memory_object_stream[_Out](self.buffer_limit)
        return self._outbox

    def _detach(self) -> None:
        for sub in self._outgoing:
            sub.close()
        self._outgoing, self._attached = [], False
        if self._outbox is not None:
            self._outbox.close()  # the sender ends once it has sent what is left

    async def run(self, bus: Bus, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Bridge until cancelled. With `await tg.start(bridge.run, bus)`, returns once live."""
        try:
            require_asyncio()
            self.attach(bus)
            self._open_outbox()
            self._subs = []
            self.taker.reset()
            nc = await self.connection.connect()
            try:
                self._check_authentication()
                await self._bridge(bus, nc, task_status)
            finally:
                self._closing = True
                with anyio.CancelScope(shield=True), anyio.move_on_after(self.close_timeout):
                    await self.connection.leave(nc, [*self._subs, *self.taker.subscriptions()])
        finally:
            self._closing = True
            self._detach()
            if self._outbox_out is not None:
                self._outbox_out.close()  # the sender has ended (or never started: no server)
            if self._unsent:
                self.stats.unsent_at_close += self._unsent
                log.warning(
                    "bridge closed with events not sent to NATS", server=self.server, unsent=self._unsent
                )
            if self._idle is not None:
                self._idle.set()  # wake `flush` callers: nothing more will go out

    def _check_authentication(self) -> None:
        if self.connection.auth_required or self.unauthenticated == "allow":
            return
        if self.unauthenticated == "refuse":
            raise NatsBridgeError(
                f"NATS at {self.server} lets anyone in, so anyone who reaches it could steer this run "
                "(announce a policy, end it): start nats-server with the config `platoon nats init` "
                "writes and set nats.credentials_file, or set nats.insecure=true if only you reach it"
            )
        log.warning(
            "NATS lets anyone in: whoever reaches it can read this run's events and steer its workers "
            "(use `platoon nats init`, or set nats.insecure: true if only you reach it)",
            server=self.server,
        )

    async def _bridge(self, bus: Bus, nc: NatsClient, task_status: TaskStatus[None]) -> None:
        assert self._outbox_out is not None
        js = nc.jetstream() if self.durable or self.state else None
        self._js = js
        if js is not None and self.durable:
            await self.connection.jetstream_call(self.store.ensure(js))
        if js is not None and self.write_state:
            await self.connection.jetstream_call(self.facts.ensure(js))
        notices_send, notices = anyio.create_memory_object_stream[Event](64)
        inflight_send, inflight = anyio.create_memory_object_stream[Pending](self.buffer_limit)
        inbound_send, inbound = anyio.create_memory_object_stream[Msg](self.buffer_limit)
        self._notices = notices_send
        # The senders are shielded from cancellation so that, at shutdown, they can empty the
        # buffers; closing the outbox ends them, and `close_timeout` bounds how long they try.
        send_scope, ack_scope = anyio.CancelScope(shield=True), anyio.CancelScope(shield=True)
        # What NATS's callbacks and our notices write into is closed when the bridge is down.
        with notices_send, notices, inbound_send, inbound, inflight_send, inflight:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._send_loop, send_scope, nc, js, self._outbox_out, inflight_send)
                tg.start_soon(self.store.ack_loop, ack_scope, nc, js, inflight, self._sent)
                try:
                    tg.start_soon(self._announce, bus, notices)
                    await self._subscribe_nats(tg, bus, nc, js, inbound_send, inbound)
                    await synced(nc)
                    await self._read_facts(bus)
                    log.info("bridge up", server=self.server, run=self.run_name, origin=self.origin)
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

    # --- what the bridge says on the local bus ---------------------------------------------

    def _on_disconnected(self) -> None:
        self._outage_peak = self._unsent
        self._notify(BridgeDisconnected(url=self.server, reason=self.connection.last_error))

    def _on_reconnected(self) -> None:
        # By now the senders may have emptied the buffers: report how full they got instead.
        buffered, self._outage_peak = max(self._outage_peak or 0, self._unsent), None
        log.info("bridge reconnected", server=self.server, buffered=buffered)
        self._notify(BridgeReconnected(url=self.server, buffered=buffered))

    def _notify(self, event: Event) -> None:
        # nats-py calls back from its own asyncio tasks: hand the event to a task of ours.
        if self._notices is not None:
            try:
                self._notices.send_nowait(event)
            except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
                log.warning("bridge notice dropped", event=type(event).__name__)

    async def _say(self, event: Event) -> None:
        """Publish `event` on the local bus through our notices, waiting for room (a claim
        must not be dropped: the trainer's lease of the episode starts with it)."""
        if self._notices is None:
            return
        try:
            await send(self._notices, event)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # closing: nobody is left to hear it

    async def _announce(self, bus: Bus, notices: MemoryObjectReceiveStream[Event]) -> None:
        async with notices:
            async for event in notices:
                await bus.publish(event)
                if isinstance(event, BridgeReconnected):
                    await self._read_facts(bus)  # what was said while we were away

    async def _read_facts(self, bus: Bus) -> None:
        for msg in await self.facts.last(self._js):
            event = self._decode(msg)
            if event is not None:
                await self._deliver(bus, event)

    # --- local bus -> NATS -----------------------------------------------------------------

    def _forwarder(self, subject: str, durable: bool) -> Callable[[Event], Awaitable[None]]:
        async def forward(event: Event) -> None:
            if self._from_nats.get(id(event)) is event:
                del self._from_nats[id(event)]  # it came from NATS: never send it back
                return
            outbox = self._open_outbox()
            self._unsent += 1
            if self._outage_peak is not None:
                self._outage_peak = max(self._outage_peak, self._unsent)
            try:
                await send(outbox, _Out(subject, durable, event))
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
        inflight: MemoryObjectSendStream[Pending],
    ) -> None:
        core_headers = {ORIGIN_HEADER: self.origin}
        with scope:
            self.offers.reset()
            async with outbox, inflight, anyio.create_task_group() as offers:
                # Taking what is buffered without yielding lets nats-py write a batch per syscall.
                while (out := await receive(outbox)) is not None:
                    data = encode(out.event)
                    if type(out.event) in self.work:
                        self.offers.submit(offers, nc, out.subject, out.event, data, self._sent)
                        continue
                    lease = self.gate.token_out(out.event)
                    if out.durable:
                        assert js is not None
                        headers = self.store.headers(out.event, lease)
                        await self.store.publish(nc, js, out.subject, data, headers, inflight)
                    else:
                        headers = {**core_headers, LEASE_HEADER: lease} if lease else core_headers
                        await self._publish_core(nc, out.subject, data, headers)
                        if self.facts.kept(out.event):
                            await self.facts.keep(js, out.event, data)
                        self._sent()
                # Closing: work nobody has claimed by now stays unsent (see `unsent_at_close`).
                offers.cancel_scope.cancel()

    async def _publish_core(self, nc: NatsClient, subject: str, data: bytes, headers: dict[str, str]) -> None:
        while True:
            await self.connection.connected(nc)
            try:
                await nc.publish(subject, data, headers=headers)
                return
            except nats.errors.OutboundBufferLimitError:
                await anyio.sleep(self.reconnect_wait)  # disconnected between the check and now

    # --- NATS -> local bus -----------------------------------------------------------------

    async def _subscribe_nats(
        self,
        tg: TaskGroup,
        bus: Bus,
        nc: NatsClient,
        js: JetStreamContext | None,
        inbound_send: MemoryObjectSendStream[Msg],
        inbound: MemoryObjectReceiveStream[Msg],
    ) -> None:
        # nats-py hands each subscription's messages to a callback in a task of its own; the
        # callbacks feed one bounded stream, and one task of ours publishes on the bus.

        async def take(msg: Msg) -> None:
            try:
                await send(inbound_send, msg)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                pass  # shutting down

        async def play(msg: Msg) -> None:
            for event in self._decode_work(msg):
                await self._deliver(bus, event)

        for event_type in self.mirror:
            self._subs.append(await nc.subscribe(subject_for(self.run_name, event_type), cb=take))
        tg.start_soon(self._receive_core, bus, inbound)
        if self.consume_work and self.work:
            await self.taker.listen(nc)
        for event_type in self.work if self.consume_work else ():
            subject = subject_for(self.run_name, event_type)
            tg.start_soon(self.taker.take, tg, nc, subject, await self.taker.join(nc, subject), play)
        if self.consume_durable and js is not None:
            pull = await self.connection.jetstream_call(self.store.consumer(js))
            self._subs.append(pull)
            tg.start_soon(self.store.receive_loop, bus, nc, pull, self._decode, self._deliver)

    async def _receive_core(self, bus: Bus, inbound: MemoryObjectReceiveStream[Msg]) -> None:
        async with inbound:
            while (msg := await receive(inbound)) is not None:
                event = self._decode(msg)
                if event is not None:
                    await self._deliver(bus, event)

    def _decode(self, msg: Carried) -> Event | None:
        if msg.headers and msg.headers.get(ORIGIN_HEADER) == self.origin:
            self.stats.echoes += 1
            return None
        return self._admit(msg.data or b"", (msg.headers or {}).get(LEASE_HEADER), msg.subject)

    def _decode_work(self, msg: Msg) -> list[Event]:
        """The events of a work offer: one, or each of a batch with its own lease token."""
        headers = msg.headers or {}
        if BATCH_HEADER not in headers:
            event = self._decode(msg)
            return [] if event is None else [event]
        if headers.get(ORIGIN_HEADER) == self.origin:
            self.stats.echoes += 1
            return []
        try:
            batch = unpack_batch(msg.data)
        except msgspec.DecodeError as exc:
            self.stats.undecodable += 1
            log.error("undecodable batch of work from NATS", subject=msg.subject, error=str(exc))
            return []
        events = (self._admit(data, lease, msg.subject) for data, lease in batch)
        return [event for event in events if event is not None]

    def _admit(self, data: bytes | memoryview, lease: str | None, subject: str | None) -> Event | None:
        try:
            event = decode(data)
        except msgspec.DecodeError as exc:
            self.stats.undecodable += 1
            log.error(
                "undecodable event from NATS; is its plugin installed?", subject=subject, error=str(exc)
            )
            return None
        return self.gate.admit(event, lease)

    async def _deliver(self, bus: Bus, event: Event) -> None:
        self._from_nats[id(event)] = event
        await bus.publish(event)
        self.stats.received += 1

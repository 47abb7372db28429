"""The bridge itself: a component that carries chosen event types between the local bus and
NATS, composed of its parts (connection, work offers and claims, durable results, facts,
leases). It owns what they share: the local subscriptions and the outbox they fill, the
origin id that prevents echoes, and the count of events not yet out (`flush`).

`attach(bus)` (called by `run_components`, or by `run` itself) subscribes to the outgoing
types before the connection exists, so nothing published early is missed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

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
from platoon.bus.nats.settings import ConnectionSettings, Limits, Routes
from platoon.bus.nats.stats import BridgeStats
from platoon.bus.nats.wire import (
    BATCH_HEADER,
    LEASE_HEADER,
    NAME,
    ORIGIN_HEADER,
    Carried,
    NatsBridgeError,
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

    `url` is one server or a list (a cluster); `run` the run's subject token. What it carries
    is `routes`, how it connects `connection`, its bounds `limits` (see `settings.py`):

        NatsBridge(url, run="exp1", routes=Routes(mirror=[PolicyUpdated]))

    `leases`: who was given an episode may report on it (see `leases.py`); a bridge that
    offers work with `issue_leases` makes its own when none is given.
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
        routes: Routes = Routes(),
        connection: ConnectionSettings = ConnectionSettings(),
        limits: Limits = Limits(),
        leases: Leases | None = None,
        issue_leases: bool = False,
    ) -> None:
        self.urls = [url] if isinstance(url, str) else list(url)
        for one in self.urls:
            check_url(one)
        if not NAME.match(run):
            raise NatsBridgeError(
                f"run name {run!r} must be letters, digits, '-' or '_' (it is a subject token)"
            )
        self.run_name = run
        self.routes = routes
        self.limits = limits
        self.origin = new_id()
        self.stats = BridgeStats()
        self._compose(connection, leases, issue_leases)
        self._forget_run()
        # It takes what it sends out and publishes what it brings in, and its notices.
        self.subscribes = (*routes.mirror, *routes.work, *routes.durable, *routes.withdraw)
        notices = (BridgeDisconnected, BridgeReconnected, *((WorkClaimed,) if routes.work else ()))
        self.publishes = (*routes.carried_in(), *notices)

    def _compose(self, settings: ConnectionSettings, leases: Leases | None, issue_leases: bool) -> None:
        """Make the parts, each with its own concern (see their modules)."""
        routes, limits, run = self.routes, self.limits, self.run_name
        self.connection = Connection(
            self.urls,
            settings,
            name=f"platoon:{run}:{self.origin[:8]}",
            stats=self.stats,
            closing=lambda: self._closing,
            disconnected=self._on_disconnected,
            reconnected=self._on_reconnected,
        )
        if issue_leases and leases is None:
            leases = Leases(limits.seen_limit)
        self.leases = leases
        self.gate = LeaseGate(
            leases, issue=issue_leases, work=routes.work, consume_work=routes.consume_work, stats=self.stats
        )
        self.offers = Offers(
            connection=self.connection,
            gate=self.gate,
            stats=self.stats,
            origin=self.origin,
            offer_timeout=limits.offer_timeout,
            withdrawn_limit=limits.seen_limit,
            claimed=self._say,
        )
        self.taker = Taker(
            take_at_once=limits.take_at_once, offer_timeout=limits.offer_timeout, stats=self.stats
        )
        self.store = Durable(
            run,
            routes.durable,
            connection=self.connection,
            stats=self.stats,
            origin=self.origin,
            durable_name=routes.durable_name,
            limits=limits,
        )
        self.facts = Facts(
            run,
            routes.state,
            write=routes.write_state,
            read=routes.read_state,
            timeout=limits.ack_timeout,
            max_age=limits.max_age,
        )
        self.stream_name = self.store.stream
        self.state_stream = self.facts.stream

    def _forget_run(self) -> None:
        """What one run holds: what came in from NATS (by identity, until our own forwarder
        sees it), the local subscriptions and the outbox they fill, and our NATS subscriptions."""
        self._js: JetStreamContext | None = None
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
        routes = self.routes
        for durable, types in ((False, (*routes.mirror, *routes.work)), (True, routes.durable)):
            for event_type in types:
                self._outgoing.append(
                    bus.subscribe(
                        event_type,
                        self._forwarder(subject_for(self.run_name, event_type), durable),
                        name=f"{self.name}:{event_type.__name__}",
                        buffer=min(self.limits.buffer_limit, 64),
                    )
                )
        for event_type in routes.withdraw:
            self._outgoing.append(
                bus.subscribe(
                    event_type, self.offers.withdraw, name=f"{self.name}:withdraw:{event_type.__name__}"
                )
            )

    def _open_outbox(self) -> MemoryObjectSendStream[_Out]:
        """The buffer between the bus and the NATS sender, opened when first needed, so that a
        bridge attached to a bus and never run holds no stream to close."""
        if self._outbox is None:
            self._outbox, self._outbox_out = anyio.create_memory_object_stream[_Out](self.limits.buffer_limit)
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
                with (
                    anyio.CancelScope(shield=True),
                    anyio.move_on_after(self.connection.settings.close_timeout),
                ):
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
        unauthenticated = self.connection.settings.unauthenticated
        if self.connection.auth_required or unauthenticated == "allow":
            return
        if unauthenticated == "refuse":
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
        routes, buffer_limit = self.routes, self.limits.buffer_limit
        js = nc.jetstream() if routes.durable or routes.state else None
        self._js = js
        if js is not None and routes.durable:
            await self.connection.jetstream_call(self.store.ensure(js))
        if js is not None and routes.write_state:
            await self.connection.jetstream_call(self.facts.ensure(js))
        notices_send, notices = anyio.create_memory_object_stream[Event](64)
        inflight_send, inflight = anyio.create_memory_object_stream[Pending](buffer_limit)
        inbound_send, inbound = anyio.create_memory_object_stream[Msg](buffer_limit)
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
                    deadline = anyio.current_time() + self.connection.settings.close_timeout
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
                    if type(out.event) in self.routes.work:
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
                await anyio.sleep(
                    self.connection.settings.reconnect_wait
                )  # disconnected between the check and now

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

        routes = self.routes
        for event_type in routes.mirror:
            self._subs.append(await nc.subscribe(subject_for(self.run_name, event_type), cb=take))
        tg.start_soon(self._receive_core, bus, inbound)
        if routes.consume_work and routes.work:
            await self.taker.listen(nc)
        for event_type in routes.work if routes.consume_work else ():
            subject = subject_for(self.run_name, event_type)
            tg.start_soon(self.taker.take, tg, nc, subject, await self.taker.join(nc, subject), play)
        if routes.consume_durable and js is not None:
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

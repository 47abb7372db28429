"""Durable events: JetStream, for results whose loss would cost training data.

The sender waits for the stream's acknowledgement and publishes again after a timeout or a
disconnect; a bridge with `consume_durable=True` reads a durable consumer (`durable_name`) and
acknowledges a message only after the local bus accepted it. Each message carries the event's
natural id (`call_id`, `episode_id` or `request_id`, else a hash of its bytes) as
`Nats-Msg-Id`, so the stream drops re-sends, and a bounded set of seen ids drops redeliveries.
Bridges that share a `durable_name` share its messages.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence

import anyio
import msgspec
import nats.errors
import nats.js.errors
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from platoon.bus.core import Bus
from platoon.bus.events import Event
from platoon.bus.nats.buffers import receive, send
from platoon.bus.nats.connection import Connection
from platoon.bus.nats.settings import Limits
from platoon.bus.nats.stats import BridgeStats
from platoon.bus.nats.wire import LEASE_HEADER, MSG_ID_HEADER, ORIGIN_HEADER, event_id, subject_for

log = structlog.get_logger("platoon.bus.nats")


class Pending(msgspec.Struct):
    """A durable publish waiting for the stream's acknowledgement."""

    subject: str
    data: bytes
    headers: dict[str, str]
    ack: asyncio.Future[api.PubAck] | None
    deadline: float  # when to give up waiting for `ack` and publish again
    connection: int  # which connection it went out on (the count of disconnects then)


class Durable:
    """The run's result stream (`platoon-<run>`): publishing into it until stored, and reading
    it through a durable consumer."""

    def __init__(
        self,
        run: str,
        types: Sequence[type[Event]],
        *,
        connection: Connection,
        stats: BridgeStats,
        origin: str,
        durable_name: str,
        limits: Limits,
    ) -> None:
        self.run = run
        self.types = types
        self.connection = connection
        self.stats = stats
        self.origin = origin
        self.durable_name = durable_name
        self.limits = limits
        self.stream = f"platoon-{run}"
        self._seen: OrderedDict[str, None] = OrderedDict()

    # --- sending ---------------------------------------------------------------------------

    def headers(self, event: Event, lease: str | None) -> dict[str, str]:
        headers = {ORIGIN_HEADER: self.origin, MSG_ID_HEADER: event_id(event)}
        if lease:
            # In the id too, so a forged event of the same episode, sent first, cannot make
            # the stream drop the real one as a duplicate.
            headers[MSG_ID_HEADER] += ":" + hashlib.blake2b(lease.encode(), digest_size=8).hexdigest()
            headers[LEASE_HEADER] = lease
        return headers

    async def publish(
        self,
        nc: NatsClient,
        js: JetStreamContext,
        subject: str,
        data: bytes,
        headers: dict[str, str],
        inflight: MemoryObjectSendStream[Pending],
    ) -> None:
        """Publish without waiting for the acknowledgement; `acknowledged` waits for it."""
        await self.connection.connected(nc)
        try:
            ack = await js.publish_async(subject, data, headers=dict(headers))
        except nats.errors.Error as exc:
            log.debug("durable publish failed, will retry", subject=subject, error=str(exc))
            ack = None  # the ack loop publishes it again
        deadline = anyio.current_time() + self.limits.ack_timeout
        await send(inflight, Pending(subject, data, headers, ack, deadline, self.stats.disconnects))

    async def ack_loop(
        self,
        scope: anyio.CancelScope,
        nc: NatsClient,
        js: JetStreamContext | None,
        inflight: MemoryObjectReceiveStream[Pending],
        sent: Callable[[], None],
    ) -> None:
        with scope:
            async with inflight:
                while (pending := await receive(inflight)) is not None:
                    assert js is not None
                    if not await self._acknowledged(pending):
                        self.stats.ack_timeouts += 1
                        await self._republish(nc, js, pending)
                    sent()

    async def _acknowledged(self, pending: Pending) -> bool:
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

    async def _republish(self, nc: NatsClient, js: JetStreamContext, pending: Pending) -> None:
        """Publish until the stream acknowledges; the message id makes repeats harmless."""
        attempt = 0
        while True:
            await self.connection.connected(nc)
            try:
                await js.publish(
                    pending.subject,
                    pending.data,
                    headers=dict(pending.headers),
                    timeout=self.limits.ack_timeout,
                )
                self.stats.republished += 1
                return
            except nats.js.errors.NoStreamResponseError:
                with anyio.move_on_after(self.limits.ack_timeout):
                    await self.ensure(js)  # a server that came back without its store
            except (TimeoutError, nats.errors.Error) as exc:
                log.debug("durable publish retry", subject=pending.subject, error=str(exc))
            attempt += 1
            wait, most = self.connection.settings.reconnect_wait, self.connection.settings.reconnect_max_wait
            await anyio.sleep(min(wait * 2 ** min(attempt, 30), most))

    # --- receiving -------------------------------------------------------------------------

    async def receive_loop(
        self,
        bus: Bus,
        nc: NatsClient,
        pull: JetStreamContext.PullSubscription,
        decode: Callable[[Msg], Event | None],
        deliver: Callable[[Bus, Event], Awaitable[None]],
    ) -> None:
        batch = min(self.limits.buffer_limit, 256)
        while True:
            try:
                msgs = await pull.fetch(batch, timeout=1.0)
            except (TimeoutError, nats.errors.Error):
                if not nc.is_connected:
                    await self.connection.connected(nc)
                continue
            for msg in msgs:
                event = decode(msg)
                if event is None:
                    await settle(msg.term)  # never deliverable here: do not let it come back forever
                    continue
                key = event_id(event)
                if key in self._seen:
                    self.stats.duplicates += 1
                else:
                    await deliver(bus, event)
                    self._remember(key)
                await settle(msg.ack)

    def _remember(self, key: str) -> None:
        self._seen[key] = None
        if len(self._seen) > self.limits.seen_limit:
            self._seen.popitem(last=False)

    # --- set-up ----------------------------------------------------------------------------

    def subjects(self) -> list[str]:
        return [subject_for(self.run, t) for t in self.types]

    async def ensure(self, js: JetStreamContext) -> None:
        """Create the run's stream, or widen it to this bridge's durable subjects."""
        subjects = self.subjects()
        try:
            info = await js.stream_info(self.stream)
        except nats.js.errors.NotFoundError:
            try:
                await js.add_stream(
                    name=self.stream,
                    subjects=subjects,
                    duplicate_window=self.limits.duplicate_window,
                    max_age=self.limits.max_age,
                    storage=api.StorageType.FILE,
                )
                return
            except nats.js.errors.BadRequestError:
                info = await js.stream_info(self.stream)  # another bridge made it first
        known = list(info.config.subjects or [])
        missing = [s for s in subjects if s not in known]
        if missing:
            await js.update_stream(config=info.config.evolve(subjects=known + missing))

    async def consumer(self, js: JetStreamContext) -> JetStreamContext.PullSubscription:
        subjects = self.subjects()
        config = api.ConsumerConfig(
            durable_name=self.durable_name,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.limits.ack_wait,
            max_ack_pending=max(self.limits.buffer_limit, 256),
            **({"filter_subject": subjects[0]} if len(subjects) == 1 else {"filter_subjects": subjects}),
        )
        await js.add_consumer(self.stream, config=config)
        return await js.pull_subscribe_bind(durable=self.durable_name, stream=self.stream)


async def settle(acknowledge: Callable[[], Awaitable[None]]) -> None:
    """Ack or term a JetStream message; if that is lost, the seen-set drops the redelivery."""
    try:
        await acknowledge()
    except nats.errors.Error as exc:
        log.debug("ack lost", error=str(exc))

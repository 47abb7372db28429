"""Work: events each of which one consumer must play, such as an episode's request.

Work is offered to a queue group and kept only by a consumer that claims it. The producer
sends each event as a NATS request with a fresh nonce; the server hands it to one member of
the group, which claims it (a proof of the nonce, on the request's reply subject), and plays
it only once the producer confirms. An offer nobody holds (no member), or that is not claimed
within `offer_timeout` (a member that hangs), is offered again, so work is never lost to a hung
or absent consumer, and none is played twice. When an offer of an episode's work is claimed,
the producer says so on its own bus (`WorkClaimed`, never carried over NATS): the trainer's
lease of that episode starts there, not at the request.

Work goes out alone and at once while fewer than `OFFERS_AT_ONCE` offers are out; work that
had to wait goes out in batches when an offer settles: its share of what waits (spread over
`OFFERS_AT_ONCE` offers, so that consumers share a burst), up to `BATCH_EVENTS` events and
`BATCH_BYTES` bytes. A burst costs one round trip per batch instead of one per event, and no
event waits for a batch to fill. A batch is one offer (one nonce, one claim, one
confirmation); the consumer that claims it plays every event in it. Each event keeps its own
lease token, its episode's `WorkClaimed`, and its withdrawal: a batch offered again leaves out
the events of withdrawn episodes. A consumer that takes single events only (an older
platoon) cannot claim a batch: its claim is told apart, and the batch is offered again one
event at a time.

Membership is short: a consumer joins the group for `take_at_once` offers (batches count as
one), and joins again at the first offer of each membership, which only a consumer whose
event loop runs can do. A hung one (SIGSTOP, a stalled loop) drops out of the group by
itself after fewer than 2 x `take_at_once` offers, and is back once it runs. An event of a
type in `withdraw` ends the offering of its episode's work (the trainer gave that episode
up). A bridge may both produce and consume work: the server never hands an event back to the
connection that sent it.
"""

from __future__ import annotations

import hashlib
import random
import secrets
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import anyio
import nats.errors
import structlog
from anyio.abc import TaskGroup
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription as NatsSubscription

from platoon.bus.events import Event, WorkClaimed
from platoon.bus.nats.connection import Connection
from platoon.bus.nats.leases import LeaseGate
from platoon.bus.nats.stats import BridgeStats
from platoon.bus.nats.wire import (
    BATCH_HEADER,
    LEASE_HEADER,
    OFFER_HEADER,
    ORIGIN_HEADER,
    WORK_QUEUE,
    episode_of,
    pack_batch,
)

log = structlog.get_logger("platoon.bus.nats")

OFFERS_AT_ONCE = 32  # offers a producer has out at a time; the rest wait their turn
BATCH_EVENTS = 64  # the most work events one offer carries
BATCH_BYTES = 512 * 1024  # and their most bytes (one larger event still goes, alone)
CLAIM_BATCH = "claim batch"  # what a claim of a batch proves (see `proof`)


class _Work(NamedTuple):
    subject: str
    event: Event
    data: bytes  # the event in the bus's wire form
    episode: str  # "" for none


class Offers:
    """The producer's side: offer work until a consumer claims it or its episode is
    withdrawn. Work goes out at once while fewer than `OFFERS_AT_ONCE` offers are out; what
    waits for one to settle goes out in batches of up to `BATCH_EVENTS` events."""

    def __init__(
        self,
        *,
        connection: Connection,
        gate: LeaseGate,
        stats: BridgeStats,
        origin: str,
        offer_timeout: float,
        withdrawn_limit: int,
        claimed: Callable[[Event], Awaitable[None]],
    ) -> None:
        self.connection = connection
        self.gate = gate
        self.stats = stats
        self.origin = origin
        self.offer_timeout = offer_timeout
        self.withdrawn_limit = withdrawn_limit
        self.claimed = claimed  # says `WorkClaimed` on the local bus
        self.offering = 0  # work events not settled yet: in offers out now, or waiting for one
        self._out = 0  # offers out now (each of one or more events)
        self._waiting: deque[_Work] = deque()  # work waiting for an offer to settle
        self._withdrawn: OrderedDict[str, None] = OrderedDict()
        self._no_takers_logged = -1e9
        self._last_claim = -1e9

    def reset(self) -> None:
        """Forget the work of a run that has ended (it counts as unsent at close)."""
        self.offering, self._out, self._waiting = 0, 0, deque()

    def withdraw(self, event: Event) -> None:
        """End the offers of `event`'s episode at their next try."""
        episode = episode_of(event)
        if episode is not None:
            self._withdrawn[episode] = None
            while len(self._withdrawn) > self.withdrawn_limit:
                self._withdrawn.popitem(last=False)

    def submit(
        self, tg: TaskGroup, nc: NatsClient, subject: str, event: Event, data: bytes, sent: Callable[[], None]
    ) -> None:
        """Offer one piece of work: at once, alone, if an offer may go out now, else with what
        waits when one settles. `sent()` once each event is settled (claimed or withdrawn;
        not when closing cut its offer off)."""
        work = _Work(subject, event, data, episode_of(event) or "")
        self.offering += 1
        if self._out < OFFERS_AT_ONCE:
            self._out += 1
            tg.start_soon(self._offer_until_idle, nc, [work], sent)
        else:
            self._waiting.append(work)

    async def _offer_until_idle(self, nc: NatsClient, batch: list[_Work], sent: Callable[[], None]) -> None:
        """Settle `batch`, then the batches of what waits meanwhile, until nothing waits."""
        try:
            while batch:
                await self._settle(nc, batch, sent)
                batch = self._next_batch(nc)
        finally:
            self._out -= 1

    def _next_batch(self, nc: NatsClient) -> list[_Work]:
        """The work waiting longest: its share of what waits, spread over the offers that may
        be out (so consumers share a burst as they would one event per offer), up to
        `BATCH_EVENTS` events of one subject that fit in a message."""
        batch: list[_Work] = []
        share = min(BATCH_EVENTS, -(-len(self._waiting) // OFFERS_AT_ONCE))
        room = min(BATCH_BYTES, nc.max_payload // 2)
        while self._waiting and len(batch) < share:
            work = self._waiting[0]
            if batch and (work.subject != batch[0].subject or len(work.data) > room):
                break
            batch.append(self._waiting.popleft())
            room -= len(work.data)
        return batch

    async def _settle(self, nc: NatsClient, batch: list[_Work], sent: Callable[[], None]) -> None:
        """Offer `batch` until a consumer claims it, dropping the events of withdrawn episodes
        before each try."""
        tries = 0
        while True:
            live = [work for work in batch if work.episode not in self._withdrawn]
            self._settled(len(batch) - len(live), sent)
            batch = live
            if not batch:
                return
            outcome = await self._offer_once(nc, batch)
            if outcome == "claimed":
                self._settled(len(batch), sent)
                return
            if outcome == "one at a time":
                for work in batch:
                    await self._settle(nc, [work], sent)
                return
            tries += 1
            if outcome != "unclaimed":  # (that one has waited `offer_timeout` already)
                await anyio.sleep(self._retry_delay(tries))

    def _settled(self, count: int, sent: Callable[[], None]) -> None:
        self.offering -= count
        for _ in range(count):
            sent()

    async def _offer_once(self, nc: NatsClient, batch: list[_Work]) -> str:
        """One offer with a fresh nonce (and lease tokens): "claimed", "unclaimed" (a member
        took it and did not claim it in time), "no member", "failed" (the connection failed),
        or "one at a time" (a batch claimed by a consumer that takes single events only)."""
        nonce = secrets.token_urlsafe(18)
        leases = [self.gate.token_out(work.event) for work in batch]
        headers = {ORIGIN_HEADER: self.origin, OFFER_HEADER: nonce}
        if len(batch) == 1:
            data, purpose = batch[0].data, "claim"
            if leases[0]:
                headers[LEASE_HEADER] = leases[0]
        else:
            data, purpose = pack_batch([work.data for work in batch], leases), CLAIM_BATCH
            headers[BATCH_HEADER] = str(len(batch))
        episode = batch[0].episode
        await self.connection.connected(nc)
        outcome = "failed"
        try:
            claim = await nc.request(batch[0].subject, data, timeout=self.offer_timeout, headers=headers)
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
                    events=len(batch),
                    offer_timeout=self.offer_timeout,
                )
        else:
            if claim.reply and secrets.compare_digest(claim.data, proof(purpose, nonce)):
                for work in batch:
                    await self._report_claim(work.event)
                try:
                    await nc.publish(claim.reply, proof("yours", nonce))
                except nats.errors.Error as exc:  # lost: the lease keeper re-requests the episode
                    log.debug("confirming a claim failed", episode=episode, error=str(exc))
                self._last_claim = anyio.current_time()
                self.stats.offers_claimed += 1
                return "claimed"
            outcome = "unclaimed"
            if claim.reply and len(batch) > 1 and secrets.compare_digest(claim.data, proof("claim", nonce)):
                outcome = "one at a time"
                log.warning(
                    "a worker of an older platoon claimed a batch of work: offering it one event at "
                    "a time; run one platoon version on every machine",
                    events=len(batch),
                )
            else:
                log.warning("a claim without the offer's proof: ignored", episode=episode)
        for work, lease in zip(batch, leases, strict=True):
            self.gate.revoke(work.episode, lease)  # nobody may report on an offer nobody holds
        return outcome

    async def _report_claim(self, event: Event) -> None:
        """Say on the local bus that a consumer holds this work now (its lease starts)."""
        episode = episode_of(event)
        if episode is None:
            return
        attempt = getattr(event, "attempt", 0)
        await self.claimed(
            WorkClaimed(episode_id=episode, attempt=attempt if isinstance(attempt, int) else 0)
        )

    def _retry_delay(self, tries: int) -> float:
        """After "no member": workers that just took work join again within a round trip, so
        try again soon while work is being claimed, and back off while it is not."""
        busy = anyio.current_time() - self._last_claim < 1.0
        cap = 0.05 if busy else self.connection.settings.reconnect_max_wait
        return min(0.005 * 2 ** min(tries, 30), cap) * random.uniform(0.5, 1.0)

    def _no_takers(self, episode: str) -> None:
        now = anyio.current_time()
        if now - self._no_takers_logged >= 30:
            self._no_takers_logged = now
            log.info("work waits: no worker is taking work now", episode=episode, waiting=self.offering)


class Taker:
    """The consumer's side: short memberships of the queue group, and a claim for each offer
    before it is played."""

    def __init__(self, *, take_at_once: int, offer_timeout: float, stats: BridgeStats) -> None:
        self.take_at_once = take_at_once
        self.offer_timeout = offer_timeout
        self.stats = stats
        self.members: set[NatsSubscription] = set()  # our memberships of work groups now (two per subject)
        self.answers: NatsSubscription | None = None  # one subscription for every confirmation of our claims
        self._waiting: dict[str, tuple[bytes, anyio.Event]] = {}  # token -> (the proof, its signal)
        self._prefix = ""

    def reset(self) -> None:
        """Forget the memberships and confirmations of a connection that is gone."""
        self.members, self.answers, self._waiting = set(), None, {}

    async def listen(self, nc: NatsClient) -> None:
        """Subscribe to the confirmations of our claims: one inbox for all, not one each."""
        self._prefix = nc.new_inbox()
        self.answers = await nc.subscribe(f"{self._prefix}.*", cb=self._on_answer)

    def subscriptions(self) -> list[NatsSubscription]:
        return [*self.members, *([self.answers] if self.answers is not None else [])]

    async def join(self, nc: NatsClient, subject: str) -> NatsSubscription:
        """Join the work queue group for the next `take_at_once` offers; the server ends the
        membership after them, so a consumer that stops running drops out by itself."""
        member = await nc.subscribe(subject, queue=WORK_QUEUE)
        await member.unsubscribe(limit=self.take_at_once)
        self.members.add(member)
        return member

    async def take(
        self,
        tg: TaskGroup,
        nc: NatsClient,
        subject: str,
        member: NatsSubscription,
        play: Callable[[Msg], Awaitable[None]],
    ) -> None:
        """Take one membership's offers. Its first offer joins the group again (we run, so we
        are healthy): the next membership is in place before this one ends, so offers never
        find a running consumer between memberships, and a hung one holds fewer than
        2 x `take_at_once` offers."""
        for taken in range(self.take_at_once):
            offer = await member.next_msg(timeout=None)
            tg.start_soon(self._claim, nc, offer, play)
            if taken == 0:
                tg.start_soon(self.take, tg, nc, subject, await self.join(nc, subject), play)
        self.members.discard(member)  # ended by the server

    async def _claim(self, nc: NatsClient, offer: Msg, play: Callable[[Msg], Awaitable[None]]) -> None:
        """Claim an offer (one event or a batch) and play it only once its producer confirms
        it is ours."""
        headers = offer.headers or {}
        nonce = headers.get(OFFER_HEADER)
        if nonce and offer.reply:
            token = secrets.token_hex(8)
            confirmed = anyio.Event()
            self._waiting[token] = (proof("yours", nonce), confirmed)
            purpose = CLAIM_BATCH if BATCH_HEADER in headers else "claim"
            try:
                await nc.publish(offer.reply, proof(purpose, nonce), reply=f"{self._prefix}.{token}")
                with anyio.move_on_after(2 * self.offer_timeout):
                    await confirmed.wait()
            except nats.errors.Error as exc:
                log.debug("claiming work failed", error=str(exc))
            finally:
                self._waiting.pop(token, None)
            if not confirmed.is_set():
                self.stats.claims_too_late += 1
                log.warning(
                    "work offered to this worker went to another: it was claimed too late",
                    subject=offer.subject,
                    offer_timeout=self.offer_timeout,
                )
                return
        await play(offer)

    async def _on_answer(self, msg: Msg) -> None:
        """A producer's confirmation, on `<our inbox>.<token>`: it counts only with the proof."""
        waiting = self._waiting.get(msg.subject.rpartition(".")[2])
        if waiting is not None and secrets.compare_digest(msg.data, waiting[0]):
            waiting[1].set()


def proof(purpose: str, nonce: str) -> bytes:
    """What shows knowledge of an offer's nonce without revealing it (claims travel on inboxes
    that others with the same credentials may read)."""
    return hashlib.blake2b(f"{purpose}:{nonce}".encode(), digest_size=16).hexdigest().encode()

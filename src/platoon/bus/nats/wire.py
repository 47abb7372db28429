"""How events look on NATS: subjects, headers, ids, and which event types may travel.

Events travel on subjects `platoon.<run>.<EventTag>` in the bus's msgpack wire form; the
headers below say where a message came from, which offer or lease it belongs to, and (for
JetStream) which id deduplicates it. An offer of several work events at once says so in its
`Platoon-Batch` header (their count) and carries a `WorkBatch`: a msgpack map of the events,
each in that same wire form, and their lease tokens.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Sequence
from typing import Protocol

import msgspec

from platoon.bus.codec import encode
from platoon.bus.events import Event, WorkClaimed, event_types

ORIGIN_HEADER = "Platoon-Origin"
MSG_ID_HEADER = "Nats-Msg-Id"
LEASE_HEADER = "Platoon-Lease"
OFFER_HEADER = "Platoon-Offer"
BATCH_HEADER = "Platoon-Batch"  # on an offer of several work events: how many
WORK_QUEUE = "platoon-work"  # the queue group work is offered to
ID_FIELDS = ("call_id", "request_id", "reply_to", "agent_id", "episode_id")
NAME = re.compile(r"^[A-Za-z0-9_-]+$")
LOCAL_ONLY: tuple[type[Event], ...] = (WorkClaimed,)  # a bridge's own facts, never carried


class Carried(Protocol):
    """What the bridge reads of a message from NATS: one delivered to a subscription (`Msg`),
    or one read back from a stream (`RawStreamMsg`, whose fields may be missing)."""

    @property
    def subject(self) -> str | None: ...
    @property
    def data(self) -> bytes | None: ...
    @property
    def headers(self) -> dict[str, str] | None: ...


class WorkBatch(msgspec.Struct):
    """Several work events in one offer: `events[i]` in the bus's wire form, and the lease
    token it goes with (`""` for none) in `leases[i]`."""

    events: list[msgspec.Raw]
    leases: list[str]


def pack_batch(events: Sequence[bytes], leases: Sequence[str | None]) -> bytes:
    """The body of a batch offer, from events already encoded (they are not encoded again)."""
    return _batch_encoder.encode(WorkBatch([msgspec.Raw(e) for e in events], [t or "" for t in leases]))


def unpack_batch(data: bytes) -> list[tuple[memoryview, str | None]]:
    """Each event's bytes and lease token. Raises `msgspec.DecodeError` on a malformed body."""
    batch = _batch_decoder.decode(data)
    if len(batch.events) != len(batch.leases):
        raise msgspec.DecodeError("a work batch with more or fewer leases than events")
    return [(memoryview(e), lease or None) for e, lease in zip(batch.events, batch.leases, strict=True)]


_batch_encoder = msgspec.msgpack.Encoder()
_batch_decoder = msgspec.msgpack.Decoder(WorkBatch)


class NatsBridgeError(RuntimeError):
    """The bridge cannot run: a bad URL or option, no server, or the wrong async backend."""


@functools.cache
def tag(event_type: type[Event]) -> str:
    info = msgspec.inspect.type_info(event_type)
    assert isinstance(info, msgspec.inspect.StructType)
    return str(info.tag)


def subject_for(run: str, event_type: type[Event]) -> str:
    """The NATS subject of an event type in a run: `platoon.<run>.<EventTag>`."""
    return f"platoon.{run}.{tag(event_type)}"


def event_id(event: Event) -> str:
    """The id that deduplicates a durable event: its tag and natural id, else a hash of it."""
    kind = tag(type(event))
    for field in ID_FIELDS:
        value = getattr(event, field, None)
        if isinstance(value, str) and value:
            return f"{kind}:{value}"
    return f"{kind}:{hashlib.blake2b(encode(event), digest_size=16).hexdigest()}"


def episode_of(event: Event) -> str | None:
    value = getattr(event, "episode_id", None)
    return value if isinstance(value, str) and value else None


def check_types(kind: str, types: Sequence[type[Event]]) -> tuple[type[Event], ...]:
    registered = set(event_types())
    for event_type in types:
        if not (isinstance(event_type, type) and issubclass(event_type, Event)):
            raise NatsBridgeError(f"{kind}: {event_type!r} is not an Event type")
        if event_type not in registered:
            raise NatsBridgeError(
                f"{kind}: {event_type.__name__} is not registered; decorate it with @register_event"
            )
        if not NAME.match(tag(event_type)):
            raise NatsBridgeError(
                f"{kind}: the tag {tag(event_type)!r} of {event_type.__name__} is not a NATS subject token"
            )
    return tuple(dict.fromkeys(types))

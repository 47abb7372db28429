"""What a bridge is told, in three parts passed whole, each checked when it is made:
`Routes` (which event types it carries, and which way), `ConnectionSettings` (how it reaches
the server and stays connected) and `Limits` (its buffers, timeouts and the streams' bounds).

    NatsBridge(url, run="demo", routes=Routes(mirror=[PolicyUpdated]))
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import msgspec
from msgspec.structs import force_setattr

from platoon.bus.events import Event
from platoon.bus.nats.wire import LOCAL_ONLY, NAME, NatsBridgeError, check_types

_CARRIED = ("mirror", "work", "durable")  # each type travels one of these ways, never two


class Routes(msgspec.Struct, frozen=True, kw_only=True):
    """Which event types the bridge carries, and which way (see `platoon.bus.nats`).

    `mirror`: every bridged bus sees them; `work`: each reaches one consumer; `durable`:
    through JetStream, none lost; `state`: the latest of each kept for whoever comes later;
    `withdraw`: events that withdraw an offer nobody claimed (see `work.py`). The flags say
    what this bridge takes in: work (`consume_work`), the durable stream through the consumer
    `durable_name` (`consume_durable`; bridges that share the name share its messages), and
    facts (`read_state`: at start and after each reconnect; `write_state` keeps them).
    The type lists are kept as tuples, without repeats.
    """

    mirror: Sequence[type[Event]] = ()
    work: Sequence[type[Event]] = ()
    durable: Sequence[type[Event]] = ()
    state: Sequence[type[Event]] = ()
    withdraw: Sequence[type[Event]] = ()
    consume_work: bool = False
    consume_durable: bool = False
    durable_name: str = "platoon"
    write_state: bool = False
    read_state: bool = False

    def __post_init__(self) -> None:
        if not NAME.match(self.durable_name):
            raise NatsBridgeError(f"durable_name {self.durable_name!r} must be letters, digits, '-' or '_'")
        for kind in (*_CARRIED, "state", "withdraw"):
            force_setattr(self, kind, check_types(kind, getattr(self, kind)))
        seen: dict[type[Event], str] = {}
        for kind in _CARRIED:
            for event_type in getattr(self, kind):
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

    def carried_in(self) -> tuple[type[Event], ...]:
        """The types this bridge brings in from NATS and publishes on its bus."""
        brought = [
            *self.mirror,
            *(self.work if self.consume_work else ()),
            *(self.durable if self.consume_durable else ()),
        ]
        brought += [t for t in (self.state if self.read_state else ()) if t not in brought]
        return tuple(brought)


class ConnectionSettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the bridge reaches NATS and stays connected (see `connection.py`).

    `credentials`: a `.creds` file (needs `nkeys`) or the JSON file `platoon nats init` writes;
    `tls`: an `ssl.SSLContext`. `connect_timeout` bounds the first connection only: after that
    the bridge reconnects forever, backing off from `reconnect_wait` to `reconnect_max_wait`.
    `close_timeout`: how long, at shutdown, it keeps sending what it holds. `unauthenticated`:
    what to do on a server that lets anyone in (no `auth_required` in its INFO), where anyone
    who reaches it may publish what steers a run: `allow` it, `warn`, or `refuse` (`run` fails
    with `NatsBridgeError` before it subscribes to anything).
    """

    credentials: str | Path | None = None
    tls: ssl.SSLContext | None = None
    connect_timeout: float = 10.0
    reconnect_wait: float = 0.1
    reconnect_max_wait: float = 5.0
    close_timeout: float = 5.0
    unauthenticated: Literal["allow", "warn", "refuse"] = "allow"


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """The bridge's bounds. `buffer_limit`: events held on their way out (then `publish` on the
    local bus waits). Durable: `ack_timeout` (how long a sender waits for the stream before
    publishing again), `ack_wait` (how long JetStream waits for our ack before redelivering:
    keep it above the longest stall of the local bus), `duplicate_window` and `max_age` (the
    stream's, in seconds), `seen_limit` (ids remembered here). Work: `offer_timeout` (how long
    a producer waits for a claim), `take_at_once` (the offers a consumer takes per membership;
    a batch of work is one offer)."""

    buffer_limit: int = 1024
    ack_timeout: float = 5.0
    ack_wait: float = 60.0
    duplicate_window: float = 120.0
    max_age: float = 7 * 24 * 3600.0
    seen_limit: int = 100_000
    offer_timeout: float = 5.0
    take_at_once: int = 4

    def __post_init__(self) -> None:
        if self.buffer_limit < 1:
            raise NatsBridgeError("buffer_limit must be at least 1")
        if self.offer_timeout <= 0 or self.take_at_once < 1:
            raise NatsBridgeError("offer_timeout must be positive and take_at_once at least 1")

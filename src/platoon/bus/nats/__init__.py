"""The NATS bridge: the same bus spread over several machines through an existing broker.

    bridge = NatsBridge(
        "nats://broker:4222", run="exp1",
        routes=Routes(
            mirror=[PolicyUpdated],               # every bus sees these, both ways
            work=[EpisodeRequested],              # each reaches exactly one worker (a queue group)
            durable=[ModelCallFinished, EpisodeGraded],   # JetStream: none lost, none twice
            consume_work=True,                    # a worker: take work from NATS
        ),
        connection=ConnectionSettings(credentials="worker.json"),   # how it reaches the server
        limits=Limits(buffer_limit=256),          # its buffers, timeouts, the streams' bounds
    )
    async with Bus() as bus:
        bus.start_soon(bridge.run, bus)

Events travel on subjects `platoon.<run>.<EventTag>` in the bus's msgpack wire form. How each
kind travels, and why:

* **mirror**: core NATS publish/subscribe. Every bridged bus sees the event; at most once,
  like NATS itself, so use it for facts whose loss the next one repairs (a newer policy).
* **work** (`work.py`): offered to a queue group, and kept only by a consumer that claims it,
  so work is never lost to a hung or absent consumer, and none is played twice. The producer
  says `WorkClaimed` on its own bus when a consumer claims an episode's work.
* **durable** (`durable.py`): JetStream, acknowledged both ways and deduplicated by the
  event's natural id.
* **facts** (`facts.py`, `Routes(state=...)`): the latest value of each such type, kept in the run's
  state stream for whoever comes later or reconnects.
* **leases** (`leases.py`): who was given an episode may report on it, nobody else.

No echo: every message carries this bridge's origin id, and an event that came in from NATS
is never sent back out; messages of our own origin that come back are dropped. Run one
bridge per bus: the origin id belongs to the bridge.

Disconnects (`connection.py`): the client reconnects forever, with exponential backoff from
`ConnectionSettings.reconnect_wait` to `reconnect_max_wait`, and the bridge publishes `BridgeDisconnected` /
`BridgeReconnected` on the local bus (`buffered`: the most events the bridge held at once
during the outage). Meanwhile outgoing events wait in a buffer of `Limits.buffer_limit` events; when
it is full, `publish` on the local bus waits (backpressure, as everywhere on the bus) instead
of dropping, because silently losing a result costs training data. (A mirrored or work event
sent while the *receiving* side is still reconnecting is lost, as core NATS goes; durable
events are not.) At shutdown the bridge spends up to `close_timeout` sending what is buffered
and logs what it could not.

Credentials: a NATS `.creds` file (JWT and nkey), or the JSON file `platoon nats init` writes
for a role (`{"user": ..., "password": ...}`).

nats-py is asyncio-only, so the bridge needs anyio's asyncio backend; under trio `run` fails
with `NatsBridgeError`.

The parts, one concern each: `wire` (subjects, headers, ids), `settings` (what a bridge is
told), `connection`, `work`, `durable`, `facts`, `leases`, `stats`, and `bridge`, the component
that composes them.
"""

from __future__ import annotations

try:
    import nats  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("platoon.bus.nats needs nats-py: pip install 'platoon[nats]'") from exc

from platoon.bus.nats.bridge import NatsBridge
from platoon.bus.nats.leases import Leases
from platoon.bus.nats.settings import ConnectionSettings, Limits, Routes
from platoon.bus.nats.stats import BridgeStats
from platoon.bus.nats.wire import WORK_QUEUE, NatsBridgeError, event_id, subject_for

__all__ = [
    "WORK_QUEUE",
    "BridgeStats",
    "ConnectionSettings",
    "Leases",
    "Limits",
    "NatsBridge",
    "NatsBridgeError",
    "Routes",
    "event_id",
    "subject_for",
]

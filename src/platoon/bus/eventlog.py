"""The run's event log: every event on the bus, appended to `<run_dir>/events.msgpack`.

Each record is a 4-byte big-endian length and the event's msgpack bytes, so the file can be
read while it is written and a record cut short by a crash is simply where reading stops.
The file is created 0600, and fields an event type names in `secret_fields` (an agent's
gateway key) are written as `<redacted>`.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from pathlib import Path

import msgspec
import msgspec.structs

from platoon.bus.codec import decode, encode
from platoon.bus.core import Bus, Stream
from platoon.bus.events import Event

__all__ = ["EVENT_LOG_NAME", "EventLog", "read_events"]

EVENT_LOG_NAME = "events.msgpack"
REDACTED = "<redacted>"
_LENGTH = struct.Struct(">I")


class EventLog:
    """A component that appends every event it sees to the run directory."""

    name = "event-log"

    def __init__(self, run_dir: str | Path, *, flush_every: int = 64) -> None:
        self.path = Path(run_dir) / EVENT_LOG_NAME
        self.flush_every = flush_every
        self.count = 0
        self._events: Stream[Event] | None = None

    def attach(self, bus: Bus) -> None:
        if self._events is not None:
            return
        self._events = bus.stream(Event, name=self.name).open()

    async def run(self, bus: Bus) -> None:
        if self._events is None:
            self.attach(bus)
        assert self._events is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "ab") as file:
            with self._events as events:
                try:
                    async for event in events:
                        data = encode(_without_secrets(event))
                        file.write(_LENGTH.pack(len(data)) + data)
                        self.count += 1
                        if self.count % self.flush_every == 0:
                            file.flush()
                finally:
                    file.flush()


def _without_secrets(event: Event) -> Event:
    hidden = getattr(type(event), "secret_fields", ())
    if not hidden:
        return event
    return msgspec.structs.replace(event, **dict.fromkeys(hidden, REDACTED))


def read_events(run_dir_or_file: str | Path) -> Iterator[Event]:
    """Every event of a run, in order. A truncated last record ends the iteration."""
    path = Path(run_dir_or_file)
    if path.is_dir():
        path = path / EVENT_LOG_NAME
    if not path.exists():
        raise FileNotFoundError(f"no event log at {path}")
    with path.open("rb") as file:
        while True:
            head = file.read(_LENGTH.size)
            if len(head) < _LENGTH.size:
                return
            (size,) = _LENGTH.unpack(head)
            data = file.read(size)
            if len(data) < size:
                return
            try:
                yield decode(data)
            except msgspec.DecodeError as exc:
                raise ValueError(
                    f"{path}: undecodable event record ({exc}); is its plugin installed?"
                ) from exc

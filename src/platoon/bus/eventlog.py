"""The run's event log: every event on the bus, appended to `<run_dir>/events.msgpack`.

The file starts with the 8-byte magic `PLTNEV02`; then each record is framed

    sync (2 bytes, A7 1E) | length (4, big-endian) | crc32 of the rest (4) | time (8, float64 s) | event

so a reader checks every record, skips a damaged one by finding the next sync mark whose record
checks out, and says how much it lost (`LogDamage`). The time is when the event log took the
event, in the frame so that no event type changes shape. Logs written before the framing (a bare
4-byte length and the event) still read.

The writer flushes whenever the bus has nothing more for it, so a crash or a signal loses at most
the events of one burst; SIGTERM and SIGINT end a run through cancellation, which flushes. The file
is created 0600, and fields an event type names in `secret_fields` (an agent's gateway key) are
written as `<redacted>`.
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import anyio
import msgspec
import msgspec.structs
import structlog

from platoon.bus.codec import decode, encode
from platoon.bus.core import Bus, Stream
from platoon.bus.events import Event

__all__ = ["EVENT_LOG_NAME", "EventLog", "LogDamage", "read_events", "read_records"]

EVENT_LOG_NAME = "events.msgpack"
REDACTED = "<redacted>"
MAGIC = b"PLTNEV02"
SYNC = b"\xa7\x1e"
_HEAD = struct.Struct(">2sII")  # sync, length of what follows the crc, crc32
_TIME = struct.Struct(">d")
_LEGACY_LENGTH = struct.Struct(">I")
_MAX_RECORD = 1 << 30

log = structlog.get_logger("platoon.eventlog")


class LogDamage(msgspec.Struct):
    """What a reader had to skip: damaged records (bad checksum or undecodable) and bytes."""

    path: str
    damaged_records: int = 0
    skipped_bytes: int = 0
    truncated_tail: int = 0  # bytes of a last record cut short (a writer killed mid-write)
    unknown_types: int = 0  # whole records of event types not registered here

    @property
    def found(self) -> bool:
        return bool(self.damaged_records or self.skipped_bytes or self.truncated_tail or self.unknown_types)

    def describe(self) -> str:
        parts = []
        if self.unknown_types:
            parts.append(
                f"{self.unknown_types} records of event types not known here (is their plugin installed?)"
            )
        if self.damaged_records or self.skipped_bytes:
            parts.append(f"{self.damaged_records} damaged records ({self.skipped_bytes} bytes) skipped")
        if self.truncated_tail:
            parts.append(f"the last record is cut short ({self.truncated_tail} bytes)")
        return f"{self.path}: " + "; ".join(parts)


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
            if file.tell() == 0:
                file.write(MAGIC)
            elif not _is_framed(self.path):
                raise ValueError(
                    f"{self.path} is an event log of an older platoon: start a new run directory"
                )
            unflushed = 0
            with self._events as events:
                try:
                    while True:
                        try:
                            event = events.receive_nowait()
                        except anyio.WouldBlock:
                            if unflushed:  # nothing more right now: put what we have on disk
                                file.flush()
                                unflushed = 0
                            event = await events.receive()
                        file.write(frame(_without_secrets(event)))
                        self.count += 1
                        unflushed += 1
                        if unflushed >= self.flush_every:
                            file.flush()
                            unflushed = 0
                except StopAsyncIteration:
                    pass
                finally:
                    file.flush()


def frame(event: Event, timestamp: float | None = None) -> bytes:
    """One record of the event log, framed."""
    body = _TIME.pack(time.time() if timestamp is None else timestamp) + encode(event)
    return _HEAD.pack(SYNC, len(body), zlib.crc32(body)) + body


def _without_secrets(event: Event) -> Event:
    hidden = getattr(type(event), "secret_fields", ())
    if not hidden:
        return event
    return msgspec.structs.replace(event, **dict.fromkeys(hidden, REDACTED))


def _is_framed(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(len(MAGIC)) == MAGIC


def _log_path(run_dir_or_file: str | Path) -> Path:
    path = Path(run_dir_or_file)
    if path.is_dir():
        path = path / EVENT_LOG_NAME
    if not path.exists():
        raise FileNotFoundError(f"no event log at {path}")
    return path


def read_records(
    run_dir_or_file: str | Path, damage: LogDamage | None = None
) -> Iterator[tuple[float, Event]]:
    """Every (time, event) of a run, in order, skipping damaged records.

    What was skipped is added up in `damage` (pass one to learn it and report it yourself), else
    logged as a warning. A legacy log has no times: they read as 0.0.
    """
    path = _log_path(run_dir_or_file)
    report = damage is None
    damage = damage if damage is not None else LogDamage(path=str(path))
    damage.path = damage.path or str(path)
    data = path.read_bytes()
    if data.startswith(MAGIC):
        yield from _framed(data, len(MAGIC), damage)
    else:
        yield from ((0.0, event) for event in _legacy(data, path, damage))
    if damage.found and report:
        log.warning("the event log is damaged", detail=damage.describe())


def read_events(run_dir_or_file: str | Path, damage: LogDamage | None = None) -> Iterator[Event]:
    """Every event of a run, in order, skipping damaged records (see `read_records`)."""
    for _, event in read_records(run_dir_or_file, damage):
        yield event


def _framed(data: bytes, at: int, damage: LogDamage) -> Iterator[tuple[float, Event]]:
    end = len(data)
    while at < end:
        if end - at < _HEAD.size:
            damage.truncated_tail += end - at
            return
        sync, length, crc = _HEAD.unpack_from(data, at)
        start = at + _HEAD.size
        record = None
        if sync == SYNC and _TIME.size <= length <= _MAX_RECORD:
            if start + length > end:
                if data.find(SYNC, at + 1) == -1:  # the writer died in this, the last record
                    damage.truncated_tail += end - at
                    return
            else:
                body = data[start : start + length]
                if zlib.crc32(body) == crc:
                    try:
                        record = (_TIME.unpack_from(body)[0], decode(body[_TIME.size :]))
                    except msgspec.DecodeError:
                        damage.unknown_types += 1  # whole, so not damage: a type we cannot read
                        at = start + length
                        continue
        if record is not None:
            yield record
            at = start + length
            continue
        # Damaged: resume at the next sync mark.
        following = data.find(SYNC, at + 1)
        following = end if following == -1 else following
        damage.damaged_records += 1
        damage.skipped_bytes += following - at
        at = following


def _legacy(data: bytes, path: Path, damage: LogDamage) -> Iterator[Event]:
    at, end = 0, len(data)
    while at < end:
        if end - at < _LEGACY_LENGTH.size:
            damage.truncated_tail += end - at
            return
        (size,) = _LEGACY_LENGTH.unpack_from(data, at)
        if at + _LEGACY_LENGTH.size + size > end:
            damage.truncated_tail += end - at
            return
        try:
            yield decode(data[at + _LEGACY_LENGTH.size : at + _LEGACY_LENGTH.size + size])
        except msgspec.DecodeError:
            # Without checksums or sync marks there is no telling where the next record starts.
            damage.damaged_records += 1
            damage.skipped_bytes += end - at
            return
        at += _LEGACY_LENGTH.size + size

"""The run's event log: every event on the bus, appended to `<run_dir>/events.msgpack`.

The file starts with the 8-byte magic `PLTNEV03`; then each record is framed

    sync (2 bytes, A7 1E) | flag and length (4, big-endian) | crc32 of the rest (4) | time (8, float64 s) | event

so a reader checks every record, skips a damaged one by finding the next sync mark whose record
checks out, and says how much it lost (`LogDamage`). The time is when the event log took the
event, in the frame so that no event type changes shape. The top bit of the length says the event
bytes are zlib-compressed: token ids, logprobs and datums are most of a run's log, and msgpack
arrays of them shrink about threefold, so records past a few hundred bytes are stored compressed.
`PLTNEV02` logs (the same frames, never compressed) and logs written before the framing (a bare
4-byte length and the event) still read; appending to a `PLTNEV02` log keeps writing its format.

Each record's offset is its address: `scan` yields offsets with the records and `read_at` reads
one back, which is how the trajectory viewer's index finds an episode without reading the log.

The writer flushes whenever the bus has nothing more for it, so a crash or a signal loses at most
the events of one burst; SIGTERM and SIGINT end a run through cancellation, which flushes. The file
is created 0600, and fields an event type names in `secret_fields` (an agent's gateway key) are
written as `<redacted>`.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import anyio
import msgspec
import msgspec.structs
import structlog

from platoon.bus.codec import decode, encode
from platoon.bus.core import Bus, Stream
from platoon.bus.events import Event

__all__ = [
    "EVENT_LOG_NAME",
    "EventLog",
    "LogDamage",
    "Record",
    "read_at",
    "read_events",
    "read_records",
    "scan",
]

EVENT_LOG_NAME = "events.msgpack"
REDACTED = "<redacted>"
MAGIC = b"PLTNEV03"
MAGIC_V2 = b"PLTNEV02"
SYNC = b"\xa7\x1e"
_HEAD = struct.Struct(">2sII")  # sync, flag and length of what follows the crc, crc32
_COMPRESSED = 0x8000_0000  # in the length word: the event bytes are zlib-compressed
_COMPRESS_FROM = 512  # bytes of event below which compressing gains too little
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
                compress = True
            else:
                head = _magic(self.path)
                if head not in (MAGIC, MAGIC_V2):
                    raise ValueError(
                        f"{self.path} is an event log of an older platoon: start a new run directory"
                    )
                compress = head == MAGIC  # a PLTNEV02 log goes on in its own format
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
                        file.write(frame(_without_secrets(event), compress=compress))
                        self.count += 1
                        unflushed += 1
                        if unflushed >= self.flush_every:
                            file.flush()
                            unflushed = 0
                except StopAsyncIteration:
                    pass
                finally:
                    file.flush()


def frame(event: Event, timestamp: float | None = None, *, compress: bool = True) -> bytes:
    """One record of the event log, framed (its event compressed when that pays)."""
    data = encode(event)
    flag = 0
    if compress and len(data) >= _COMPRESS_FROM:
        packed = zlib.compress(data, 1)
        if len(packed) < len(data):
            data, flag = packed, _COMPRESSED
    body = _TIME.pack(time.time() if timestamp is None else timestamp) + data
    return _HEAD.pack(SYNC, flag | len(body), zlib.crc32(body)) + body


class Record(msgspec.Struct, frozen=True):
    """A record of the log at `offset` (its frame ends at `end`), with its time and event."""

    offset: int
    end: int
    time: float
    event: Event


def _without_secrets(event: Event) -> Event:
    hidden = getattr(type(event), "secret_fields", ())
    if not hidden:
        return event
    return msgspec.structs.replace(event, **dict.fromkeys(hidden, REDACTED))


def _magic(path: Path) -> bytes:
    with path.open("rb") as file:
        return file.read(len(MAGIC))


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
    for record in scan(run_dir_or_file, damage=damage):
        yield record.time, record.event


def scan(run_dir_or_file: str | Path, start: int = 0, damage: LogDamage | None = None) -> Iterator[Record]:
    """Every record from byte `start` on (0: the whole log), with its offset, skipping damage.

    `start` is an offset `scan` gave out (a record's `offset` or `end`). A legacy log, having no
    frames to find again, is always read whole, with offsets 0.
    """
    path = _log_path(run_dir_or_file)
    report = damage is None
    damage = damage if damage is not None else LogDamage(path=str(path))
    damage.path = damage.path or str(path)
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size
        data: bytes | mmap.mmap = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    try:
        head = bytes(data[: len(MAGIC)])
        if head in (MAGIC, MAGIC_V2):
            yield from _framed(data, max(start, len(MAGIC)), damage)
        elif size:
            yield from (Record(0, 0, 0.0, event) for event in _legacy(bytes(data), path, damage))
    finally:
        if isinstance(data, mmap.mmap):
            data.close()
    if damage.found and report:
        log.warning("the event log is damaged", detail=damage.describe())


def read_at(file: BinaryIO, offset: int) -> Record:
    """The record at `offset` of an open framed log (one `scan` yielded); ValueError if it is not
    a whole record there."""
    file.seek(offset)
    head = file.read(_HEAD.size)
    if len(head) < _HEAD.size:
        raise ValueError(f"no record at offset {offset}")
    sync, word, crc = _HEAD.unpack(head)
    length = word & ~_COMPRESSED
    if sync != SYNC or not _TIME.size <= length <= _MAX_RECORD:
        raise ValueError(f"no record at offset {offset}")
    body = file.read(length)
    if len(body) < length or zlib.crc32(body) != crc:
        raise ValueError(f"the record at offset {offset} is damaged")
    end = offset + _HEAD.size + length
    return Record(offset, end, _TIME.unpack_from(body)[0], decode(_event_bytes(body, word)))


def _event_bytes(body: bytes | memoryview, word: int) -> bytes:
    data = body[_TIME.size :]
    return zlib.decompress(data) if word & _COMPRESSED else bytes(data)


def read_events(run_dir_or_file: str | Path, damage: LogDamage | None = None) -> Iterator[Event]:
    """Every event of a run, in order, skipping damaged records (see `read_records`)."""
    for _, event in read_records(run_dir_or_file, damage):
        yield event


def _framed(data: bytes | mmap.mmap, at: int, damage: LogDamage) -> Iterator[Record]:
    end = len(data)
    while at < end:
        if end - at < _HEAD.size:
            damage.truncated_tail += end - at
            return
        sync, word, crc = _HEAD.unpack_from(data, at)
        length = word & ~_COMPRESSED
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
                        event = decode(_event_bytes(body, word))
                    except (msgspec.DecodeError, zlib.error):
                        damage.unknown_types += 1  # whole, so not damage: a type we cannot read
                        at = start + length
                        continue
                    record = Record(at, start + length, _TIME.unpack_from(body)[0], event)
        if record is not None:
            yield record
            at = record.end
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

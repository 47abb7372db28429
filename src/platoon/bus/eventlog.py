"""The run's event log: every event on the bus, appended to `<run_dir>/events.msgpack`.

The file starts with the 8-byte magic `PLTNEV03`; then each record is framed

    sync (2 bytes, A7 1E) | flag and length (4, big-endian) | crc32 of the rest (4) | time (8, float64 s) | event

so a reader checks every record, skips a damaged one by finding the next sync mark whose record
checks out, and says how much it lost (`LogDamage`). The time is when the event log took the
event, in the frame so that no event type changes shape. The top bit of the length says the event
bytes are zlib-compressed: token ids, logprobs and datums are most of a run's log, and msgpack
arrays of them shrink about threefold, so records past 128 bytes are stored compressed (with a
preset dictionary of the names records spell out, so that short ones shrink too).

An agent's model calls repeat its whole context: each prompt is the previous prompt and
completion plus a little, so a log of long episodes grows with the square of their length. The
next bit of the length marks a delta record: a `ModelCallFinished` whose `prompt_tokens`, or a
`ChatRequested` whose `messages`, start with what the same agent's previous record of that type
held (its prompt and completion, its messages). The frame then carries the previous record's
offset and how many items it keeps, and the event holds only the rest:

    ... | time (8) | base record's offset (8) | items kept (4) | event with the rest of the list

Every 16th record of an agent is written whole, so reading one record at an offset follows at
most 16 others; a reader that cannot read the base counts the record as damaged.

`PLTNEV02` logs (the same frames, never compressed or delta-encoded) and logs written before the
framing (a bare 4-byte length and the event) still read; appending to a `PLTNEV02` log keeps
writing its format.

Each record's offset is its address: `scan` yields offsets with the records and `read_at` reads
one back, which is how the trajectory viewer's index finds an episode without reading the log.

The writer flushes whenever the bus has nothing more for it, so a crash or a signal loses at most
the events of one burst; SIGTERM and SIGINT end a run through cancellation, which flushes. The file
is created 0600, and fields an event type names in `secret_fields` (an agent's gateway key) are
written as `<redacted>`.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import anyio
import msgspec
import msgspec.structs
import structlog

from platoon.bus.codec import decode, encode
from platoon.bus.components import ComponentBase
from platoon.bus.core import Bus, Stream
from platoon.bus.events import ChatRequested, Event, ModelCallFinished
from platoon.config.rundir import make_private_dir

__all__ = [
    "EVENT_LOG_NAME",
    "EventLog",
    "LogDamage",
    "Record",
    "RecordReader",
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
_DELTA = 0x4000_0000  # in the length word: a delta record (a base offset and a count first)
_FLAGS = _COMPRESSED | _DELTA
_BASE = struct.Struct(">QI")  # the base record's offset, how many items of its list are kept
_KEYFRAME_EVERY = 16  # an agent's records in a row that may be deltas
_DELTA_AGENTS = 4096  # agents whose last record the writer and a reader remember
_DELTA_MIN = 64  # items a delta must keep to be worth its header
_RESOLVER_ITEMS = 4_000_000  # list items a reader keeps to rebuild deltas (some 32 MB)
_COMPRESS_SMALL_FROM = 128  # with the dictionary below even short records shrink
# A preset zlib dictionary: the names that most records spell out (event tags, field names,
# common values), so that a record of a few hundred bytes compresses too. Part of the PLTNEV03
# format: never change it (a new one needs a new magic).
_ZDICT = " ".join(
    (
        "AgentProcessExited AgentProcessRequested BatchReady CheckpointSaved ComponentFailed",
        "EpisodeAbandoned EpisodeSealed EvalFinished PolicyAnnounced PolicyUpdated RunFinished",
        "TasksListed TasksRequested TrainStepFinished WorkerStatus GroupCompleted",
        "agent_rewards agents_finished base_model base_url budget_id budget_remaining call_id",
        "completion_text component datums env_fault episode_ids error_kind event_type",
        "final_message finish_reason fork_of forwards identity in_flight max_model_calls",
        "max_tokens num_model_calls output_cap parse_errors payload replaced_by report_path",
        "return_code root_agent_id sampler_path spec_dir started_at state_path stderr_bytes",
        "stdout_bytes task_cursor timed_out toolchain traceback unsupported metrics stats",
        "AgentOpenRequested AgentOpened AgentSpawned AgentFinished SessionOpenRequested",
        "SessionOpened GradeRequested Graded EpisodeRequested EpisodeStarted EpisodeFinished",
        "EpisodeGraded ChatRequested ChatReplied ModelCallFinished ToolCalled ToolReturned",
        "instruction harness parent_id depth attempt purpose policy_version split index",
        "task_id task env reward rewards reason status duration_s finished output arguments",
        "error message messages tools params kind stop_reason logprobs prompt_tokens",
        "completion_tokens completed limit timeout cancelled train eval rollout policy stop",
        "function type description parameters properties required object string integer",
        "tool_calls tool_call_id role content assistant user system tool name key worker",
        "reply_to request_id group_id step agent_id episode_id",
    )
).encode()
_list_encoder = msgspec.msgpack.Encoder()
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
    not_a_log: bool = False  # no header, and its first bytes are no record of an older log either

    @property
    def found(self) -> bool:
        return bool(
            self.damaged_records
            or self.skipped_bytes
            or self.truncated_tail
            or self.unknown_types
            or self.not_a_log
        )

    def describe(self) -> str:
        if self.not_a_log:
            return f"{self.path} is not a platoon event log (no PLTNEV header, and no record at its start)"
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


class EventLog(ComponentBase):
    """A component that appends every event it sees to the run directory."""

    name = "event-log"
    subscribes = (Event,)

    def __init__(self, run_dir: str | Path, *, flush_every: int = 64) -> None:
        self.path = Path(run_dir) / EVENT_LOG_NAME
        self.flush_every = flush_every
        self.count = 0
        self._events: Stream[Event] | None = None

    def on_attach(self, bus: Bus) -> None:
        self._events = bus.stream(Event, name=self.name).open()

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        assert self._events is not None
        make_private_dir(self.path.parent)
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
            # A resumed run starts its deltas afresh: the first record of each agent is whole.
            deltas = Deltas() if compress else None
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
                        file.write(
                            frame(
                                _without_secrets(event), compress=compress, deltas=deltas, offset=file.tell()
                            )
                        )
                        self.count += 1
                        unflushed += 1
                        if unflushed >= self.flush_every:
                            file.flush()
                            unflushed = 0
                except StopAsyncIteration:
                    pass
                finally:
                    file.flush()


def frame(
    event: Event,
    timestamp: float | None = None,
    *,
    compress: bool = True,
    deltas: Deltas | None = None,
    offset: int = 0,
) -> bytes:
    """One record of the event log, framed: its event compressed when that pays and, with
    `deltas` (the writer's memory of each agent's last records) and the record's `offset`,
    written as a delta of the agent's previous record when it extends it."""
    flag, head = 0, b""
    if deltas is not None:
        delta = deltas.encode(event, offset)
        if delta is not None:
            event, base, kept = delta
            flag, head = _DELTA, _BASE.pack(base, kept)
    data = encode(event)
    if compress and len(data) >= _COMPRESS_SMALL_FROM:
        packer = zlib.compressobj(1, zdict=_ZDICT)
        packed = packer.compress(data) + packer.flush()
        if len(packed) < len(data):
            data, flag = packed, flag | _COMPRESSED
    body = _TIME.pack(time.time() if timestamp is None else timestamp) + head + data
    return _HEAD.pack(SYNC, flag | len(body), zlib.crc32(body)) + body


# The event types written as deltas: the list field that repeats, and the list the agent's
# next record of the type is expected to extend.
def _call_context(event: Event) -> Sequence[object]:
    assert isinstance(event, ModelCallFinished)
    return [*event.prompt_tokens, *event.completion_tokens]


def _chat_messages(event: Event) -> Sequence[object]:
    assert isinstance(event, ChatRequested)
    return event.messages


_DELTA_FIELDS: dict[type[Event], tuple[str, Callable[[Event], Sequence[object]]]] = {
    ModelCallFinished: ("prompt_tokens", _call_context),
    ChatRequested: ("messages", _chat_messages),
}


def _digest(items: Sequence[object]) -> bytes:
    return hashlib.blake2b(_list_encoder.encode(items), digest_size=16).digest()


class Deltas:
    """What a writer remembers to write deltas: per (type, agent), the last record's offset, a
    digest of the list the next record may extend and its length (not the list: thousands of
    agents in flight with long contexts would hold gigabytes), and how many deltas led to it."""

    def __init__(self) -> None:
        self._last: OrderedDict[tuple[type[Event], str], tuple[int, int, bytes, int]] = OrderedDict()

    def encode(self, event: Event, offset: int) -> tuple[Event, int, int] | None:
        """(the event with only the new items, the base offset, items kept), or None: write it whole."""
        spec = _DELTA_FIELDS.get(type(event))
        if spec is None:
            return None
        field, extended = spec
        key = (type(event), event.agent_id)  # type: ignore[attr-defined]
        found = self._last.pop(key, None)
        value = getattr(event, field)
        out, chain = None, 0
        if found is not None and found[3] < _KEYFRAME_EVERY:
            base, kept, digest, chain = found
            if kept >= _DELTA_MIN and len(value) >= kept and _digest(value[:kept]) == digest:
                out = (msgspec.structs.replace(event, **{field: value[kept:]}), base, kept)
                chain += 1
            else:
                chain = 0
        following = extended(event)
        self._last[key] = (offset, len(following), _digest(following), chain)
        while len(self._last) > _DELTA_AGENTS:
            self._last.popitem(last=False)
        return out


class _Resolver:
    """A reader's memory of recent records' lists (up to `_RESOLVER_ITEMS` items), to rebuild
    delta records without reading their bases again; `fetch(offset)` reads one it forgot."""

    def __init__(self, fetch: Callable[[int], Event]) -> None:
        self.fetch = fetch
        self._lists: OrderedDict[int, Sequence[object]] = OrderedDict()
        self._items = 0

    def resolve(self, event: Event, offset: int, base: int | None, kept: int) -> Event:
        spec = _DELTA_FIELDS.get(type(event))
        if base is not None:
            if spec is None:
                raise ValueError(f"a delta record of {type(event).__name__}, which is never one")
            field, extended = spec
            before = self._lists.get(base)
            if before is None:
                before = extended(self.fetch(base))
            if kept > len(before):
                raise ValueError(f"a delta record keeps {kept} items of a base that has {len(before)}")
            event = msgspec.structs.replace(event, **{field: [*before[:kept], *getattr(event, field)]})
        if spec is not None and offset not in self._lists:
            items = spec[1](event)
            self._lists[offset] = items
            self._items += len(items)
            while self._items > _RESOLVER_ITEMS and len(self._lists) > 1:
                self._items -= len(self._lists.popitem(last=False)[1])
        return event


class RecordReader:
    """Reads records at offsets of one open framed log, remembering what rebuilds the deltas
    among them (read an episode's records in order and each delta's base is at hand)."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self._resolver = _Resolver(lambda base: self.at(base).event)
        file.seek(0)
        self._legacy = file.read(len(MAGIC)) not in (MAGIC, MAGIC_V2)

    def at(self, offset: int) -> Record:
        """The record at `offset` (one `scan` yielded); ValueError if there is none, whole."""
        file = self.file
        file.seek(offset)
        if self._legacy:
            return _legacy_record(file, offset)
        head = file.read(_HEAD.size)
        if len(head) < _HEAD.size:
            raise ValueError(f"no record at offset {offset}")
        sync, word, crc = _HEAD.unpack(head)
        length = word & ~_FLAGS
        if sync != SYNC or not _TIME.size <= length <= _MAX_RECORD:
            raise ValueError(f"no record at offset {offset}")
        body = file.read(length)
        if len(body) < length or zlib.crc32(body) != crc:
            raise ValueError(f"the record at offset {offset} is damaged")
        try:
            event = _event(body, word, offset, self._resolver)
        except (msgspec.DecodeError, zlib.error) as exc:
            raise ValueError(f"the record at offset {offset} does not decode: {exc}") from None
        return Record(offset, offset + _HEAD.size + length, _TIME.unpack_from(body)[0], event)


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

    `start` is an offset `scan` gave out (a record's `offset` or `end`). A legacy log (no magic,
    bare lengths) has offsets too, but no times: they read as 0.0.
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
            yield from _legacy(data, start, damage)
    finally:
        if isinstance(data, mmap.mmap):
            data.close()
    if damage.found and report:
        log.warning("the event log is damaged", detail=damage.describe())


def _legacy_record(file: BinaryIO, offset: int) -> Record:
    head = file.read(_LEGACY_LENGTH.size)
    if len(head) < _LEGACY_LENGTH.size:
        raise ValueError(f"no record at offset {offset}")
    (size,) = _LEGACY_LENGTH.unpack(head)
    data = file.read(size)
    if len(data) < size:
        raise ValueError(f"the record at offset {offset} is cut short")
    try:
        event = decode(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"the record at offset {offset} does not decode: {exc}") from None
    return Record(offset, offset + _LEGACY_LENGTH.size + size, 0.0, event)


def read_at(file: BinaryIO, offset: int) -> Record:
    """The record at `offset` of an open framed log (one `scan` yielded); ValueError if it is not
    a whole record there. To read many, a `RecordReader` shares the work of rebuilding deltas."""
    return RecordReader(file).at(offset)


def _event(body: bytes, word: int, offset: int, resolver: _Resolver) -> Event:
    """The event of a checked record body, a delta rebuilt from its base."""
    at, base, kept = _TIME.size, None, 0
    if word & _DELTA:
        base, kept = _BASE.unpack_from(body, at)
        at += _BASE.size
        if base >= offset:
            raise ValueError(f"a delta record at {offset} names a base at {base}, not before it")
    data = body[at:]
    event = decode(_unpack(data) if word & _COMPRESSED else bytes(data))
    return resolver.resolve(event, offset, base, kept)


def read_events(run_dir_or_file: str | Path, damage: LogDamage | None = None) -> Iterator[Event]:
    """Every event of a run, in order, skipping damaged records (see `read_records`)."""
    for _, event in read_records(run_dir_or_file, damage):
        yield event


def _framed(data: bytes | mmap.mmap, at: int, damage: LogDamage) -> Iterator[Record]:
    end = len(data)
    resolver = _Resolver(lambda base: _record_in(data, base, resolver))
    while at < end:
        if end - at < _HEAD.size:
            damage.truncated_tail += end - at
            return
        sync, word, crc = _HEAD.unpack_from(data, at)
        length = word & ~_FLAGS
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
                        event = _event(body, word, at, resolver)
                    except (msgspec.DecodeError, zlib.error):
                        damage.unknown_types += 1  # whole, so not damage: a type we cannot read
                        at = start + length
                        continue
                    except ValueError:  # a delta whose base is damaged or missing
                        damage.damaged_records += 1
                        damage.skipped_bytes += _HEAD.size + length
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


def _unpack(data: bytes) -> bytes:
    unpacker = zlib.decompressobj(zdict=_ZDICT)
    out = unpacker.decompress(data) + unpacker.flush()
    if not unpacker.eof:
        raise zlib.error("a compressed record ends early")
    return out


def _record_in(data: bytes | mmap.mmap, offset: int, resolver: _Resolver) -> Event:
    """The event of the whole record at `offset` of a log's bytes (a delta's base), or ValueError."""
    if offset < len(MAGIC) or offset + _HEAD.size > len(data):
        raise ValueError(f"no record at offset {offset}")
    sync, word, crc = _HEAD.unpack_from(data, offset)
    length = word & ~_FLAGS
    start = offset + _HEAD.size
    if sync != SYNC or not _TIME.size <= length <= _MAX_RECORD or start + length > len(data):
        raise ValueError(f"no record at offset {offset}")
    body = data[start : start + length]
    if zlib.crc32(body) != crc:
        raise ValueError(f"the record at offset {offset} is damaged")
    try:
        return _event(body, word, offset, resolver)
    except (msgspec.DecodeError, zlib.error) as exc:
        raise ValueError(f"the record at offset {offset} does not decode: {exc}") from None


def _legacy(data: bytes | mmap.mmap, at: int, damage: LogDamage) -> Iterator[Record]:
    end = len(data)
    first = at == 0
    while at < end:
        if end - at < _LEGACY_LENGTH.size:
            damage.truncated_tail += end - at
            damage.not_a_log = first
            return
        (size,) = _LEGACY_LENGTH.unpack_from(data, at)
        if at + _LEGACY_LENGTH.size + size > end:
            damage.truncated_tail += end - at
            damage.not_a_log = first
            return
        following = at + _LEGACY_LENGTH.size + size
        try:
            event = decode(data[at + _LEGACY_LENGTH.size : following])
        except msgspec.DecodeError:
            # Without checksums or sync marks there is no telling where the next record starts.
            damage.damaged_records += 1
            damage.skipped_bytes += end - at
            damage.not_a_log = first
            return
        first = False
        yield Record(at, following, 0.0, event)
        at = following

"""An index of a run's event log, so that a large run opens at once and an episode reads fast.

The log is one stream of records; the viewer asks for episodes by step, by reward, by group, and
for one episode's events. The index (SQLite, `events.index.sqlite` beside the log, or in a temp
folder when the run directory is not writable) holds a row per episode with what the tables show,
the offset of every record that belongs to an episode, and each trained datum (compressed), so an
episode page reads a few dozen records by offset and never the whole log.

Steps are kept as users read them (`step_number`): a training step from 1, an evaluation at the
number of steps trained before it; the events count training steps from 0.

It is built on first open and extended when the log grows: it remembers where the last whole
record ended and scans on from there. A log that shrank or whose head changed (a new run in the
same directory) is indexed again from the start. A record cut short at the end (a run still
writing, or killed mid-write) is left for the next refresh.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sqlite3
import tempfile
import threading
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple, TypeAlias, TypedDict, cast

import msgspec

from platoon.bus.episodes import Router
from platoon.bus.eventlog import EVENT_LOG_NAME, LogDamage, Record, RecordReader, scan
from platoon.bus.events import (
    AgentSpawned,
    BatchReady,
    ComponentFailed,
    Datum,
    DatumsScored,
    EpisodeAbandoned,
    EpisodeFinished,
    EpisodeGraded,
    EpisodeRequested,
    EpisodeStarted,
    EvalFinished,
    Event,
    ModelCallFinished,
    RunFinished,
    TaskRef,
    ToolCalled,
    TrainStepFinished,
    step_number,
)

__all__ = [
    "EPISODE_COLUMNS",
    "INDEX_NAME",
    "EpisodeRow",
    "Failure",
    "MetricRow",
    "RunEnd",
    "RunIndex",
    "SqlValue",
    "StepRow",
    "StoredDatum",
    "Summary",
]

INDEX_NAME = "events.index.sqlite"
_VERSION = "4"  # 3: steps as users read them; 4: the trainer's logprobs of each datum
_HEAD_BYTES = 4096  # the log's first bytes identify it: another run in the same place differs

EPISODE_COLUMNS = (
    "episode_id",
    "group_id",
    "step",
    "purpose",
    "env",
    "split",
    "task_id",
    "harness",
    "attempt",
    "policy_version",
    "status",
    "reason",
    "reward",
    "grade_reason",
    "calls",
    "tool_calls",
    "agents",
    "depth",
    "prompt_tokens",
    "completion_tokens",
    "duration_s",
    "requested_at",
    "finished_at",
    "worker",
)
_TEXT = {"episode_id", "group_id", "purpose", "env", "split", "task_id", "harness", "status", "reason"}
_TEXT |= {"grade_reason", "worker"}
_REAL = {"reward", "duration_s", "requested_at", "finished_at"}

# What SQLite hands back for a column (and takes as a parameter).
SqlValue: TypeAlias = str | int | float | bytes | None


class EpisodeRow(TypedDict):
    """An episode's row of the episodes table (EPISODE_COLUMNS, in order): what the tables show."""

    episode_id: str
    group_id: str | None
    step: int | None
    purpose: str | None
    env: str | None
    split: str | None
    task_id: str | None
    harness: str | None
    attempt: int | None
    policy_version: int | None
    status: str | None
    reason: str | None
    reward: float | None
    grade_reason: str | None
    calls: int | None
    tool_calls: int | None
    agents: int | None
    depth: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    duration_s: float | None
    requested_at: float | None
    finished_at: float | None
    worker: str | None


class StepRow(TypedDict):
    """One (purpose, step) of the steps table."""

    purpose: str | None
    step: int | None
    episodes: int
    graded: int
    reward_mean: float | None
    reward_min: float | None
    reward_max: float | None
    rewarded: int
    completion_tokens: int | None
    in_flight: int


class RunEnd(TypedDict):
    """How the run ended, from its `RunFinished`."""

    status: str
    reason: str | None
    time: float


class Summary(TypedDict):
    """Counts for the runs table."""

    episodes: int
    trained_steps: int
    last_step: int | None
    last_reward: float | None
    first_time: float | None
    last_time: float | None
    finished: RunEnd | None
    log_bytes: int


class StoredDatum(NamedTuple):
    """A datum the trainer got, with its step and what scaled its advantages: credit multiplies
    the rollout's advantage by its depth's weight and, under `loss_normalization: token_mean`,
    divides it by the trained tokens of the step's batch (its policy's)."""

    step: int
    datum: Datum
    batch_tokens: int
    depth_weight: float
    # the trainer's logprob of each target (`DatumsScored`); None where the trainer gave none
    scored: list[float] | None = None


class Failure(TypedDict):
    component: str
    error: str


# A `TrainStepFinished` (or `EvalFinished`): step, time and the metrics, by name.
MetricRow: TypeAlias = dict[str, float]


def _column_type(column: str) -> str:
    return "TEXT" if column in _TEXT else "REAL" if column in _REAL else "INTEGER"


_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS episodes ({", ".join(f"{c} {_column_type(c)}" for c in EPISODE_COLUMNS)},
    PRIMARY KEY (episode_id));
CREATE INDEX IF NOT EXISTS episodes_step ON episodes (purpose, step);
CREATE INDEX IF NOT EXISTS episodes_group ON episodes (group_id);
CREATE TABLE IF NOT EXISTS records (offset INTEGER PRIMARY KEY, episode_id TEXT, type TEXT);
CREATE INDEX IF NOT EXISTS records_episode ON records (episode_id);
CREATE TABLE IF NOT EXISTS requests (request_id TEXT PRIMARY KEY, episode_id TEXT);
CREATE TABLE IF NOT EXISTS datums (episode_id TEXT, agent_id TEXT, step INTEGER, position INTEGER, data BLOB,
    batch_tokens INTEGER, depth_weight REAL, policy TEXT, scored BLOB);
CREATE INDEX IF NOT EXISTS datums_episode ON datums (episode_id);
CREATE TABLE IF NOT EXISTS metrics (kind TEXT, step INTEGER, time REAL, data TEXT);
CREATE TABLE IF NOT EXISTS failures (offset INTEGER PRIMARY KEY, component TEXT, error TEXT);
"""

_datum_decoder = msgspec.msgpack.Decoder(Datum)
_scored_decoder = msgspec.msgpack.Decoder(list[float])
_datum_encoder = msgspec.msgpack.Encoder()


class RunIndex:
    """The index of one run directory's event log. Thread-safe: the server asks from threads."""

    def __init__(self, run_dir: str | os.PathLike[str], *, index_path: str | os.PathLike[str] | None = None):
        self.run_dir = Path(run_dir)
        self.log_path = self.run_dir / EVENT_LOG_NAME
        self._index_path = Path(index_path) if index_path else None
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None
        self.damage = LogDamage(path=str(self.log_path))

    # --- building ---------------------------------------------------------------------------

    @property
    def index_path(self) -> Path:
        if self._index_path is None:
            self._index_path = _place_for(self.run_dir)
        return self._index_path

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            path = self.index_path
            if not path.exists():
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))  # private like the log
            # A long wait: another viewer may be indexing a large log for a minute.
            db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=600)
            # Two viewers opening a new index at once: SQLite answers one of them "database is
            # locked" at once, without waiting, when both change the journal mode or create the
            # tables; so the setting up is taken in turns.
            with open(f"{path}.lock", "w") as turn:
                fcntl.flock(turn, fcntl.LOCK_EX)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.executescript(_SCHEMA)
            self._db = db
        return self._db

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def refresh(self) -> bool:
        """Index what the log gained since the last refresh; True when something was added.

        Another viewer may index the same run at the same time: the write lock is taken first
        and what is indexed read again under it, so each record is indexed once."""
        with self._lock:
            if not self.log_path.is_file():
                return False
            db = self._connect()
            size = self.log_path.stat().st_size
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
            if meta.get("version") == _VERSION and size == int(meta.get("size", -1)):
                self.damage = msgspec.json.decode(meta.get("damage", "{}"), type=LogDamage)
                return False  # the common case, answered without the write lock
            db.execute("BEGIN IMMEDIATE")
            try:
                added = self._update(db, size)
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            return added

    def _update(self, db: sqlite3.Connection, size: int) -> bool:
        head = _head(self.log_path)
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        end = int(meta.get("end", 0))
        fresh = meta.get("version") != _VERSION or meta.get("head") != head[: len(meta.get("head", ""))]
        if fresh or size < end:  # another log in this place: index it from the start
            for table in ("meta", "episodes", "records", "requests", "datums", "metrics", "failures"):
                db.execute(f"DROP TABLE IF EXISTS {table}")
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            end, meta = 0, {}
        if meta and size == int(meta.get("size", -1)):  # another viewer indexed it meanwhile
            self.damage = msgspec.json.decode(meta.get("damage", "{}"), type=LogDamage)
            return False
        damage = msgspec.json.decode(meta["damage"], type=LogDamage) if "damage" in meta else None
        damage = damage or LogDamage(path=str(self.log_path))
        damage.truncated_tail = 0  # measured again: the tail may be whole by now
        writer = _Writer(db)
        for record in scan(self.log_path, end, damage):
            writer.add(record)
            end = max(end, record.end)
        writer.flush()
        values = {
            "version": _VERSION,
            "head": _head(self.log_path),
            "end": str(end),
            "size": str(size),
            "damage": msgspec.json.encode(damage).decode(),
        }
        if writer.first_time is not None:
            db.execute("INSERT OR IGNORE INTO meta VALUES ('first_time', ?)", (str(writer.first_time),))
        if writer.last_time is not None:
            values["last_time"] = str(writer.last_time)
        if writer.finished is not None:
            values["finished"] = writer.finished
        db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", list(values.items()))
        self.damage = damage
        return writer.count > 0

    # --- reading ----------------------------------------------------------------------------

    def _query(self, sql: str, args: tuple[SqlValue, ...] = ()) -> list[tuple[SqlValue, ...]]:
        with self._lock:
            rows: list[tuple[SqlValue, ...]] = self._connect().execute(sql, args).fetchall()
            return rows

    def _count(self, sql: str, args: tuple[SqlValue, ...] = ()) -> int:
        """The one number a `SELECT COUNT(...)` answers."""
        return cast(int, self._query(sql, args)[0][0])

    def meta(self) -> dict[str, str]:
        if not self.log_path.is_file():
            return {}
        return {str(key): str(value) for key, value in self._query("SELECT key, value FROM meta")}

    def summary(self) -> Summary:
        """Counts for the runs table: steps, episodes, the last train step's mean reward."""
        meta = self.meta()
        rows = self._query(
            "SELECT step, AVG(reward), COUNT(*) FROM episodes WHERE purpose = 'train' AND reward IS NOT NULL "
            "GROUP BY step ORDER BY step DESC LIMIT 1"
        )
        episodes = self._count("SELECT COUNT(*) FROM episodes") if meta else 0
        steps = self._count("SELECT COUNT(DISTINCT step) FROM metrics WHERE kind = 'train'") if meta else 0
        last = cast("list[tuple[int, float]]", rows)  # a step, its mean reward (not null: filtered)
        return {
            "episodes": episodes,
            "trained_steps": steps,
            "last_step": last[0][0] if last else None,
            "last_reward": last[0][1] if last else None,
            "first_time": float(meta["first_time"]) if "first_time" in meta else None,
            "last_time": float(meta["last_time"]) if "last_time" in meta else None,
            "finished": json.loads(meta["finished"]) if "finished" in meta else None,
            "log_bytes": int(meta.get("size", 0)),
        }

    def metrics(self, kind: str = "train") -> list[MetricRow]:
        """The metrics of each `TrainStepFinished` (or `EvalFinished`), as the log holds them."""
        rows = self._query("SELECT step, time, data FROM metrics WHERE kind = ? ORDER BY rowid", (kind,))
        metrics = cast("list[tuple[int, float, str]]", rows)  # data: the metrics as JSON
        return [{"step": step, "time": time, **json.loads(data)} for step, time, data in metrics]

    def failures(self, limit: int = 20) -> list[Failure]:
        rows = self._query("SELECT component, error FROM failures ORDER BY offset DESC LIMIT ?", (limit,))
        return [{"component": c, "error": e} for c, e in cast("list[tuple[str, str]]", rows)]

    def steps(self) -> list[StepRow]:
        """One row per (purpose, step): episodes, graded, mean/min/max reward, pass rate, tokens."""
        rows = self._query(
            "SELECT purpose, step, COUNT(*), COUNT(reward), AVG(reward), MIN(reward), MAX(reward), "
            "SUM(CASE WHEN reward > 0 THEN 1 ELSE 0 END), SUM(completion_tokens), "
            "SUM(CASE WHEN status IS NULL THEN 1 ELSE 0 END) "
            "FROM episodes GROUP BY purpose, step ORDER BY purpose DESC, step"
        )
        keys = (
            *("purpose", "step", "episodes", "graded", "reward_mean", "reward_min", "reward_max"),
            *("rewarded", "completion_tokens", "in_flight"),
        )
        # The columns' types are StepRow's: counts, sums and averages over the episodes table.
        return [cast(StepRow, dict(zip(keys, row, strict=True))) for row in rows]

    def facets(self) -> dict[str, list[SqlValue]]:
        """The distinct values of each filterable column, for the filter menus."""
        out: dict[str, list[SqlValue]] = {}
        for column in ("purpose", "status", "env", "harness", "depth", "policy_version"):
            out[column] = [
                v
                for (v,) in self._query(f"SELECT DISTINCT {column} FROM episodes ORDER BY 1")  # nosec B608 # fixed columns, bound values
                if v is not None
            ]
        return out

    def episodes(
        self,
        *,
        filters: Mapping[str, str | int | float | None] | None = None,
        sort: str = "reward",
        descending: bool = True,
        limit: int = 200,
        offset: int = 0,
    ) -> tuple[list[EpisodeRow], int]:
        """Episodes that pass `filters` (column: value, or `min_reward`/`max_reward`/`task`
        substring), sorted by a column; returns (a page of rows, how many match)."""
        where: list[str] = []
        args: list[SqlValue] = []
        for key, value in (filters or {}).items():
            if value is None or value == "":
                continue
            if key == "min_reward":
                where.append("reward >= ?")
                args.append(float(value))
            elif key == "max_reward":
                where.append("reward <= ?")
                args.append(float(value))
            elif key == "task":
                where.append("task_id LIKE ?")
                args.append(f"%{value}%")
            elif key in EPISODE_COLUMNS:
                if value == "-":
                    where.append(f"{key} IS NULL")
                    continue
                where.append(f"{key} = ?")
                args.append(value if key in _TEXT else float(value) if key in _REAL else int(float(value)))
            else:
                raise ValueError(f"no filter {key!r}")
        if sort not in EPISODE_COLUMNS:
            raise ValueError(f"cannot sort by {sort!r}")
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        total = self._count(f"SELECT COUNT(*) FROM episodes{clause}", tuple(args))  # nosec B608 # fixed columns, bound values
        order = "DESC" if descending else "ASC"
        rows = self._query(
            f"SELECT {', '.join(EPISODE_COLUMNS)} FROM episodes{clause} "  # nosec B608 # fixed columns, bound values
            f"ORDER BY {sort} IS NULL, {sort} {order}, requested_at, episode_id LIMIT ? OFFSET ?",
            (*args, int(limit), int(offset)),
        )
        return [_episode_row(row) for row in rows], total

    def episode_row(self, episode_id: str) -> EpisodeRow | None:
        query = f"SELECT {', '.join(EPISODE_COLUMNS)} FROM episodes WHERE episode_id = ?"  # nosec B608 # fixed columns
        rows = self._query(query, (episode_id,))
        return _episode_row(rows[0]) if rows else None

    def episode_records(self, episode_id: str) -> list[Record]:
        """Every record of an episode, in log order, read by offset."""
        rows = self._query("SELECT offset FROM records WHERE episode_id = ? ORDER BY offset", (episode_id,))
        offsets = [o for (o,) in cast("list[tuple[int]]", rows)]
        out = []
        with self.log_path.open("rb") as file:
            reader = RecordReader(file)  # an agent's calls are deltas of its previous ones
            for offset in offsets:
                with contextlib.suppress(ValueError, msgspec.DecodeError):
                    out.append(reader.at(offset))
        return out

    def datums(self, episode_id: str) -> list[StoredDatum]:
        """The datums the trainer got for an episode, with their step, in batch order."""
        rows = self._query(
            "SELECT step, data, batch_tokens, depth_weight, scored FROM datums WHERE episode_id = ? "
            "ORDER BY step, position",
            (episode_id,),
        )
        # data: a compressed Datum; scored: the trainer's logprobs, compressed
        datums = cast("list[tuple[int, bytes, int, float, bytes | None]]", rows)
        return [
            StoredDatum(
                step,
                _datum_decoder.decode(zlib.decompress(data)),
                tokens,
                weight,
                _scored_decoder.decode(zlib.decompress(scored)) if scored else None,
            )
            for step, data, tokens, weight, scored in datums
        ]


def _episode_row(row: tuple[SqlValue, ...]) -> EpisodeRow:
    # The table's columns are EPISODE_COLUMNS, typed as EpisodeRow says (_column_type).
    return cast(EpisodeRow, dict(zip(EPISODE_COLUMNS, row, strict=True)))


class _Writer:
    """Turns records into index rows, batched into few statements."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self.count = 0
        self.first_time: float | None = None
        self.last_time: float | None = None
        self.finished: str | None = None
        self.records: list[tuple[int, str, str]] = []
        # A reply names no episode: the request it answers did, in this refresh or an earlier one.
        self.router = Router(earlier=self._episode_of_reply)

    def add(self, record: Record) -> None:
        self.count += 1
        event = record.event
        if record.time:
            self.first_time = self.first_time if self.first_time is not None else record.time
            self.last_time = record.time
        episode_id = self.router.episode_of(event)
        if episode_id is not None:
            self.records.append((record.offset, episode_id, type(event).__name__))
            self._episode(event, record)
        elif isinstance(event, BatchReady):
            self._batch(event)
        elif isinstance(event, DatumsScored):
            self._scored(event)
        elif isinstance(event, (TrainStepFinished, EvalFinished)):
            kind = "train" if isinstance(event, TrainStepFinished) else "eval"
            self.db.execute(
                "INSERT INTO metrics VALUES (?, ?, ?, ?)",
                (kind, step_number(event.step, kind), record.time, json.dumps(event.metrics)),
            )
        elif isinstance(event, RunFinished):
            self.finished = json.dumps({"status": event.status, "reason": event.reason, "time": record.time})
            # Episodes still unfinished when the run ends were lost to a crash before a resume
            # (the resumed run played their step again): not in flight.
            self.db.execute(
                "UPDATE episodes SET status = 'abandoned', reason = ? WHERE status IS NULL",
                (
                    f"it never finished: its run stopped first (a crash before a resume?), and ended {event.status}",
                ),
            )
        elif isinstance(event, ComponentFailed):
            self.db.execute(
                "INSERT OR REPLACE INTO failures VALUES (?, ?, ?)",
                (record.offset, event.component, event.error[:2000]),
            )
        if len(self.records) >= 5000:
            self.flush()

    def _episode_of_reply(self, request_id: str) -> str | None:
        """The episode of a request asked before an earlier refresh ended."""
        row = self.db.execute(
            "SELECT episode_id FROM requests WHERE request_id = ?", (request_id,)
        ).fetchone()
        if row is None:
            return None
        self.db.execute("DELETE FROM requests WHERE request_id = ?", (request_id,))
        return str(row[0])

    def _upsert(self, episode_id: str, **values: SqlValue) -> None:
        self.db.execute("INSERT OR IGNORE INTO episodes (episode_id) VALUES (?)", (episode_id,))
        if values:
            sets = ", ".join(f"{k} = ?" for k in values)
            query = f"UPDATE episodes SET {sets} WHERE episode_id = ?"  # nosec B608 # columns named in code
            self.db.execute(query, (*values.values(), episode_id))

    def _add(self, episode_id: str, **values: int) -> None:
        self.db.execute("INSERT OR IGNORE INTO episodes (episode_id) VALUES (?)", (episode_id,))
        sets = ", ".join(f"{k} = COALESCE({k}, 0) + ?" for k in values)
        self.db.execute(f"UPDATE episodes SET {sets} WHERE episode_id = ?", (*values.values(), episode_id))  # nosec B608 # fixed columns, bound values

    def _episode(self, event: Event, record: Record) -> None:
        if isinstance(event, EpisodeRequested):
            self._upsert(
                event.episode_id,
                group_id=event.group_id,
                step=step_number(event.step, event.purpose),
                purpose=event.purpose,
                **_task_columns(event.task),
                harness=event.harness,
                attempt=event.attempt,
                policy_version=event.policy_version,
                requested_at=record.time,
            )
        elif isinstance(event, EpisodeStarted):
            self._upsert(
                event.episode_id,
                group_id=event.group_id,
                **_task_columns(event.task),
                worker=event.worker or None,
            )
            self.db.execute(
                "UPDATE episodes SET requested_at = ? WHERE episode_id = ? AND requested_at IS NULL",
                (record.time, event.episode_id),
            )
        elif isinstance(event, AgentSpawned):
            self._add(event.episode_id, agents=1)
            self.db.execute(
                "UPDATE episodes SET depth = MAX(COALESCE(depth, 0), ?), "
                "harness = COALESCE(harness, ?) WHERE episode_id = ?",
                (event.depth, event.harness if event.parent_id is None else None, event.episode_id),
            )
        elif isinstance(event, ModelCallFinished):
            self._add(
                event.episode_id,
                calls=1,
                prompt_tokens=len(event.prompt_tokens),
                completion_tokens=len(event.completion_tokens),
            )
        elif isinstance(event, ToolCalled):
            self._add(event.episode_id, tool_calls=1)
        elif isinstance(event, EpisodeFinished):
            self._upsert(
                event.episode_id,
                group_id=event.group_id,
                **_task_columns(event.task),
                status=event.status,
                reason=event.reason,
                duration_s=event.duration_s,
                finished_at=record.time,
                purpose=event.purpose,
                step=step_number(event.step, event.purpose),
            )
        elif isinstance(event, EpisodeGraded):
            self._upsert(event.episode_id, reward=event.reward, grade_reason=event.reason)
        elif isinstance(event, EpisodeAbandoned):
            self._upsert(event.episode_id, status="abandoned", reason=event.reason)

    def _batch(self, event: BatchReady) -> None:
        tokens = sum(d.num_trained_tokens for d in event.datums)
        self.db.executemany(
            "INSERT INTO datums VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)",
            [
                (
                    d.episode_id,
                    d.agent_id,
                    step_number(event.step),
                    i,
                    zlib.compress(_datum_encoder.encode(d), 1),
                    tokens,
                    _depth_weight(event, d.depth),
                    event.policy,
                )
                for i, d in enumerate(event.datums)
            ],
        )

    def _scored(self, event: DatumsScored) -> None:
        """The trainer's logprobs, onto the datums of its step's batch by their place in it."""
        self.db.executemany(
            "UPDATE datums SET scored = ? WHERE step = ? AND policy = ? AND position = ?",
            [
                (zlib.compress(_datum_encoder.encode(row), 1), step_number(event.step), event.policy, i)
                for i, row in enumerate(event.logprobs)
                if row
            ],
        )

    def flush(self) -> None:
        if self.records:
            self.db.executemany("INSERT OR REPLACE INTO records VALUES (?, ?, ?)", self.records)
            self.records = []
        if self.router.pending:
            self.db.executemany(
                "INSERT OR REPLACE INTO requests VALUES (?, ?)", list(self.router.pending.items())
            )
            self.router.pending.clear()


def _depth_weight(batch: BatchReady, depth: int) -> float:
    """The weight credit gave a depth of the agent tree in this batch (its credit statistics;
    with several policies, prefixed with the policy's name)."""
    for key in (f"{batch.policy}/credit/depth/{depth}/weight", f"credit/depth/{depth}/weight"):
        if key in batch.stats:
            return batch.stats[key]
    return 1.0


def _head(path: Path) -> str:
    with path.open("rb") as file:
        return file.read(_HEAD_BYTES).hex()


def _place_for(run_dir: Path) -> Path:
    """Beside the log when the run directory is writable, else a private temp folder."""
    if os.access(run_dir, os.W_OK):
        return run_dir / INDEX_NAME
    folder = Path(tempfile.gettempdir()) / f"platoon-viewer-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:24]
    return folder / f"{digest}.sqlite"


def iter_rows(
    index: RunIndex,
    *,
    filters: Mapping[str, str | int | float | None] | None = None,
    sort: str = "reward",
    descending: bool = True,
) -> Iterator[EpisodeRow]:
    """Every episode row matching a query, page by page (for export)."""
    offset = 0
    while True:
        rows, _ = index.episodes(filters=filters, sort=sort, descending=descending, limit=1000, offset=offset)
        yield from rows
        if len(rows) < 1000:
            return
        offset += 1000


def _task_columns(task: TaskRef) -> dict[str, str]:
    """An episode's task as the episodes table keeps it."""
    return {"env": task.env, "split": task.split, "task_id": task.task_id}

"""The runs a viewer serves: found under a folder or named one by one, each with what is wrong.

A run is addressed by an id (its path below the served folder, or `experiment/trial`: the
directory above it and its own, as `<runs>/<experiment>/<trial>` lays runs out) that is only
ever looked up in the set the server was started with, never joined onto a path: a URL
cannot name a file outside the served runs.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeAlias, TypedDict

from platoon.bus.eventlog import EVENT_LOG_NAME
from platoon.stats.metrics import counted_from_zero, is_eval_row
from platoon.visualization.episodes import Decoder
from platoon.visualization.index import MetricRow, RunIndex, Summary

__all__ = ["JSON", "Run", "RunInfo", "RunSet"]

# What a JSON file holds once read (`json.loads`).
JSON: TypeAlias = "str | int | float | bool | list[JSON] | dict[str, JSON] | None"


class RunInfo(TypedDict):
    """A run's row of the runs table."""

    id: str
    path: str
    experiment: str
    trial: str
    status: str
    steps: int
    episodes: int
    last_reward: float | None
    started: float | None
    updated: float | None
    log_bytes: int
    problems: list[str]


_MARKERS = (EVENT_LOG_NAME, "metrics.jsonl", "config.yaml", "lock.json", "eval.json")
_SEARCH_DEPTH = 4
_LIVE_SECONDS = 120.0  # a log written this recently without a RunFinished is taken as running


class Run:
    """One run directory: its files, its index, and the problems found reading them."""

    def __init__(self, run_id: str, path: Path) -> None:
        self.id = run_id
        self.path = path
        self.index = RunIndex(path)
        self._tokenizer: Decoder | None = None
        self._tokenizer_error: str | None = None
        self._index_error: str | None = None
        self._lock = threading.Lock()

    # --- files ------------------------------------------------------------------------------

    def refresh(self) -> bool:
        try:
            changed = self.index.refresh()
        except (OSError, ValueError, sqlite3.Error) as exc:
            self._index_error = f"the event log could not be indexed: {exc}"
            return False
        self._index_error = None
        return changed

    def config_text(self) -> str | None:
        try:
            return (self.path / "config.yaml").read_text(errors="replace")
        except OSError:
            return None

    def lock(self) -> tuple[JSON, str | None]:
        """lock.json parsed, or (None, what is wrong)."""
        try:
            return json.loads((self.path / "lock.json").read_text()), None
        except FileNotFoundError:
            return None, "no lock.json"
        except (OSError, ValueError) as exc:
            return None, f"lock.json does not read: {exc}"

    def metrics(self) -> tuple[list[MetricRow], list[str]]:
        """metrics.jsonl's rows (train steps and evals), else the event log's; and problems."""
        path = self.path / "metrics.jsonl"
        rows: list[MetricRow] = []
        problems: list[str] = []
        if path.is_file():
            bad = 0
            with path.open(errors="replace") as file:
                for line in file:
                    try:
                        row = json.loads(line)
                    except ValueError:
                        bad += 1
                        continue
                    if isinstance(row, dict) and isinstance(row.get("step"), int | float):
                        rows.append({k: v for k, v in row.items() if isinstance(v, int | float)})
                    else:
                        bad += 1
            if bad:
                problems.append(f"metrics.jsonl: {bad} lines do not read (cut short by a crash?)")
            return _counted_from_one(rows), problems
        rows = [*self.index.metrics("train"), *self.index.metrics("eval")]
        rows.sort(key=lambda r: (r["step"], r.get("time") or 0))
        return rows, problems

    def experiment_and_trial(self) -> tuple[str, str]:
        lock, _ = self.lock()
        config = lock.get("config", {}) if isinstance(lock, dict) else None
        stats = config.get("stats", {}) if isinstance(config, dict) else None
        experiment = stats.get("experiment_name") if isinstance(stats, dict) else None
        return experiment if isinstance(
            experiment, str
        ) and experiment else self.path.parent.name, self.path.name

    def loss_normalization(self) -> str | None:
        """The run's `train.loss_normalization` (how its datums' advantages were scaled), from
        lock.json; None when the lock does not say."""
        lock, _ = self.lock()
        config = lock.get("config") if isinstance(lock, dict) else None
        train = config.get("train") if isinstance(config, dict) else None
        value = train.get("loss_normalization") if isinstance(train, dict) else None
        return value if isinstance(value, str) else None

    def problems(self, metric_problems: list[str] | None = None) -> list[str]:
        out = []
        if not self.path.is_dir():
            return [f"{self.path} is not a directory"]
        if not any((self.path / name).exists() for name in _MARKERS):
            out.append(
                "not a run directory: none of events.msgpack, metrics.jsonl, config.yaml, lock.json is here"
            )
            return out
        if not self.index.log_path.is_file():
            out.append("no event log (events.msgpack): episodes cannot be shown")
        elif self.index.log_path.stat().st_size == 0:
            out.append("the event log is empty: the run has not written anything yet")
        if self._index_error:
            out.append(self._index_error)
        if self.index.damage.found:
            out.append("the event log is damaged: " + self.index.damage.describe())
        if not (self.path / "config.yaml").is_file():
            out.append("no config.yaml")
        _, lock_problem = self.lock()
        if lock_problem and lock_problem != "no lock.json":
            out.append(lock_problem)
        if metric_problems is None:
            _, metric_problems = self.metrics()
        out += metric_problems
        return out

    def status(self, summary: Summary) -> str:
        finished = summary["finished"]
        if finished:
            return str(finished.get("status", "finished"))
        if not self.index.log_path.is_file():
            return "finished" if (self.path / "eval.json").exists() else "no log"
        last = self.index.log_path.stat().st_mtime
        if time.time() - last < _LIVE_SECONDS:
            return "running"
        return "stopped" if summary["episodes"] else "empty"

    def info(self) -> RunInfo:
        """The runs table's row."""
        self.refresh()
        summary = self.index.summary() if self.index.log_path.is_file() else _NO_LOG
        experiment, trial = self.experiment_and_trial()
        rows, metric_problems = self.metrics()
        train_rows = [r for r in rows if "reward/mean" in r]
        last_reward = train_rows[-1]["reward/mean"] if train_rows else summary["last_reward"]
        started = summary["first_time"]
        if started is None:
            try:
                started = min((self.path / n).stat().st_mtime for n in _MARKERS if (self.path / n).exists())
            except ValueError:
                started = None
        return {
            "id": self.id,
            "path": str(self.path),
            "experiment": experiment,
            "trial": trial,
            "status": self.status(summary),
            "steps": len({r["step"] for r in train_rows}) or summary["trained_steps"] or 0,
            "episodes": summary["episodes"],
            "last_reward": last_reward,
            "started": started,
            "updated": summary["last_time"],
            "log_bytes": summary["log_bytes"],
            "problems": self.problems(metric_problems),
        }

    # --- tokens -----------------------------------------------------------------------------

    def tokenizer(self) -> Decoder | None:
        """The run's tokenizer, to show token ids as text (None when it cannot be loaded here)."""
        with self._lock:
            if self._tokenizer is None and self._tokenizer_error is None:
                try:
                    self._tokenizer = _load_tokenizer(self)
                except Exception as exc:
                    self._tokenizer_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            return self._tokenizer

    @property
    def tokenizer_error(self) -> str | None:
        return self._tokenizer_error


# The summary of a run that has no event log (yet).
_NO_LOG: Summary = {
    "episodes": 0,
    "trained_steps": 0,
    "last_step": None,
    "last_reward": None,
    "first_time": None,
    "last_time": None,
    "finished": None,
    "log_bytes": 0,
}


def _load_tokenizer(run: Run) -> Decoder:
    """From the directory the config names (`train.tokenizer` or `train.model_name`), or the
    HF cache; `tokenizers` alone, which loads in milliseconds. Never downloads."""
    lock, _ = run.lock()
    config = lock.get("config") if isinstance(lock, dict) else None
    train = config.get("train") if isinstance(config, dict) else None
    name = (train.get("tokenizer") or train.get("model_name")) if isinstance(train, dict) else None
    if not name or not isinstance(name, str):
        raise LookupError("the run's lock.json names no model or tokenizer")
    from tokenizers import Tokenizer

    local = Path(name).expanduser() / "tokenizer.json"
    if local.is_file():
        return Tokenizer.from_file(str(local))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(name, "tokenizer.json")
    if isinstance(cached, str):
        return Tokenizer.from_file(cached)
    raise LookupError(f"the tokenizer of {name!r} is not on this machine")


class RunSet:
    """The runs a server shows: every run below `root`, or the directories named."""

    def __init__(
        self, paths: list[str | os.PathLike[str]] | None = None, *, root: str | os.PathLike[str] | None = None
    ):
        self.root = Path(root).expanduser() if root is not None else None
        self._named = [Path(p).expanduser() for p in paths or []]
        self._runs: dict[str, Run] = {}
        self._lock = threading.Lock()
        self.rescan()

    def rescan(self) -> None:
        """Pick up runs that appeared under the root (or under a named folder) since the start."""
        with self._lock:
            known = {run.path: run for run in self._runs.values()}
            found: list[tuple[str, Path]] = []
            if self.root is not None:
                found += [(_relative(p, self.root), p) for p in _find_runs(self.root)]
            taken: set[str] = {i for i, _ in found}
            for named in self._named:
                paths = [named] if _is_run(named) or not named.is_dir() else _find_runs(named) or [named]
                for path in paths:
                    base = (
                        "/".join(p for p in (path.parent.name, path.name) if p)
                        if path == named
                        else f"{named.name}/{_relative(path, named)}"
                    )
                    run_id, n = base or "run", 2
                    while run_id in taken:
                        run_id, n = f"{base}~{n}", n + 1
                    taken.add(run_id)
                    found.append((run_id, path))
            self._runs = {run_id: known.get(path) or Run(run_id, path) for run_id, path in found}
            for run_id, run in self._runs.items():
                run.id = run_id

    def get(self, run_id: str) -> Run | None:
        return self._runs.get(run_id)

    def lookup(self, run_id: str) -> Run | None:
        """The run of that id; one that appeared under the root since the last scan is taken in
        if its own folder is a run. An unknown id costs a few `stat`s, never a walk of the root
        (300 unknown ids once took 15 s, each rescanning it)."""
        run = self._runs.get(run_id)
        if run is not None or self.root is None:
            return run
        parts = run_id.split("/")
        if len(parts) > _SEARCH_DEPTH or any(not p or p.startswith(".") for p in parts):
            return None
        path = self.root
        for part in parts:  # as the walk goes: no hidden folder, no link
            path = path / part
            if path.is_symlink():
                return None
        if not _is_run(path):
            return None
        with self._lock:
            return self._runs.setdefault(run_id, Run(run_id, path))

    def __iter__(self) -> Iterator[Run]:
        return iter(list(self._runs.values()))

    def __len__(self) -> int:
        return len(self._runs)


def _counted_from_one(rows: list[MetricRow]) -> list[MetricRow]:
    """The rows of a metrics.jsonl of platoon 0.2 and before, with their steps as users read them."""
    if not counted_from_zero(rows):
        return rows
    return [row if is_eval_row(row) else {**row, "step": row["step"] + 1} for row in rows]


def _is_run(path: Path) -> bool:
    return path.is_dir() and any((path / name).exists() for name in _MARKERS)


def _find_runs(root: Path) -> list[Path]:
    out: list[Path] = []

    def walk(folder: Path, depth: int) -> None:
        if _is_run(folder):
            out.append(folder)
            return
        if depth >= _SEARCH_DEPTH:
            return
        try:
            children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())
        except OSError:
            return
        for child in children:
            if not child.name.startswith("."):
                walk(child, depth + 1)

    if root.is_dir():
        walk(root, 0)
    return out


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix() or path.name
    except ValueError:
        return path.name

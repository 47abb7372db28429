"""A Harbor dataset: a directory of task directories, with recorded metadata, a
deterministic held-out split of whole groups, and a content digest to pin it."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from .errors import HarborError
from .task import HarborTask, load_task

__all__ = ["Dataset", "Holdout", "dataset_digest", "holdout_groups", "load_dataset"]

_INDEX_SOURCES = ("metadata", "task")
_IGNORED = {".git", "__pycache__", ".DS_Store"}


class Holdout(msgspec.Struct, frozen=True, kw_only=True):
    """Hold out whole groups (tasks sharing `group_by`'s value; each task its own group
    when None) as the eval split, about `fraction` of the tasks. `seed` picks another
    equally deterministic split."""

    fraction: float
    group_by: str | None = None
    seed: str = ""

    def __post_init__(self) -> None:
        if not (0.0 <= self.fraction < 1.0):
            raise HarborError(f"holdout.fraction must be in [0, 1), got {self.fraction!r}")


class Dataset(msgspec.Struct, frozen=True, kw_only=True):
    """Tasks by name, what `index` recorded for each, and the train/eval split."""

    root: str
    tasks: dict[str, HarborTask]
    records: dict[str, dict[str, Any]]
    train: list[str]
    eval: list[str]
    digest: str

    def split(self, name: str) -> list[HarborTask]:
        """The tasks of split "train" or "eval", in name order."""
        if name not in ("train", "eval"):
            raise HarborError(f"unknown split {name!r}; splits are 'train' and 'eval'")
        return [self.tasks[n] for n in (self.train if name == "train" else self.eval)]


def load_dataset(
    directory: str | os.PathLike[str],
    *,
    index: Sequence[Mapping[str, Sequence[str]]] = (),
    holdout: Holdout | Mapping[str, Any] | None = None,
) -> Dataset:
    """Load every task under `directory` (or `directory` itself when it is one task).

    `index` lists what to record per task, e.g. `[{"metadata": ["topic"]}]`; `holdout`
    is a Holdout or `{fraction, group_by, seed}`. Any refused task refuses the dataset.
    """
    root = Path(directory)
    if not root.is_dir():
        raise HarborError(f"dataset {str(root)!r} is not a directory")
    if (root / "task.toml").is_file():
        dirs = [root]
    else:
        dirs = sorted(
            p
            for p in root.iterdir()
            if p.is_dir() and not p.name.startswith(".") and (p / "task.toml").exists()
        )
    if not dirs:
        raise HarborError(f"dataset {str(root)!r} holds no task directories (no */task.toml)")
    tasks = {task.name: task for task in map(load_task, dirs)}
    records = {name: _record(task, index) for name, task in tasks.items()}
    if holdout is not None and not isinstance(holdout, Holdout):
        try:
            holdout = msgspec.convert(dict(holdout), Holdout)
        except msgspec.ValidationError as exc:
            raise HarborError(f"holdout: {exc}") from None
    held: set[str] = set()
    if holdout is not None and holdout.fraction > 0:
        groups: dict[str, list[str]] = {}
        for name in tasks:
            groups.setdefault(_group_of(name, tasks[name], records[name], holdout.group_by), []).append(name)
        for group in holdout_groups(groups, holdout.fraction, holdout.seed):
            held.update(groups[group])
    names = sorted(tasks)
    return Dataset(
        root=str(root.resolve()),
        tasks={name: tasks[name] for name in names},
        records=records,
        train=[n for n in names if n not in held],
        eval=[n for n in names if n in held],
        digest=dataset_digest(root),
    )


def _record(task: HarborTask, index: Sequence[Mapping[str, Sequence[str]]]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for entry in index:
        for source, keys in entry.items():
            if source not in _INDEX_SOURCES:
                raise HarborError(f"index: unknown source {source!r}; known: {', '.join(_INDEX_SOURCES)}")
            if isinstance(keys, str):
                raise HarborError(f"index: {source} must list keys, e.g. {{{source}: [{keys}]}}")
            table = task.metadata if source == "metadata" else msgspec.to_builtins(task.config.task or {})
            for key in keys:
                record[key] = table.get(key)
    return record


def _group_of(name: str, task: HarborTask, record: dict[str, Any], group_by: str | None) -> str:
    if group_by is None:
        return name
    value = record[group_by] if group_by in record else task.metadata.get(group_by)
    if value is None:
        raise HarborError(f"holdout: task {name} has no {group_by!r} to group by")
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def holdout_groups(groups: Mapping[str, Sequence[str]], fraction: float, seed: str = "") -> list[str]:
    """Which groups to hold out: in the order of sha256(seed, group), take groups until
    `fraction` of the tasks is held, and always leave at least one group for training.

    Depends only on group names, sizes and seed, so every machine gets the same split.
    """
    order = sorted(groups, key=lambda g: hashlib.sha256(f"{seed}\0{g}".encode()).hexdigest())
    total = sum(len(members) for members in groups.values())
    target = math.ceil(fraction * total - 1e-9)
    chosen: list[str] = []
    held = 0
    for group in order[:-1]:
        if held >= target:
            break
        chosen.append(group)
        held += len(groups[group])
    return sorted(chosen)


def dataset_digest(directory: str | os.PathLike[str]) -> str:
    """`sha256:` over every file's relative path and bytes (links by their target text),
    so the same content gives the same digest wherever it lives."""
    root = Path(directory)
    digest = hashlib.sha256()
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _IGNORED)
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            if name not in _IGNORED:
                entries.append(Path(dirpath, name))
    for path in sorted(entries, key=lambda p: p.relative_to(root).as_posix()):
        rel = path.relative_to(root).as_posix().encode()
        if path.is_symlink():
            digest.update(b"L\0" + rel + b"\0" + os.readlink(path).encode() + b"\0")
            continue
        digest.update(b"F\0" + rel + b"\0" + str(path.stat().st_size).encode() + b"\0")
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        digest.update(b"\0" + (b"x" if path.stat().st_mode & 0o111 else b"-"))
    return "sha256:" + digest.hexdigest()

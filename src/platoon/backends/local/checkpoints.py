"""Checkpoints on local disk: where each lives, how one is written whole (staged, checksummed,
renamed into place) and checked, and the catalogue the REST routes list.

`tinker://<run>/<weights|sampler_weights>/<name>` is the directory `<root>/<run>/<kind>/<name>`.
Each run keeps its checkpoints' marks (`public`, `expires_at`) in one JSON file beside them.
What is written here is its owner's alone, whatever the umask: folders 0700, files 0600 (the
weights, the optimizer's state and the manifest are a trained policy).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

import msgspec

from platoon.backends.local.specs import EngineError, LoraSpec, ModelNotFound

__all__ = [
    "CheckpointInfo",
    "CheckpointStore",
    "Mark",
    "check_manifest",
    "check_name",
    "private_dir",
    "read_spec",
]

_NAME = re.compile(r"^[A-Za-z0-9._\-]{1,200}$")  # a file name any file system takes
_KINDS = ("weights", "sampler_weights")
_RUN = re.compile(r"^[A-Za-z0-9._:\-]{1,200}$")
_MARKS = "_checkpoints.json"  # per run: checkpoint id -> Mark
_MANIFEST = "platoon_manifest.json"
_ADAPTER = "adapter_model.safetensors"


class Mark(TypedDict, total=False):
    """What a checkpoint is marked with besides its files."""

    public: bool
    expires_at: float | None  # unix time; None: never


class CheckpointInfo(msgspec.Struct, frozen=True):
    checkpoint_id: str  # "weights/NAME" or "sampler_weights/NAME"
    kind: str
    tinker_path: str
    time: float
    size_bytes: int
    public: bool = False
    expires_at: float | None = None


class CheckpointStore:
    """The checkpoints under one directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def sweep_partial(self) -> list[Path]:
        """Remove what a write cut short by a kill left (`<name>.partial` staging folders, the
        marks' staging file); the server that owns this folder calls it as it starts, when no
        write of its own can be under way. Returns what it removed."""
        if not self.root.is_dir():
            return []
        left = [path for kind in _KINDS for path in self.root.glob(f"*/{kind}/*.partial")]
        left += self.root.glob(f"*/{Path(_MARKS).stem}.partial")
        for path in left:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        return left

    def path(self, model_id: str, kind: str, name: str) -> tuple[str, Path]:
        """The tinker path and directory of a new checkpoint of `model_id`."""
        check_name(name)
        return f"tinker://{model_id}/{kind}/{name}", self.root / model_id / kind / name

    def local_path(self, tinker_path: str) -> Path:
        """The directory behind a `tinker://<run>/<weights|sampler_weights>/<name>` path."""
        if not tinker_path.startswith("tinker://"):
            raise EngineError(f"path {tinker_path!r} must start with tinker://")
        parts = tinker_path[len("tinker://") :].split("/")
        if len(parts) != 3 or parts[1] not in _KINDS or not all(parts):
            raise EngineError(f"path {tinker_path!r} is not tinker://<run>/<weights|sampler_weights>/<name>")
        run, kind, name = parts
        if run in {".", ".."} or name in {".", ".."}:
            raise EngineError(f"path {tinker_path!r} is not a checkpoint path")
        directory = self.root / run / kind / name
        if not (directory / _ADAPTER).is_file():
            raise ModelNotFound(f"no checkpoint at {tinker_path}")
        return directory

    def write(self, directory: Path, fill: Callable[[Path], None]) -> None:
        """Write a checkpoint whole: `fill` writes its files into a staging directory, which is
        checksummed and then renamed to `directory` (replacing what was there)."""
        staging = directory.with_name(directory.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        private_dir(staging)
        fill(staging)
        for path in staging.iterdir():
            path.chmod(0o600 if path.is_file() else 0o700)
        _write_manifest(staging)
        shutil.rmtree(directory, ignore_errors=True)
        staging.rename(directory)

    def copy(self, tinker_path: str, run_id: str) -> str:
        """Copy a checkpoint, whole, into run `run_id` under the same kind and name."""
        source = self.local_path(tinker_path)
        kind, name = source.parent.name, source.name
        path, directory = self.path(run_id, kind, name)
        self.run_dir(run_id)  # a valid run id
        if directory.exists():
            raise EngineError(f"checkpoint {path} already exists")
        check_manifest(source)
        self.write(directory, lambda staging: _copy_files(source, staging))
        return path

    # ---- the catalogue ----------------------------------------------------------------

    def runs(self) -> list[str]:
        """Training run ids (model ids) with a checkpoint directory, newest first."""
        if not self.root.is_dir():
            return []
        runs = [d for d in self.root.iterdir() if d.is_dir() and not d.name.startswith("_") and d.name]
        return [d.name for d in sorted(runs, key=lambda d: d.stat().st_mtime, reverse=True)]

    def listing(self, run_id: str) -> tuple[list[CheckpointInfo], list[str]]:
        """The live checkpoints of a run, oldest first, and the ids of its expired ones."""
        run = self.run_dir(run_id)
        found: list[CheckpointInfo] = []
        expired: list[str] = []
        marks = self._marks(run_id)
        now = time.time()
        for kind in _KINDS:
            folder = run / kind
            if not folder.is_dir():
                continue
            for directory in folder.iterdir():
                if directory.name.endswith(".partial") or not (directory / _ADAPTER).is_file():
                    continue
                checkpoint_id = f"{kind}/{directory.name}"
                mark = marks.get(checkpoint_id, {})
                expires = mark.get("expires_at")
                if expires is not None and expires <= now:
                    expired.append(checkpoint_id)
                    continue
                found.append(
                    CheckpointInfo(
                        checkpoint_id=checkpoint_id,
                        kind=kind,
                        tinker_path=f"tinker://{run_id}/{checkpoint_id}",
                        time=(directory / _ADAPTER).stat().st_mtime,
                        size_bytes=sum(f.stat().st_size for f in directory.iterdir() if f.is_file()),
                        public=bool(mark.get("public", False)),
                        expires_at=expires,
                    )
                )
        return sorted(found, key=lambda c: (c.time, c.checkpoint_id)), expired

    def remove(self, run_id: str, checkpoint_id: str) -> None:
        shutil.rmtree(self.directory_of(run_id, checkpoint_id))
        self._mark(run_id, checkpoint_id, None)

    def mark(self, run_id: str, checkpoint_id: str, mark: Mark) -> None:
        """Set `public` or `expires_at` on a saved checkpoint."""
        if not self.directory_of(run_id, checkpoint_id).is_dir():
            raise ModelNotFound(f"no checkpoint at tinker://{run_id}/{checkpoint_id}")
        self._mark(run_id, checkpoint_id, self._marks(run_id).get(checkpoint_id, Mark()) | mark)

    def run_dir(self, run_id: str) -> Path:
        if not run_id or not _RUN.match(run_id) or run_id in {".", ".."}:
            raise ModelNotFound(f"unknown training run {run_id!r}")
        return self.root / run_id

    def directory_of(self, run_id: str, checkpoint_id: str) -> Path:
        kind, _, name = checkpoint_id.partition("/")
        if kind not in _KINDS or not _NAME.match(name) or name in {".", ".."}:
            raise ModelNotFound(
                f"unknown checkpoint {checkpoint_id!r} (want weights/NAME or sampler_weights/NAME)"
            )
        return self.run_dir(run_id) / kind / name

    def _marks(self, run_id: str) -> dict[str, Mark]:
        try:
            return json.loads((self.run_dir(run_id) / _MARKS).read_text())
        except (OSError, ValueError):
            return {}

    def _mark(self, run_id: str, checkpoint_id: str, mark: Mark | None) -> None:
        marks = self._marks(run_id)
        if mark is None:
            if marks.pop(checkpoint_id, None) is None:
                return
        else:
            marks[checkpoint_id] = mark
        target = self.run_dir(run_id) / _MARKS
        staging = target.with_suffix(".partial")
        _write_private(staging, json.dumps(marks).encode())
        staging.replace(target)


def check_name(name: str) -> None:
    """A checkpoint name a client may give: a file name, without a path."""
    if not _NAME.match(name) or name in {".", ".."}:
        shown = name if len(name) <= 60 else f"{name[:60]}... ({len(name)} characters)"
        raise EngineError(f"checkpoint name {shown!r} must be 1 to 200 letters, digits, '.', '_' or '-'")


def private_dir(path: Path) -> None:
    """`path` and each folder made on the way to it: 0700, whatever the umask."""
    made = []
    folder = path
    while not folder.exists() and folder != folder.parent:
        made.append(folder)
        folder = folder.parent
    path.mkdir(parents=True, exist_ok=True)
    for folder in made:
        folder.chmod(0o700)


def _write_private(path: Path, content: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as file:
        os.fchmod(file.fileno(), 0o600)  # an older file of another mode keeps it otherwise
        file.write(content)


def _copy_files(source: Path, staging: Path) -> None:
    for path in source.iterdir():
        if path.is_file() and path.name != _MANIFEST:
            shutil.copy2(path, staging / path.name)


def _write_manifest(directory: Path) -> None:
    """sha256 of every file of a checkpoint, each synced to disk before the directory is renamed."""
    digests = {}
    for path in sorted(directory.iterdir()):
        if path.is_file():
            digests[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
            with path.open("rb") as file:
                os.fsync(file.fileno())
    _write_private(directory / _MANIFEST, json.dumps(digests, indent=1).encode())


def check_manifest(directory: Path) -> None:
    """A damaged checkpoint is an EngineError naming the file, not a KeyError from deep inside torch."""
    manifest = directory / _MANIFEST
    if not manifest.is_file():
        return  # written before checksums
    try:
        digests = json.loads(manifest.read_text())
    except ValueError:
        raise EngineError(f"checkpoint {directory}: its manifest is damaged") from None
    for name, digest in digests.items():
        path = directory / name
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            raise EngineError(f"checkpoint {directory}: {name} is missing or damaged (checksum mismatch)")


def read_spec(directory: Path) -> LoraSpec:
    """The LoRA config a checkpoint was trained with."""
    try:
        meta = json.loads((directory / "platoon_lora.json").read_text())
        return msgspec.convert(meta["lora"], LoraSpec)
    except Exception:
        raise EngineError(f"{directory.name}: not a checkpoint written by this server") from None

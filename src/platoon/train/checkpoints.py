"""Checkpoints and what a resume may not change.

`checkpoints.jsonl` in the run directory holds one line per saved checkpoint: the training
state's path (weights and optimizer), the sampler weights' path, the step it completes (counted
from 1, as the terminal counts: `"step": 4` is saved after four steps, `state-000004`), the
policy version and the task cursor. A line is written only after both saves returned, and the
file is replaced whole (written aside, synced, renamed), so no line is ever torn. A line that
cannot be read (the file damaged on disk) is skipped with a warning; a resume tries the newest
checkpoint first and falls back to older ones whose files still load (see `train.loop`).

On the embedded backend a line also holds `digests`: the sha256 of each saved checkpoint's
manifest (which holds the sha256 of each of its files), so a resume or an export notices a
checkpoint deleted, damaged or replaced since (another process on the machine may have reached
the training service), says which, and a resume falls back to the one before
(`checkpoint_problem`).

`identity.json` records what a run is: the model, the renderer, the LoRA rank and the
held-out split. A resume whose config changes any of them is refused.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import structlog

from platoon.config.rundir import make_private_dir, write_private

log = structlog.get_logger("platoon.checkpoints")

__all__ = [
    "Checkpoint",
    "CheckpointNotFound",
    "CheckpointStore",
    "ResumeError",
    "checkpoint_problem",
    "locate_weights",
    "manifest_digest",
]


class ResumeError(RuntimeError):
    """The run cannot be resumed with this config."""


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    step: int  # the step it was saved after, from 1: the number of steps trained
    state_path: str
    sampler_path: str
    policy_version: int
    task_cursor: int
    digests: dict[str, str] = {}  # tinker path -> sha256 of its manifest (the embedded backend's)


_MANIFEST = "platoon_manifest.json"  # what the embedded server writes beside a checkpoint's files


def manifest_digest(root: Path) -> Callable[[str], str | None]:
    """How a trainer records a checkpoint saved under `root` (the run's `tinker` folder): the
    sha256 of its manifest, or None for a path whose files are not there."""

    def digest(path: str) -> str | None:
        parts = _tinker_parts(path)
        try:
            return (
                hashlib.sha256((root.joinpath(*parts) / _MANIFEST).read_bytes()).hexdigest()
                if parts
                else None
            )
        except OSError:
            return None

    return digest


def checkpoint_problem(checkpoint: Checkpoint, root: Path) -> str | None:
    """Why a recorded checkpoint's files under `root` are not what was saved: the one missing,
    changed or damaged, by name; None when they are (or nothing was recorded of them)."""
    for path, recorded in checkpoint.digests.items():
        parts = _tinker_parts(path)
        directory = root.joinpath(*parts) if parts else None
        if directory is None or not (directory / _MANIFEST).is_file():
            return f"{path} is missing (deleted since it was saved?)"
        manifest = (directory / _MANIFEST).read_bytes()
        if hashlib.sha256(manifest).hexdigest() != recorded:
            return f"{path} is not the checkpoint saved at step {checkpoint.step}: its manifest changed"
        try:
            files = json.loads(manifest)
        except ValueError:
            return f"{path}: its manifest is damaged"
        for name, digest in files.items():
            file = directory / name
            if not file.is_file() or hashlib.sha256(file.read_bytes()).hexdigest() != digest:
                return f"{path}: {name} is missing or damaged"
    return None


class CheckpointStore:
    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "checkpoints.jsonl"
        self.identity_path = self.run_dir / "identity.json"

    def append(self, checkpoint: Checkpoint) -> None:
        """Record a checkpoint: the file is rewritten aside and renamed over the old one."""
        self._write([*reversed(self.candidates(quiet=True)), checkpoint])

    def keep_through(self, checkpoint: Checkpoint) -> None:
        """Forget checkpoints newer than `checkpoint` (ones whose files did not load)."""
        kept = [c for c in reversed(self.candidates(quiet=True)) if c.step <= checkpoint.step]
        self._write(kept)

    def keep_newest(self, n: int) -> list[Checkpoint]:
        """Record only the newest `n` checkpoints; returns the ones dropped, oldest first."""
        newest = self.candidates(quiet=True)
        if len(newest) <= n:
            return []
        self._write(list(reversed(newest[:n])))
        return list(reversed(newest[n:]))

    def _write(self, records: list[Checkpoint]) -> None:
        make_private_dir(self.run_dir)
        write_private(self.path, b"".join(msgspec.json.encode(c) + b"\n" for c in records))

    def candidates(self, *, quiet: bool = False) -> list[Checkpoint]:
        """The readable checkpoints, newest first. A file with lines but none readable is an error."""
        if not self.path.exists():
            return []
        found: list[Checkpoint] = []
        bad = 0
        for line in self.path.read_bytes().splitlines():
            if not line.strip():
                continue
            try:
                found.append(_counted_from_one(msgspec.json.decode(line, type=Checkpoint)))
            except msgspec.DecodeError:
                bad += 1
        if bad and not quiet:
            log.warning("unreadable lines in checkpoints.jsonl skipped", path=str(self.path), lines=bad)
        if bad and not found:
            raise ResumeError(
                f"{self.path} holds no readable checkpoint ({bad} damaged lines); start a new run "
                "directory, or restore the file from a backup"
            )
        found.sort(key=lambda c: c.step, reverse=True)
        return found

    def latest(self) -> Checkpoint | None:
        found = self.candidates()
        return found[0] if found else None

    def write_identity(self, identity: dict[str, Any]) -> None:
        make_private_dir(self.run_dir)
        write_private(self.identity_path, json.dumps(identity, indent=2, sort_keys=True).encode())

    def check_identity(self, identity: dict[str, Any]) -> None:
        """Refuse a resume that changes what the run is."""
        if not self.identity_path.exists():
            raise ResumeError(f"{self.run_dir} is not a platoon training run (no identity.json)")
        recorded = json.loads(self.identity_path.read_text())
        changed = [
            f"{key}: {recorded.get(key)!r} -> {identity.get(key)!r}"
            for key in sorted(set(recorded) | set(identity))
            if recorded.get(key) != identity.get(key)
        ]
        if changed:
            raise ResumeError("a resume cannot change what the run trains; changed: " + "; ".join(changed))


def _counted_from_one(checkpoint: Checkpoint) -> Checkpoint:
    """A line of platoon 0.2 and before counted steps from 0 (`"step": 3` beside `state-000004`,
    the name every trainer gives it): read it as the step it was saved after."""
    if checkpoint.state_path.rpartition("/")[2] == f"state-{checkpoint.step + 1:06d}":
        return msgspec.structs.replace(checkpoint, step=checkpoint.step + 1)
    return checkpoint


class CheckpointNotFound(LookupError):
    """Sampler weights that no run directory on this machine holds."""


_KINDS = ("sampler_weights", "weights")


_PART = re.compile(r"^[A-Za-z0-9._:\-]+$")  # a run id or checkpoint name, as the embedded server makes them


def _tinker_parts(path: str) -> tuple[str, str, str] | None:
    parts = path.removeprefix("tinker://").split("/")
    if not path.startswith("tinker://") or len(parts) != 3 or parts[1] not in _KINDS:
        return None
    if not all(_PART.match(p) and p not in (".", "..") for p in parts):
        return None
    return parts[0], parts[1], parts[2]


def _checkpoint_files(directory: Path) -> bool:
    return (directory / "adapter_model.safetensors").is_file()


def locate_weights(ref: str, roots: Sequence[str | Path] = ()) -> tuple[Path, str]:
    """Where the embedded backend finds a finished run's weights, for evaluating or exporting them.

    `ref` is a `tinker://<session>/<sampler_weights|weights>/<name>` path that a run trained on
    the embedded backend wrote (looked for in the run directories under each of `roots`), a
    checkpoint's directory (`RUN_DIR/tinker/<session>/sampler_weights/ckpt-000010`), or a run
    directory (its newest checkpoint's sampler weights). Returns (the checkpoint directory a
    server loads them from, their tinker:// path there); raises `CheckpointNotFound` saying
    what was looked for."""
    parts = _tinker_parts(ref)
    if parts is not None:
        session, kind, name = parts
        for root in roots:
            root = Path(root).expanduser()
            # <runs>/<experiment>/<trial>/tinker[-<policy>]/<session>/..., or a run directory itself
            for pattern in (f"*/*/tinker*/{session}", f"tinker*/{session}", f"*/tinker*/{session}"):
                for found in sorted(root.glob(pattern)):
                    if _checkpoint_files(found / kind / name):
                        return found.parent, ref
        where = ", ".join(str(r) for r in roots) or "nowhere"
        raise CheckpointNotFound(
            f"no run directory under {where} holds {ref}; give the run directory or the checkpoint's "
            "directory instead (RUN_DIR/tinker/<session>/sampler_weights/<name>)"
        )
    path = Path(ref).expanduser()
    if _checkpoint_files(path) and path.parent.name in _KINDS:
        session_dir = path.parent.parent
        return session_dir.parent, f"tinker://{session_dir.name}/{path.parent.name}/{path.name}"
    if (path / "checkpoints.jsonl").is_file():
        latest = CheckpointStore(path).latest()
        if latest is None:
            raise CheckpointNotFound(f"{path}: the run saved no checkpoint")
        return locate_weights(latest.sampler_path, [path])
    raise CheckpointNotFound(
        f"{ref!r} is neither a tinker:// path, a checkpoint directory nor a run directory with checkpoints"
    )

"""What happens between a task's agent and its verifier: collect hooks, then artifacts.

`[[verifier.collect]]` commands run in the sandbox first (best effort, as Harbor runs them: a
failing hook is noted, never fatal). Then every artifact entry, and the conventional
`/logs/artifacts` folder, is copied out of the sandbox into a host folder laid out as Harbor's
trial folder is (`<source path>` or `<destination>`, and `manifest.json` saying what was copied).
A separate verifier gets them back at their source paths (`upload_artifacts`).
"""

from __future__ import annotations

import fnmatch
import functools
import os
import posixpath
import shutil
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

import anyio
import anyio.to_thread
import msgspec

from ...sandbox import Sandbox, SandboxError
from .config import Artifact, ArtifactConfig, VerifierCollectConfig

__all__ = ["ARTIFACTS_DIR", "collect_artifacts", "run_collect_hooks", "upload_artifacts"]

ARTIFACTS_DIR = "/logs/artifacts"  # where an agent publishes artifacts by convention
MANIFEST = "manifest.json"


class ManifestEntry(msgspec.Struct, frozen=True, kw_only=True):
    source: str
    destination: str
    status: str  # "ok", "missing" or "failed: <why>"


async def run_collect_hooks(
    sandbox: Sandbox, hooks: Sequence[VerifierCollectConfig], *, cwd: str | None = None
) -> list[str]:
    """Run each hook in the sandbox; returns what went wrong, one line per failing hook."""
    problems = []
    for hook in hooks:
        user = None if hook.user is None else str(hook.user)
        try:
            result = await sandbox.exec(hook.command, cwd=cwd, timeout=hook.timeout_sec, user=user)
        except SandboxError as exc:
            problems.append(f"collect hook {hook.command!r} failed: {exc}")
            continue
        if result.timed_out:
            problems.append(f"collect hook {hook.command!r} timed out after {hook.timeout_sec:g} s")
        elif result.return_code != 0:
            problems.append(f"collect hook {hook.command!r} exited with code {result.return_code}")
    return problems


def _entries(artifacts: Sequence[Artifact]) -> list[ArtifactConfig]:
    """The entries as structs, led by the conventional folder unless one already names it."""
    entries = [ArtifactConfig(source=a) if isinstance(a, str) else a for a in artifacts]
    if not any(e.source.rstrip("/") == ARTIFACTS_DIR for e in entries):
        entries.insert(0, ArtifactConfig(source=ARTIFACTS_DIR))
    return entries


def _host_place(entry: ArtifactConfig) -> str:
    """Where an entry goes under the host folder: its destination, else its source's path."""
    path = PurePosixPath(entry.destination or entry.source)
    return "/".join(p for p in path.parts if p not in ("", "/", "..")) or "."


async def collect_artifacts(
    sandbox: Sandbox, artifacts: Sequence[Artifact], folder: str | os.PathLike[str], *, workdir: str
) -> list[ManifestEntry]:
    """Copy every entry out of the sandbox into `folder` (a relative source is relative to the
    workdir), drop what its `exclude` patterns match, and write the manifest."""
    root = Path(folder)
    await anyio.to_thread.run_sync(functools.partial(root.mkdir, parents=True, exist_ok=True))
    manifest = []
    for entry in _entries(artifacts):
        source = posixpath.normpath(posixpath.join(workdir, entry.source))
        place = _host_place(entry)
        target = root / place
        try:
            probe = await sandbox.exec(f"test -e {_quote(source)}", cwd="/")
            if probe.return_code != 0:
                manifest.append(ManifestEntry(source=entry.source, destination=place, status="missing"))
                continue
            await sandbox.download(source, target)
        except SandboxError as exc:
            status = f"failed: {str(exc)[:200]}"
            manifest.append(ManifestEntry(source=entry.source, destination=place, status=status))
            continue
        if entry.exclude:
            await anyio.to_thread.run_sync(_exclude, target, entry.exclude)
        manifest.append(ManifestEntry(source=entry.source, destination=place, status="ok"))
    (root / MANIFEST).write_bytes(msgspec.json.encode(manifest))
    return manifest


def _quote(path: str) -> str:
    return "'" + path.replace("'", "'\\''") + "'"


def _exclude(folder: Path, patterns: Sequence[str]) -> None:
    """Remove what tar's `--exclude` would have left out: a pattern matches a path below the
    folder, or any one name in it."""
    if not folder.is_dir():
        return
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        rel = path.relative_to(folder).as_posix()
        if any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(path.name, p) for p in patterns):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                path.unlink()


async def upload_artifacts(
    sandbox: Sandbox, artifacts: Sequence[Artifact], folder: str | os.PathLike[str], *, workdir: str
) -> None:
    """Put collected artifacts back at their source paths in another sandbox (a separate
    verifier), whatever their destination on the host."""
    root = Path(folder)
    copied = {
        e.source: e.status
        for e in msgspec.json.decode((root / MANIFEST).read_bytes(), type=list[ManifestEntry])
    }
    for entry in _entries(artifacts):
        if copied.get(entry.source) != "ok":
            continue
        local = root / _host_place(entry)
        if local.exists():
            await sandbox.upload(local, posixpath.normpath(posixpath.join(workdir, entry.source)))

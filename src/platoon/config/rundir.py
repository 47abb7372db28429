"""The run directory and the record written into it: the resolved config and ``lock.json``.

``<log_path or site runs>/<experiment_name>/<trial_name>/`` holds everything a run leaves. Its
``config.yaml`` reloads to the same config, and ``lock.json`` says what ran: platoon's version,
Python's, those of the libraries that shape results, and every option in force.

Neither holds a secret: keys, tokens and passwords written inline in a config, and passwords in
URLs, are replaced by ``<redacted>`` (see `platoon.config.redact`); a resumed run takes them
from the environment or the command line again. The directory is private to its owner (0700)
and its files 0600.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import msgspec

from .load import dumps_yaml, to_builtins
from .redact import redact
from .schema import Config
from .site import Site

__all__ = [
    "KEY_DEPENDENCIES",
    "make_private_dir",
    "open_private",
    "run_dir",
    "write_private",
    "write_run_files",
]

# Distributions whose versions change what a run does; absent ones are recorded as null.
KEY_DEPENDENCIES = (
    "msgspec",
    "anyio",
    "trio",
    "pyyaml",
    "httpx",
    "starlette",
    "hypercorn",
    "structlog",
    "tinker",
    "openreward",
    "mcp",
    "transformers",
    "tokenizers",
    "torch",
    "peft",
    "nats-py",
    "aiodocker",
)


def run_dir(config: Config, site: Site, *, purpose: str = "train", now: datetime | None = None) -> Path:
    """Where a run of ``config`` writes: ``<log_path or site.runs>/<experiment>/<trial>``.

    A config without ``stats.trial_name`` gets the UTC start time (``now``) as its trial name.
    The trial folder of a config that trains is its training run's: an eval, a rollout or an SFT
    run of it (``purpose``) writes beside it, in ``<trial>-eval``, ``<trial>-rollout`` or ``<trial>-sft``.
    """
    trial = config.stats.trial_name or (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    beside = config.stats.trial_name and config.train is not None and purpose in ("eval", "rollout", "sft")
    if beside and not trial.endswith(f"-{purpose}"):  # `guess-eval` is an eval's folder already
        trial = f"{trial}-{purpose}"
    return Path(config.log_path or site.runs) / config.stats.experiment_name / trial


def write_run_files(
    directory: str | os.PathLike[str], config: Config, extra: Mapping[str, Any] | None = None
) -> None:
    """Write ``config.yaml`` and ``lock.json`` into the run directory (created if missing).

    ``extra`` adds keys to ``lock.json`` (the command line, choices made at start such as the
    tool-call parser). Each file is replaced whole or not at all.
    """
    directory = make_private_dir(directory)
    header = (
        f"# The resolved config of this run (platoon {_version('platoon')}); defaults written out,\n"
        "# secrets <redacted> (give them again through the environment or the command line).\n"
    )
    write_private(directory / "config.yaml", (header + dumps_yaml(redact(to_builtins(config)))).encode())
    lock = {
        "platoon": _version("platoon"),
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "platform": platform.platform(),
        "packages": {name: _version(name) for name in KEY_DEPENDENCIES},
        "config": to_builtins(config),
        **(extra or {}),
    }
    lock = redact(lock)
    write_private(directory / "lock.json", msgspec.json.format(msgspec.json.encode(lock), indent=2) + b"\n")


def make_private_dir(directory: str | os.PathLike[str]) -> Path:
    """Create the run directory (and parents) if missing; it, and each parent made for it, is
    readable by its owner only, whatever the umask."""
    path = Path(directory)
    made = []
    folder = path
    while not folder.exists() and folder != folder.parent:
        made.append(folder)
        folder = folder.parent
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    for folder in made:
        folder.chmod(0o700)
    path.chmod(0o700)
    return path


def open_private(path: str | os.PathLike[str], mode: str = "a") -> Any:
    """Open a run file for appending (`a` or `ab`), created 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    return os.fdopen(fd, mode)


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def write_private(path: str | os.PathLike[str], content: bytes) -> None:
    """Replace `path` whole or not at all: written aside (0600), synced, renamed, the rename synced."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)

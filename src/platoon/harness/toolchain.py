"""A command-line agent's install, built once into a content-addressed folder of the site cache.

A spec's `[toolchain]` names pinned packages (`pip = ["mini-swe-agent==2.4.6"]`, `npm =
["@openai/codex@0.169.0"]`). The folder is `<cache>/toolchains/<digest>`, the digest covering the
packages and the interpreter the venv is made with, so a changed pin builds a new folder and an
unchanged one is never rebuilt. A sandbox mounts it read-only at `/opt/platoon/toolchain`; the
venv is made there by name (`--prefix` for npm) so its scripts' shebangs point where it is mounted.
Building happens in a temporary folder renamed into place at the end, under a file lock, so
concurrent episodes (or processes) build it once and never see half an install.

pip packages go into a venv made with `python` (default `/usr/bin/python3`): an interpreter the
sandbox has too, since under bwrap the sandbox's `/usr` is the host's. Node comes from the
sandbox's base in the same way; only the packages are in the toolchain.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import anyio
import anyio.to_thread
import msgspec

__all__ = ["MOUNT_POINT", "Toolchain", "ToolchainError", "build_toolchain", "toolchain_dir"]

MOUNT_POINT = "/opt/platoon/toolchain"
_MARKER = ".platoon-toolchain.json"


class ToolchainError(RuntimeError):
    """A toolchain that could not be built; the message carries the installer's error."""


class Toolchain(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A spec's `[toolchain]` table: pinned packages to install."""

    pip: list[str] = []
    npm: list[str] = []
    python: str = "/usr/bin/python3"

    def __bool__(self) -> bool:
        return bool(self.pip or self.npm)

    def digest(self) -> str:
        text = json.dumps({"pip": self.pip, "npm": self.npm, "python": self.python, "v": 1}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:20]


def toolchain_dir(toolchain: Toolchain, cache: str | os.PathLike[str]) -> Path:
    """Where `toolchain` is (or will be) built in the cache."""
    return Path(cache) / "toolchains" / toolchain.digest()


async def build_toolchain(toolchain: Toolchain, cache: str | os.PathLike[str]) -> Path:
    """The toolchain's folder, built now unless it already is (once, across processes)."""
    return await anyio.to_thread.run_sync(_build, toolchain, Path(cache), abandon_on_cancel=False)


def _build(toolchain: Toolchain, cache: Path) -> Path:
    target = toolchain_dir(toolchain, cache)
    if (target / _MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / _MARKER).exists():
            return target
        # The venv must be made at the path it is used at (its scripts' shebangs name it), which
        # is the mount point inside a sandbox: build it in place there under bwrap, or directly at
        # the target path when the mount point is the target (tests, host runs) — see `_install`.
        work = target.parent / f"{target.name}.building-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        started = time.monotonic()
        try:
            _install(toolchain, work)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        info = {
            "pip": toolchain.pip,
            "npm": toolchain.npm,
            "python": toolchain.python,
            "build_s": round(time.monotonic() - started, 1),
        }
        (work / _MARKER).write_text(json.dumps(info) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.rename(work, target)
    return target


def _install(toolchain: Toolchain, work: Path) -> None:
    """Install into `work`, running the installers in a bwrap that shows `work` at the mount point."""
    steps: list[list[str]] = []
    if toolchain.pip:
        steps.append([toolchain.python, "-m", "venv", "--without-pip", MOUNT_POINT])
        # The host's pip installs into the venv (`--python`), so the venv needs no pip of its own.
        steps.append(
            [
                toolchain.python,
                "-m",
                "pip",
                "--python",
                f"{MOUNT_POINT}/bin/python",
                "install",
                "--no-input",
                "--disable-pip-version-check",
                "--no-warn-script-location",
                *toolchain.pip,
            ]
        )
    if toolchain.npm:
        steps.append(
            [
                "npm",
                "install",
                "--prefix",
                MOUNT_POINT,
                "--no-audit",
                "--no-fund",
                "--omit=dev",
                *toolchain.npm,
            ]
        )
        # npm puts bins under node_modules/.bin; give them the venv's bin/ too.
        link = f"mkdir -p {MOUNT_POINT}/bin && cd {MOUNT_POINT}/bin && ln -sf ../node_modules/.bin/* ."
        steps.append(["bash", "-c", link])
    bwrap = shutil.which("bwrap")
    for step in steps:
        if bwrap is not None:
            # The installers run with the host's network (registries) but see the toolchain at
            # the path the sandboxes will: the rest of the file system is the host's.
            argv = [bwrap, "--dev-bind", "/", "/", "--bind", str(work), MOUNT_POINT, *step]
        else:
            argv = step
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-2000:]
            raise ToolchainError(f"{' '.join(step[:4])} ... exited with code {done.returncode}: {tail}")

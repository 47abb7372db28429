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

`python` may instead name a version (`"3.12"`) for agents that need a newer Python than the
sandbox's: the venv is made with the first interpreter of that version among those the site
profile names (`pythons:`), then on PATH, under /usr and /usr/local, and in pyenv's and uv's
folders; none is one clear error. Such an interpreter lives outside the sandbox's base, so its
installation folder (`sys.base_prefix`, recorded in the toolchain's marker) is mounted read-only
at its own path beside the toolchain.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.to_thread
import msgspec

__all__ = [
    "MOUNT_POINT",
    "Toolchain",
    "ToolchainError",
    "build_toolchain",
    "find_python",
    "pip_conclusion",
    "toolchain_dir",
    "toolchain_interpreter",
]

MOUNT_POINT = "/opt/platoon/toolchain"
_MARKER = ".platoon-toolchain.json"
_VERSION = re.compile(r"3\.\d+")
_PROBE = "import json, sys; print(json.dumps([list(sys.version_info[:2]), sys.base_prefix]))"


class ToolchainError(RuntimeError):
    """A toolchain that could not be built; the message carries the installer's error."""


class Toolchain(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A spec's `[toolchain]` table: pinned packages to install."""

    pip: list[str] = []
    npm: list[str] = []
    python: str = "/usr/bin/python3"

    def __bool__(self) -> bool:
        return bool(self.pip or self.npm)

    @property
    def version(self) -> str | None:
        """The Python version `python` names (`"3.12"`), or None when it names an interpreter."""
        return self.python if _VERSION.fullmatch(self.python) else None

    def digest(self) -> str:
        text = json.dumps({"pip": self.pip, "npm": self.npm, "python": self.python, "v": 1}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:20]


def toolchain_dir(toolchain: Toolchain, cache: str | os.PathLike[str]) -> Path:
    """Where `toolchain` is (or will be) built in the cache."""
    return Path(cache) / "toolchains" / toolchain.digest()


async def build_toolchain(
    toolchain: Toolchain, cache: str | os.PathLike[str], pythons: Sequence[str] = ()
) -> Path:
    """The toolchain's folder, built now unless it already is (once, across processes);
    `pythons` are the site's interpreters, tried first when the toolchain names a version."""
    return await anyio.to_thread.run_sync(_build, toolchain, Path(cache), pythons, abandon_on_cancel=False)


def toolchain_interpreter(folder: str | os.PathLike[str]) -> str | None:
    """The installation folder of the interpreter a built toolchain's venv runs on, when a sandbox
    must be shown it (it lives outside the sandbox's base); None otherwise."""
    try:
        info = json.loads((Path(folder) / _MARKER).read_text())
    except (OSError, ValueError):
        return None
    prefix = info.get("mount")
    return prefix if isinstance(prefix, str) else None


def find_python(version: str, named: Sequence[str] = ()) -> tuple[str, str] | None:
    """(interpreter, its sys.base_prefix) of the first Python `version` (`"3.12"`) among `named`, on
    PATH, under /usr and /usr/local, and in pyenv's and uv's folders; None when there is none."""
    home = os.path.expanduser("~")
    pyenv = os.environ.get("PYENV_ROOT") or os.path.join(home, ".pyenv")
    candidates = [
        *named,
        shutil.which(f"python{version}") or "",
        f"/usr/bin/python{version}",
        f"/usr/local/bin/python{version}",
        *sorted(
            glob.glob(os.path.join(pyenv, "versions", f"{version}.*", "bin", f"python{version}")),
            reverse=True,
        ),
        *sorted(
            glob.glob(
                os.path.join(
                    home, ".local", "share", "uv", "python", f"cpython-{version}.*", "bin", f"python{version}"
                )
            ),
            reverse=True,
        ),
    ]
    wanted = [int(part) for part in version.split(".")]
    for candidate in dict.fromkeys(c for c in candidates if c):
        if not os.access(candidate, os.X_OK):
            continue
        try:
            done = subprocess.run([candidate, "-c", _PROBE], capture_output=True, text=True, timeout=30)
            found, prefix = json.loads(done.stdout)
        except (OSError, ValueError, subprocess.SubprocessError):
            continue
        if found == wanted:
            return candidate, prefix
    return None


def _interpreter(toolchain: Toolchain, pythons: Sequence[str]) -> tuple[str, str | None]:
    """The interpreter to make the venv with, and the folder to mount for it (None: none needed)."""
    if toolchain.version is None:
        return toolchain.python, None
    found = find_python(toolchain.version, pythons)
    if found is None:
        raise ToolchainError(
            f"it needs Python {toolchain.version} and there is none: name one in the site profile "
            f"(pythons: [/path/to/python{toolchain.version}]) or install one (pyenv, uv, apt)"
        )
    interpreter, prefix = found
    visible = prefix == "/usr" or prefix.startswith("/usr/")  # under bwrap the sandbox's /usr is the host's
    return interpreter, None if visible else prefix


def _build(toolchain: Toolchain, cache: Path, pythons: Sequence[str] = ()) -> Path:
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
        interpreter, mount = _interpreter(toolchain, pythons) if toolchain.pip else (toolchain.python, None)
        work = target.parent / f"{target.name}.building-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        started = time.monotonic()
        log = target.parent / f"{target.name}.log"  # the last build's whole output, kept
        log.unlink(missing_ok=True)
        try:
            _install(toolchain, work, interpreter, log)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
        info = {
            "pip": toolchain.pip,
            "npm": toolchain.npm,
            "python": toolchain.python,
            "interpreter": interpreter,
            "mount": mount,
            "build_s": round(time.monotonic() - started, 1),
        }
        (work / _MARKER).write_text(json.dumps(info) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        os.rename(work, target)
    return target


def _install(
    toolchain: Toolchain, work: Path, interpreter: str | None = None, log: Path | None = None
) -> None:
    """Install into `work`, running the installers in a bwrap that shows `work` at the mount point;
    their whole output goes to `log`, and a failure's reason is their conclusion."""
    python = interpreter or toolchain.python
    steps: list[list[str]] = []
    if toolchain.pip:
        steps.append([python, "-m", "venv", "--without-pip", MOUNT_POINT])
        # The host's pip installs into the venv (`--python`), so the venv needs no pip of its own.
        steps.append(
            [
                python,
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
    if bwrap is None:
        # Without it the installers would write into the host's own MOUNT_POINT, shared by
        # every toolchain, and the sandboxes that run the agents need it anyway.
        raise ToolchainError(
            f"building it needs bubblewrap, which shows the toolchain at {MOUNT_POINT} while it is "
            "installed: install it (apt-get install bubblewrap)"
        )
    for step in steps:
        # The installers run with the host's network (registries) but see the toolchain at the
        # path the sandboxes will: the rest of the file system is the host's.
        argv = [bwrap, "--dev-bind", "/", "/", "--bind", str(work), MOUNT_POINT, *step]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if log is not None:
            with log.open("a", encoding="utf-8") as file:
                file.write(f"$ {' '.join(step)}\n{done.stdout}{done.stderr}\n")
        if done.returncode != 0:
            output = f"{done.stdout}\n{done.stderr}"
            why = pip_conclusion(output) if step[1:3] == ["-m", "pip"] else None
            if why is None:
                tail = (done.stderr or done.stdout).strip()[-2000:]
                why = f"{' '.join(step[:4])} ... exited with code {done.returncode}: {tail}"
            raise ToolchainError(why + (f"; the full log: {log}" if log is not None else ""))


def pip_conclusion(output: str) -> str | None:
    """pip's conclusion in one line (the resolver's verdict, or the package it could not find or
    build), not its log; None when its output has none of them."""
    lines = [line.strip() for line in output.splitlines()]
    errors = [line.removeprefix("ERROR: ") for line in lines if line.startswith("ERROR: ")]
    cannot = next((e for e in errors if e.startswith("Cannot install ")), None)
    if cannot is not None:
        what = cannot.split(" because ")[0]
        start = (
            lines.index("The conflict is caused by:") + 1 if "The conflict is caused by:" in lines else None
        )
        causes = []
        for line in lines[start:] if start is not None else []:
            if not line:
                break
            causes.append(line)
        return f"pip: {what}: conflicting dependencies" + (f" ({'; '.join(causes)})" if causes else "")
    missing = next((e for e in errors if e.startswith("Could not find a version that satisfies")), None)
    if missing is not None:
        return f"pip: {missing[0].lower()}{missing[1:]}"
    failed = next((e for e in errors if e.startswith(("Failed building wheel for", "Failed to build"))), None)
    if failed is not None:
        return f"pip: {failed[0].lower()}{failed[1:]}"
    return f"pip: {errors[-1]}" if errors else None

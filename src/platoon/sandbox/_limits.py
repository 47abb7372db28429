"""Process-count and memory caps for command-line sandboxes, through cgroups where we may write them.

bubblewrap has no resource limits of its own. A sandbox gets a cgroup of its own (cgroup v2 under
the cgroup platoon runs in, or the v1 `pids` and `memory` hierarchies) and every process it starts
joins it before `bwrap` runs, so the caps cover everything the task forks. Where no cgroup can be
made (no permission, no controller), `prlimit` gives what rlimits can: RLIMIT_NPROC (which does not
bind root) and RLIMIT_DATA.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
import uuid
from pathlib import Path

__all__ = ["SandboxCgroup", "make_cgroup", "rlimit_prefix"]

_ROOT = Path("/sys/fs/cgroup")
# The wrapper that joins the cgroups, then becomes the runtime; the list travels in the environment.
_JOIN = 'for d in $PLATOON_CGROUPS; do echo $$ > "$d/cgroup.procs" || exit 125; done; unset PLATOON_CGROUPS; exec "$@"'


class SandboxCgroup:
    """The cgroup directories of one sandbox; `wrap` makes a command join them first."""

    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = dirs

    def wrap(self, argv: list[str]) -> tuple[list[str], dict[str, str]]:
        """The argv that joins the cgroups then runs `argv`, and the variables it needs."""
        return ["sh", "-c", _JOIN, "sh", *argv], {"PLATOON_CGROUPS": " ".join(map(str, self.dirs))}

    def remove(self) -> None:
        """Kill what the sandbox left running, then delete the cgroups (blocking, briefly)."""
        for path in self.dirs:
            for _ in range(200):
                try:
                    pids = (path / "cgroup.procs").read_text().split()
                except OSError:
                    break
                for pid in pids:
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)
                try:
                    path.rmdir()
                    break
                except OSError:
                    time.sleep(0.01)  # killed processes leave the group as the kernel reaps them


def make_cgroup(pids: int | None, memory_mb: int | None, *, root: Path = _ROOT) -> SandboxCgroup | None:
    """A fresh cgroup with `pids.max` and a memory cap, or None where this process may not make one."""
    if pids is None and memory_mb is None:
        return None
    name = f"platoon-{uuid.uuid4().hex[:12]}"
    memory = None if memory_mb is None else memory_mb * 2**20
    try:
        unified = _v2_parent(root)
        if unified is not None:
            return _make_v2(unified / name, pids, memory)
        return _make_v1(root, name, pids, memory)
    except OSError:
        return None


def _v2_parent(root: Path) -> Path | None:
    if not (root / "cgroup.controllers").exists():
        return None
    own = ""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            own = line[3:].lstrip("/")
    return root / own if own else root


def _make_v2(path: Path, pids: int | None, memory: int | None) -> SandboxCgroup | None:
    controllers = (path.parent / "cgroup.subtree_control").read_text().split()
    if (pids is not None and "pids" not in controllers) or (
        memory is not None and "memory" not in controllers
    ):
        return None
    path.mkdir()
    group = SandboxCgroup([path])
    try:
        if pids is not None:
            (path / "pids.max").write_text(str(pids))
        if memory is not None:
            (path / "memory.max").write_text(str(memory))
    except OSError:
        group.remove()
        raise
    return group


def _make_v1(root: Path, name: str, pids: int | None, memory: int | None) -> SandboxCgroup | None:
    wanted = [("pids", "pids.max", pids), ("memory", "memory.limit_in_bytes", memory)]
    wanted = [w for w in wanted if w[2] is not None]
    if not all((root / controller / "cgroup.procs").exists() for controller, _, _ in wanted):
        return None
    group = SandboxCgroup([])
    try:
        for controller, knob, value in wanted:
            path = root / controller / name
            path.mkdir()
            group.dirs.append(path)
            (path / knob).write_text(str(value))
    except OSError:
        group.remove()
        raise
    return group


def rlimit_prefix(pids: int | None, memory_mb: int | None) -> list[str]:
    """`prlimit` arguments for the caps rlimits can give, when no cgroup could be made."""
    if shutil.which("prlimit") is None:
        return []
    limits = []
    if pids is not None and os.geteuid() != 0:  # RLIMIT_NPROC never binds root
        limits.append(f"--nproc={pids}")
    if memory_mb is not None:
        limits.append(f"--data={memory_mb * 2**20}")
    return ["prlimit", *limits, "--"] if limits else []

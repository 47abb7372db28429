"""bubblewrap provider: daemonless, rootless, one `bwrap` process per command.

The root is either a per-sandbox copy of `spec.rootfs`, or a read-only base (the rootfs,
or the host's system directories when no rootfs is given) with per-sandbox writable
directories bound over it. Files persist between commands; background processes do not.
Limits: `memory_mb` becomes RLIMIT_DATA (prlimit), `cpus` a CPU affinity of ceil(cpus)
cores (taskset); a CPU *share* and a hard memory cap need cgroups, which bwrap lacks.
"""

from __future__ import annotations

import itertools
import math
import os
import posixpath
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import anyio
import anyio.to_thread

from ._process import OUTPUT_LIMIT, run_process
from .base import CommandSandbox, remove_tree
from .errors import SandboxError
from .spec import SandboxSpec

__all__ = ["BwrapSandbox"]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What of the host is shown when it serves as the image: system files only, never homes.
HOST_BASE = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "var")
# Per-sandbox writable places in read-only-base mode (the workdir is added).
WRITABLE = ("/tmp", "/var/tmp", "/root", "/logs", "/tests", "/solution")
_SKIP = {"proc", "dev", "sys", "tmp", "run"}

_cpu_cursor = itertools.count()


class BwrapSandbox(CommandSandbox):
    """Run commands under bubblewrap with no network unless `spec.network`.

    `copy_rootfs` copies `spec.rootfs` per sandbox (fully writable, like a container);
    without it the rootfs is shared read-only and only WRITABLE paths and the workdir
    take writes. `spec.image` is not used: bwrap cannot unpack images.
    """

    def __init__(
        self,
        spec: SandboxSpec,
        *,
        copy_rootfs: bool = True,
        state_dir: str | os.PathLike[str] | None = None,
        bwrap: str = "bwrap",
        output_limit: int = OUTPUT_LIMIT,
    ) -> None:
        super().__init__(spec, output_limit=output_limit)
        self.copy_rootfs = copy_rootfs
        self.state_dir = state_dir
        self.bwrap = bwrap
        self._state: Path | None = None
        self._root_args: list[str] = []
        self._prefix: list[str] = []

    async def start(self) -> None:
        if self._started:
            return
        bwrap = shutil.which(self.bwrap)
        if bwrap is None:
            raise SandboxError(f"bubblewrap ({self.bwrap}) is not installed")
        rootfs = Path(self.spec.rootfs) if self.spec.rootfs else None
        self._state = await anyio.to_thread.run_sync(self._make_state, rootfs)
        if rootfs is not None and self.copy_rootfs:
            await self._copy_root(rootfs)
        else:
            await anyio.to_thread.run_sync(self._layer_root, rootfs)
        self._prefix = [*self._limits(), bwrap]
        self._started = True

    def _make_state(self, rootfs: Path | None) -> Path:
        if rootfs is not None and not (rootfs / "usr").is_dir() and not (rootfs / "bin").exists():
            raise SandboxError(f"rootfs {str(rootfs)!r} does not look like a root filesystem")
        for mount in self.spec.mounts:
            if not os.path.exists(mount.source):
                raise SandboxError(f"mount source {mount.source!r} does not exist")
        if self.state_dir is not None:
            os.makedirs(self.state_dir, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="platoon-bwrap-", dir=self.state_dir))

    async def _copy_root(self, rootfs: Path) -> None:
        assert self._state is not None
        root = self._state / "root"
        result = await run_process(["cp", "-a", "--reflink=auto", "--", str(rootfs), str(root)])
        if result.return_code != 0:
            raise SandboxError(f"copying rootfs failed: {result.stderr.decode(errors='replace').strip()}")
        self._root_args = ["--bind", str(root), "/", "--dir", self.spec.workdir]

    def _layer_root(self, rootfs: Path | None) -> None:
        assert self._state is not None
        base = rootfs or Path("/")
        names = HOST_BASE if rootfs is None else sorted(os.listdir(base))
        readonly: set[str] = set()
        args: list[str] = []
        for name in names:
            entry = base / name
            if name in _SKIP or not os.path.lexists(entry):
                continue
            if entry.is_symlink():
                args += ["--symlink", os.readlink(entry), f"/{name}"]
            elif entry.is_dir():
                args += ["--ro-bind", str(entry), f"/{name}"]
                readonly.add(name)
        args += ["--tmpfs", "/run"]
        writable = sorted({*WRITABLE, posixpath.normpath(self.spec.workdir)}, key=lambda p: p.count("/"))
        for index, target in enumerate(writable):
            top = target.strip("/").split("/")[0]
            if top in readonly and not (base / target.lstrip("/")).is_dir():
                if target == posixpath.normpath(self.spec.workdir):
                    raise SandboxError(f"workdir {target} does not exist in the read-only base {base}")
                continue
            host = self._state / "rw" / str(index)
            seed = base / target.lstrip("/")
            if rootfs is not None and seed.is_dir() and not seed.is_symlink():
                shutil.copytree(seed, host, symlinks=True)  # keep what the image put there
            else:
                host.mkdir(parents=True)
            if target in ("/tmp", "/var/tmp"):
                host.chmod(0o1777)
            args += ["--bind", str(host), target]
        self._root_args = args

    def _limits(self) -> list[str]:
        prefix: list[str] = []
        if self.spec.memory_mb is not None and shutil.which("prlimit"):
            prefix += ["prlimit", f"--data={self.spec.memory_mb * 2**20}", "--"]
        if self.spec.cpus is not None and shutil.which("taskset"):
            available = sorted(os.sched_getaffinity(0))
            count = min(math.ceil(self.spec.cpus), len(available))
            # Successive sandboxes get successive windows so they do not pile onto one core.
            start = next(_cpu_cursor) * count
            chosen = [available[(start + i) % len(available)] for i in range(count)]
            prefix += ["taskset", "-c", ",".join(map(str, sorted(chosen)))]
        return prefix

    def _exec_argv(self, command: str, *, cwd: str, env: Mapping[str, str], user: str | None) -> list[str]:
        args = [*self._prefix, *self._root_args, "--dev", "/dev", "--proc", "/proc"]
        for mount in self.spec.mounts:
            args += ["--ro-bind" if mount.read_only else "--bind", mount.source, mount.target]
        args += ["--unshare-all", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
        if self.spec.network:
            args.append("--share-net")
        home = "/root"
        if user is not None:
            uid, gid, home = self._lookup_user(user)
            args += ["--unshare-user", "--uid", str(uid), "--gid", str(gid)]
        elif os.geteuid() != 0:
            args += ["--unshare-user", "--uid", "0", "--gid", "0"]
        merged = {"PATH": DEFAULT_PATH, "HOME": home, **self.spec.env, **env}
        args.append("--clearenv")
        for key, value in merged.items():
            args += ["--setenv", key, value]
        return [*args, "--chdir", cwd, "bash", "-c", command]

    def _lookup_user(self, user: str) -> tuple[int, int, str]:
        """Map a user name or `uid[:gid]` to ids via the sandbox's /etc/passwd.

        The ids are an identity inside a user namespace, not a permission boundary.
        """
        uid_text, _, gid_text = user.partition(":")
        if uid_text.isdigit():
            return int(uid_text), int(gid_text or uid_text), "/root" if uid_text == "0" else "/tmp"
        root = Path(self.spec.rootfs) if self.spec.rootfs else Path("/")
        try:
            lines = (root / "etc/passwd").read_text().splitlines()
        except OSError:
            lines = []
        for line in lines:
            fields = line.split(":")
            if len(fields) >= 6 and fields[0] == user:
                return int(fields[2]), int(fields[3]), fields[5] or "/"
        raise SandboxError(f"user {user!r} is not in the sandbox's /etc/passwd")

    async def stop(self) -> None:
        self._started = False
        if self._state is not None:
            state, self._state = self._state, None
            await anyio.to_thread.run_sync(remove_tree, state)

"""bubblewrap provider: daemonless, rootless, one `bwrap` process per command.

The root is either a per-sandbox copy of `spec.rootfs`, or a read-only base (the rootfs,
or the host's system directories when no rootfs is given) with per-sandbox writable
directories bound over it. Files persist between commands; background processes do not.

What a sandbox can see of the host is an explicit list: the system directories (`/usr` and the
library and binary directories), the files of `/etc` that programs need (never `shadow`, `sudoers`,
ssh keys or package-manager credentials) and nothing of `/opt`, `/var` or the homes. `bwrap` runs
with an empty environment, in new user, pid, ipc, uts and cgroup namespaces (root inside has no
power over the host), and the sandbox's `/proc` shows only its own processes. With network on, the
sandbox gets its own network namespace behind slirp4netns (`._netns`): it reaches the outside but
not the host's loopback services. Limits: `pids` and `memory_mb` through a cgroup of the sandbox's
own where one can be made (else rlimits, see `._limits`), `cpus` a CPU affinity of ceil(cpus) cores
(taskset); a CPU *share* needs a cgroup cpu controller, which is not used.
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

from ._limits import SandboxCgroup, make_cgroup, rlimit_prefix
from ._netns import RESOLV_CONF, SandboxNetwork
from ._process import OUTPUT_LIMIT, run_process
from .base import CommandSandbox, remove_tree
from .errors import SandboxError
from .spec import Mount, SandboxSpec

__all__ = ["BwrapSandbox"]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What of the host is shown when it serves as the image: system files only, never homes.
HOST_BASE = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
# The host's /etc, entry by entry: what programs need to run, none of its secrets.
HOST_ETC = (
    "alternatives", "bash.bashrc", "ca-certificates", "ca-certificates.conf", "debian_version",
    "environment", "gai.conf", "group", "host.conf", "hostname", "hosts", "inputrc", "issue",
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "locale.alias", "locale.gen", "localtime",
    "magic", "magic.mime", "mime.types", "nsswitch.conf", "os-release", "passwd", "profile",
    "profile.d", "protocols", "python3", "python3.11", "python3.12", "python3.13", "resolv.conf",
    "rpc", "services", "shells", "skel", "ssl", "terminfo", "timezone", "xattr.conf",
)  # fmt: skip
# Per-sandbox writable places in read-only-base mode (the workdir is added).
WRITABLE = ("/tmp", "/var/tmp", "/root", "/logs", "/tests", "/solution")  # nosec B108 # a path inside the sandbox, not the host's /tmp
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
        self._cgroup: SandboxCgroup | None = None
        self._network: SandboxNetwork | None = None
        self.process_env = {"PATH": DEFAULT_PATH}

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
        if self.spec.network:
            self._network = SandboxNetwork()
            await self._network.start()
            resolv = self._state / "resolv.conf"
            resolv.write_text(RESOLV_CONF)
            self._root_args += ["--ro-bind", str(resolv), "/etc/resolv.conf"]
        self._prefix = [*self._limits(), bwrap]
        if self._network is not None:
            self._prefix = self._network.enter(self._prefix)
        if self._cgroup is not None:
            self._prefix, joins = self._cgroup.wrap(self._prefix)
            self.process_env = {**(self.process_env or {}), **joins}
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
        if rootfs is None:
            args += ["--dir", "/etc"]
            for name in HOST_ETC:
                args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
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
            if target in ("/tmp", "/var/tmp"):  # nosec B108 # a path inside the sandbox, not the host's /tmp
                host.chmod(0o1777)
            args += ["--bind", str(host), target]
        self._root_args = args

    def _limits(self) -> list[str]:
        self._cgroup = make_cgroup(self.spec.pids, self.spec.memory_mb)
        prefix = [] if self._cgroup is not None else rlimit_prefix(self.spec.pids, self.spec.memory_mb)
        if self.spec.cpus is not None and shutil.which("taskset"):
            available = sorted(os.sched_getaffinity(0))
            count = min(math.ceil(self.spec.cpus), len(available))
            # Successive sandboxes get successive windows so they do not pile onto one core.
            start = next(_cpu_cursor) * count
            chosen = [available[(start + i) % len(available)] for i in range(count)]
            prefix += ["taskset", "-c", ",".join(map(str, sorted(chosen)))]
        return prefix

    # A process per command, so each command may get mounts of its own (`exec(mounts=...)`), and
    # may be left out of the sandbox's network (`exec(offline=True)`: a namespace of its own).
    exec_mounts = True
    exec_offline = True

    def _exec_argv(
        self,
        command: str,
        *,
        cwd: str,
        env: Mapping[str, str],
        user: str | None,
        mounts: tuple[Mount, ...] = (),
        offline: bool = False,
    ) -> list[str]:
        args = [*self._prefix, *self._root_args, "--dev", "/dev", "--proc", "/proc"]
        # Root inside maps to the host's uid 0, so host-wide kernel knobs must not be writable.
        args += ["--ro-bind", "/proc/sys", "/proc/sys"]
        if os.path.exists("/proc/sysrq-trigger"):
            args += ["--ro-bind", "/proc/sysrq-trigger", "/proc/sysrq-trigger"]
        for mount in (*self.spec.mounts, *mounts):
            args += ["--ro-bind" if mount.read_only else "--bind", mount.source, mount.target]
        args += ["--unshare-all", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
        if self._network is not None and not offline:
            args.append("--share-net")  # the sandbox's own namespace, entered by nsenter
        # Always a user namespace: root inside holds its capabilities there, not over the host.
        uid, gid, home = self._lookup_user(user) if user is not None else (0, 0, "/root")
        args += ["--unshare-user", "--uid", str(uid), "--gid", str(gid)]
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
            return int(uid_text), int(gid_text or uid_text), "/root" if uid_text == "0" else "/tmp"  # nosec B108 # a path inside the sandbox, not the host's /tmp
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
        if self._network is not None:
            network, self._network = self._network, None
            await network.stop()
        if self._cgroup is not None:
            cgroup, self._cgroup = self._cgroup, None
            await anyio.to_thread.run_sync(cgroup.remove)
        if self._state is not None:
            state, self._state = self._state, None
            await anyio.to_thread.run_sync(remove_tree, state)

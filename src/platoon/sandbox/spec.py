"""What a sandbox should look like, independent of the provider that builds it."""

from __future__ import annotations

import math
import posixpath

import msgspec

from .errors import SandboxError

__all__ = ["ExecResult", "Mount", "SandboxSpec"]


class Mount(msgspec.Struct, frozen=True, kw_only=True):
    """A host directory or file made visible inside the sandbox (task dirs, caches)."""

    source: str
    target: str
    read_only: bool = True


class SandboxSpec(msgspec.Struct, frozen=True, kw_only=True):
    """The sandbox a task asks for.

    `image` names a container image (docker, apptainer, enroot); `rootfs` a directory
    holding a root filesystem (bwrap, apptainer). bwrap uses the host's system
    directories, read-only, when no rootfs is given. Network is off unless asked for.
    """

    image: str | None = None
    rootfs: str | None = None
    workdir: str = "/app"
    network: bool = False
    cpus: float | None = None
    memory_mb: int | None = None
    pids: int | None = 4096  # processes and threads at once; None: no cap
    env: dict[str, str] = {}
    mounts: tuple[Mount, ...] = ()

    def __post_init__(self) -> None:
        if not posixpath.isabs(self.workdir):
            raise SandboxError(f"workdir must be an absolute path, got {self.workdir!r}")
        if self.cpus is not None and not (math.isfinite(self.cpus) and self.cpus > 0):
            raise SandboxError(f"cpus must be a positive number, got {self.cpus!r}")
        if self.pids is not None and self.pids <= 0:
            raise SandboxError(f"pids must be positive, got {self.pids!r}")
        if self.memory_mb is not None and self.memory_mb <= 0:
            raise SandboxError(f"memory_mb must be positive, got {self.memory_mb!r}")
        for mount in self.mounts:
            if not posixpath.isabs(mount.target) or ".." in mount.target.split("/"):
                raise SandboxError(
                    f"mount target must be an absolute path without '..', got {mount.target!r}"
                )
        for key in self.env:
            if not key or "=" in key or "\0" in key:
                raise SandboxError(f"invalid environment variable name {key!r}")


class ExecResult(msgspec.Struct, frozen=True):
    """What one command run inside a sandbox printed and how it ended."""

    stdout: str
    stderr: str
    return_code: int
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.return_code == 0 and not self.timed_out

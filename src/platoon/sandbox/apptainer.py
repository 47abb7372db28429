"""Apptainer / Singularity provider: one persistent instance per sandbox.

start: `apptainer instance start --containall --writable-tmpfs [--fakeroot]
[--net --network none] [--cpus N] [--memory NM] [-B src:dst[:ro]] IMAGE NAME`;
exec: `apptainer exec --cleanenv --pwd CWD [--env K=V] instance://NAME bash -c CMD`;
stop: `apptainer instance stop NAME`. Writes land in the instance's tmpfs and last
until stop. --cpus/--memory need cgroups v2 (and systemd for unprivileged users).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping

from ._process import OUTPUT_LIMIT, run_process
from .base import CommandSandbox
from .errors import SandboxError
from .spec import SandboxSpec

__all__ = ["ApptainerSandbox", "SingularitySandbox"]


class ApptainerSandbox(CommandSandbox):
    """Run commands in an Apptainer instance of `spec.image` (docker://, .sif, or a
    sandbox directory given as `spec.rootfs`).

    `fakeroot` (default: when not root) makes the caller root inside. Apptainer cannot
    switch to another user, so `user` may only be None or "root".
    """

    binary = "apptainer"

    def __init__(
        self,
        spec: SandboxSpec,
        *,
        binary: str | None = None,
        fakeroot: bool | None = None,
        output_limit: int = OUTPUT_LIMIT,
    ) -> None:
        super().__init__(spec, output_limit=output_limit)
        self.binary = binary or self.binary
        self.fakeroot = os.geteuid() != 0 if fakeroot is None else fakeroot
        self.name = f"platoon-{uuid.uuid4().hex[:12]}"
        self._instance = False

    def image(self) -> str:
        """The image argument: rootfs dir, .sif or other path, URI, else docker://IMAGE."""
        if self.spec.rootfs:
            return self.spec.rootfs
        image = self.spec.image
        if not image:
            raise SandboxError(f"{self.binary} needs spec.image or spec.rootfs")
        if "://" in image or image.endswith(".sif") or os.path.exists(image):
            return image
        return f"docker://{image}"

    def start_argv(self) -> list[str]:
        argv = [self.binary, "instance", "start", "--containall", "--writable-tmpfs"]
        if self.fakeroot:
            argv.append("--fakeroot")
        if not self.spec.network:
            argv += ["--net", "--network", "none"]
        if self.spec.cpus is not None:
            argv += ["--cpus", f"{self.spec.cpus:g}"]
        if self.spec.memory_mb is not None:
            argv += ["--memory", f"{self.spec.memory_mb}M"]
        for mount in self.spec.mounts:
            argv += ["-B", f"{mount.source}:{mount.target}" + (":ro" if mount.read_only else "")]
        return [*argv, self.image(), self.name]

    async def start(self) -> None:
        if self._started:
            return
        if shutil.which(self.binary) is None:
            raise SandboxError(f"{self.binary} is not installed")
        result = await run_process(self.start_argv())
        if result.return_code != 0:
            raise SandboxError(
                f"{self.binary} instance start failed: {result.stderr.decode(errors='replace')}"
            )
        self._instance = True
        self._started = True
        await self._make_workdir()

    def _exec_argv(self, command: str, *, cwd: str, env: Mapping[str, str], user: str | None) -> list[str]:
        if user not in (None, "root", "0"):
            raise SandboxError(f"{self.binary} cannot run commands as user {user!r}")
        argv = [self.binary, "exec", "--cleanenv", "--pwd", cwd]
        for key, value in {**self.spec.env, **env}.items():
            argv += ["--env", f"{key}={value}"]
        return [*argv, f"instance://{self.name}", "bash", "-c", command]

    async def stop(self) -> None:
        self._started = False
        if self._instance:
            self._instance = False
            result = await run_process([self.binary, "instance", "stop", self.name])
            if result.return_code != 0:
                raise SandboxError(
                    f"{self.binary} instance stop {self.name} failed: {result.stderr.decode(errors='replace')}"
                )


class SingularitySandbox(ApptainerSandbox):
    """The same provider for hosts that ship SingularityCE's `singularity` command."""

    binary = "singularity"

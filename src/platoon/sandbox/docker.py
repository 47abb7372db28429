"""Docker provider: one long-lived container per sandbox, driven through the Docker
Engine API with aiodocker (so also podman's API service). asyncio only, as aiodocker is.

`cpus`, `memory_mb` and `pids` become NanoCpus, Memory and PidsLimit; no network means NetworkMode none.
A command with a timeout runs under coreutils' `timeout` inside the container, which
ends its whole process group; in an image without it the host stops waiting 10 s later
but cannot end the command.
"""

from __future__ import annotations

import asyncio
import io
import os
import posixpath
import shlex
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread

from . import _archive
from ._process import OUTPUT_LIMIT
from .base import BaseSandbox, remote_path
from .errors import SandboxError
from .spec import ExecResult, SandboxSpec

__all__ = ["DockerSandbox"]

# Grace after the in-container `timeout` should have fired before the host gives up.
_BACKSTOP = 10.0


class DockerSandbox(BaseSandbox):
    """A container kept alive with `sleep infinity`; each `exec` is a Docker exec.

    `url` is the engine (default: DOCKER_HOST or the usual socket); `ulimits` maps a
    name to a limit or (soft, hard) for hosts whose hard limits the runtime must respect;
    `pull` fetches a missing image.
    """

    def __init__(
        self,
        spec: SandboxSpec,
        *,
        url: str | None = None,
        ulimits: Mapping[str, int | tuple[int, int]] | None = None,
        pull: bool = True,
        output_limit: int = OUTPUT_LIMIT,
    ) -> None:
        if spec.image is None:
            raise SandboxError("the docker provider needs spec.image (a rootfs directory cannot be run)")
        self.spec = spec
        self.url = url
        self.ulimits = dict(ulimits or {})
        self.pull = pull
        self.output_limit = output_limit
        self.name = f"platoon-{uuid.uuid4().hex[:12]}"
        self._docker: Any = None
        self._container: Any = None

    async def start(self) -> None:
        if self._container is not None:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise SandboxError("the docker provider runs under asyncio only (aiodocker)") from None
        import aiodocker

        try:
            self._docker = aiodocker.Docker(url=self.url)
        except Exception as exc:
            raise SandboxError(f"no Docker engine reachable: {exc}") from exc
        await self._ensure_image(aiodocker.DockerError)
        host_config: dict[str, Any] = {
            "Binds": [f"{m.source}:{m.target}:{'ro' if m.read_only else 'rw'}" for m in self.spec.mounts],
            "Ulimits": [
                {"Name": name, "Soft": lim[0], "Hard": lim[1]} if isinstance(lim, tuple)
                else {"Name": name, "Soft": lim, "Hard": lim}
                for name, lim in self.ulimits.items()
            ],
        }  # fmt: skip
        if not self.spec.network:
            host_config["NetworkMode"] = "none"
        if self.spec.cpus is not None:
            host_config["NanoCpus"] = int(self.spec.cpus * 1e9)
        if self.spec.memory_mb is not None:
            host_config["Memory"] = self.spec.memory_mb * 2**20
        if self.spec.pids is not None:
            host_config["PidsLimit"] = self.spec.pids
        config = {
            "Image": self.spec.image,
            "Entrypoint": ["sleep"],
            "Cmd": ["infinity"],
            "WorkingDir": self.spec.workdir,
            "Env": [f"{k}={v}" for k, v in self.spec.env.items()],
            "Labels": {"platoon.sandbox": "1"},
            "HostConfig": host_config,
        }
        try:
            self._container = await self._docker.containers.create(config, name=self.name)
            await self._container.start()
        except aiodocker.DockerError as exc:
            raise SandboxError(f"container for {self.spec.image} did not start: {exc.message}") from exc
        result = await self.exec(f"mkdir -p -- {shlex.quote(self.spec.workdir)}", cwd="/")
        if not result.ok:
            raise SandboxError(
                f"container has no usable shell: {result.stderr.strip() or result.return_code}"
            )

    async def _ensure_image(self, docker_error: type[Exception]) -> None:
        try:
            await self._docker.images.inspect(self.spec.image)
            return
        except docker_error:
            if not self.pull:
                raise SandboxError(f"image {self.spec.image!r} is not present and pull=False") from None
        try:
            await self._docker.images.pull(self.spec.image)
        except docker_error as exc:
            raise SandboxError(f"image {self.spec.image!r} is not present and could not be pulled") from exc

    def _check_started(self) -> None:
        if self._container is None:
            raise SandboxError("sandbox is not started")

    async def exec(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        user: str | None = None,
    ) -> ExecResult:
        self._check_started()
        if timeout is not None and timeout <= 0:
            raise SandboxError(f"timeout must be positive, got {timeout!r}")
        argv = ["bash", "-c", command]
        if timeout is not None:
            # coreutils timeout signals its whole process group, so children die too.
            argv = ["timeout", "-k", "2", f"{timeout:.3f}s", *argv]
        execution = await self._container.exec(
            argv,
            stdout=True,
            stderr=True,
            user=user or "",
            environment={k: str(v) for k, v in (env or {}).items()},
            workdir=remote_path(cwd or self.spec.workdir),
        )
        out, err = bytearray(), bytearray()
        began = time.monotonic()
        backstop = None if timeout is None else timeout + _BACKSTOP
        with anyio.move_on_after(backstop) as scope:
            async with execution.start(detach=False) as stream:
                while (message := await stream.read_out()) is not None:
                    buffer = err if message.stream == 2 else out
                    buffer += message.data[: max(self.output_limit - len(buffer), 0)]
        if scope.cancelled_caught:
            return ExecResult(out.decode(errors="replace"), err.decode(errors="replace"), 137, True)
        code = (await execution.inspect()).get("ExitCode")
        code = 1 if code is None else int(code)
        timed_out = timeout is not None and code in (124, 137) and time.monotonic() - began >= timeout
        return ExecResult(out.decode(errors="replace"), err.decode(errors="replace"), code, timed_out)

    async def upload(self, local_path: str | os.PathLike[str], remote_path_: str) -> None:
        """Copy a host file to `remote_path_`, or a directory's contents into it."""
        self._check_started()
        local = Path(local_path)
        remote = remote_path(remote_path_)
        dest, arcname = await anyio.to_thread.run_sync(_archive.upload_target, local, remote)
        made = await self.exec(f"mkdir -p -- {shlex.quote(dest)}", cwd="/")
        if not made.ok:
            raise SandboxError(f"upload to {remote} failed: {made.stderr.strip()}")
        buffer = io.BytesIO()
        await anyio.to_thread.run_sync(_archive.pack, local, buffer, arcname)
        import aiodocker

        try:
            await self._container.put_archive(dest, buffer.getvalue())
        except aiodocker.DockerError as exc:
            raise SandboxError(f"upload to {remote} failed: {exc.message}") from exc

    async def download(self, remote_path_: str, local_path: str | os.PathLike[str]) -> None:
        """Copy a container file to `local_path`, or a directory's contents into it."""
        self._check_started()
        remote = remote_path(remote_path_)
        if remote == "/":
            raise SandboxError("refusing to download the whole sandbox root")
        import aiodocker

        try:
            tar = await self._container.get_archive(remote)
        except aiodocker.DockerError as exc:
            raise SandboxError(f"download of {remote} failed: {exc.message}") from exc
        with tar:
            await anyio.to_thread.run_sync(_archive.unpack, tar, posixpath.basename(remote), Path(local_path))

    async def stop(self) -> None:
        container, self._container = self._container, None
        docker, self._docker = self._docker, None
        try:
            if container is not None:
                import aiodocker

                try:
                    # `sleep` as PID 1 ignores SIGTERM; kill first so removal does not wait.
                    await container.kill(signal="SIGKILL")
                except aiodocker.DockerError:
                    pass  # already stopped
                try:
                    await container.delete(force=True)
                except aiodocker.DockerError as exc:
                    if exc.status != 404:
                        raise SandboxError(f"could not remove container {self.name}: {exc.message}") from exc
        finally:
            if docker is not None:
                await docker.close()

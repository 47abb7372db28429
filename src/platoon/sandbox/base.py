"""The protocol every sandbox provider implements, and the shared parts of the
command-line providers (bwrap, apptainer, enroot)."""

from __future__ import annotations

import os
import posixpath
import shlex
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Protocol, Self, runtime_checkable

import anyio
import anyio.to_thread

from . import _archive
from ._process import OUTPUT_LIMIT, run_process
from .errors import SandboxError
from .spec import ExecResult, Mount, SandboxSpec

__all__ = ["BaseSandbox", "CommandSandbox", "Sandbox", "exec_phase", "supports_offline"]


@runtime_checkable
class Sandbox(Protocol):
    """An isolated place to run a task's commands. Use as `async with`, or call start/stop."""

    spec: SandboxSpec

    async def start(self) -> None: ...

    async def exec(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        user: str | None = None,
    ) -> ExecResult: ...

    async def upload(self, local_path: str | os.PathLike[str], remote_path: str) -> None: ...

    async def download(self, remote_path: str, local_path: str | os.PathLike[str]) -> None: ...

    async def stop(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


def supports_offline(box: object) -> bool:
    """Whether the sandbox can run one command without the network it was started with."""
    return bool(getattr(box, "exec_offline", False))


async def exec_phase(
    box: Sandbox,
    command: str,
    *,
    offline: bool,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    user: str | None = None,
) -> ExecResult:
    """`box.exec`, without the sandbox's network when `offline` (a task phase that has none)."""
    if offline and box.spec.network:
        return await box.exec(command, cwd=cwd, env=env, timeout=timeout, user=user, offline=True)  # type: ignore[call-arg]
    return await box.exec(command, cwd=cwd, env=env, timeout=timeout, user=user)


def remote_path(path: str) -> str:
    """Check a path inside the sandbox: absolute, no `..`; returns it normalised."""
    if not isinstance(path, str) or not posixpath.isabs(path) or ".." in path.split("/"):
        raise SandboxError(f"sandbox paths must be absolute without '..', got {path!r}")
    return posixpath.normpath(path)


class BaseSandbox:
    """`async with` support: start on entry, stop on exit, and stop after a failed start."""

    spec: SandboxSpec

    async def start(self) -> None:
        raise SandboxError(f"{type(self).__name__} does not implement start()")

    async def stop(self) -> None:
        raise SandboxError(f"{type(self).__name__} does not implement stop()")

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.stop()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with anyio.CancelScope(shield=True):
            await self.stop()


class CommandSandbox(BaseSandbox):
    """A sandbox driven by running one host command per `exec` (`bash -c` inside).

    Subclasses give `_exec_argv`; files move as tar streams through `tar` inside the
    sandbox, so paths resolve the way the sandbox sees them.
    """

    # The environment of the runtime process (None: the host's). The runtime is the sandbox's
    # first process, so whatever it holds can show in the sandbox's /proc.
    process_env: Mapping[str, str] | None = None

    def __init__(self, spec: SandboxSpec, *, output_limit: int = OUTPUT_LIMIT) -> None:
        self.spec = spec
        self.output_limit = output_limit
        self._started = False

    def _exec_argv(self, command: str, *, cwd: str, env: Mapping[str, str], user: str | None) -> list[str]:
        raise SandboxError(f"{type(self).__name__} does not implement _exec_argv()")

    def _check_started(self) -> None:
        if not self._started:
            raise SandboxError("sandbox is not started")

    async def _make_workdir(self) -> None:
        """Create the spec's workdir once the sandbox runs (images need not have it)."""
        made = await self.exec(f"mkdir -p -- {shlex.quote(self.spec.workdir)}", cwd="/")
        if not made.ok:
            raise SandboxError(f"could not create workdir {self.spec.workdir}: {made.stderr.strip()}")

    async def exec(
        self,
        command: str,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
        user: str | None = None,
        mounts: tuple[Mount, ...] = (),
        offline: bool = False,
    ) -> ExecResult:
        """Run `command` with `bash -c`; `mounts` (providers with `exec_mounts` only) are added
        for this command alone, and `offline` takes the sandbox's network away from it (providers
        with `exec_offline` only; a sandbox without network needs nothing)."""
        self._check_started()
        if timeout is not None and timeout <= 0:
            raise SandboxError(f"timeout must be positive, got {timeout!r}")
        cwd = remote_path(cwd or self.spec.workdir)
        extra: dict[str, object] = {}
        if mounts:
            if not getattr(self, "exec_mounts", False):
                raise SandboxError(f"{type(self).__name__} cannot add mounts to one command")
            extra["mounts"] = mounts
        if offline and self.spec.network:
            if not supports_offline(self):
                raise SandboxError(f"{type(self).__name__} cannot take the network away from one command")
            extra["offline"] = True
        argv = self._exec_argv(command, cwd=cwd, env=_env(env), user=user, **extra)
        result = await run_process(
            argv, timeout=timeout, output_limit=self.output_limit, env=self.process_env
        )
        return ExecResult(
            stdout=result.stdout.decode(errors="replace"),
            stderr=result.stderr.decode(errors="replace"),
            return_code=result.return_code,
            timed_out=result.timed_out,
        )

    async def upload(self, local_path: str | os.PathLike[str], remote_path_: str) -> None:
        """Copy a host file to `remote_path_`, or a directory's contents into it."""
        self._check_started()
        local = Path(local_path)
        remote = remote_path(remote_path_)
        dest, arcname = await anyio.to_thread.run_sync(_archive.upload_target, local, remote)
        with tempfile.TemporaryFile() as archive:
            await anyio.to_thread.run_sync(_archive.pack, local, archive, arcname)
            command = f"mkdir -p -- {shlex.quote(dest)} && tar -x -f - -C {shlex.quote(dest)}"
            argv = self._exec_argv(command, cwd="/", env={}, user=None)
            result = await run_process(
                argv, stdin=archive, output_limit=self.output_limit, env=self.process_env
            )
        if result.return_code != 0:
            raise SandboxError(f"upload to {remote} failed: {_tail(result.stderr)}")

    async def download(self, remote_path_: str, local_path: str | os.PathLike[str]) -> None:
        """Copy a sandbox file to `local_path`, or a directory's contents into it."""
        self._check_started()
        remote = remote_path(remote_path_)
        if remote == "/":
            raise SandboxError("refusing to download the whole sandbox root")
        parent, name = posixpath.split(remote)
        command = f"tar -c -f - -C {shlex.quote(parent)} -- {shlex.quote(name)}"
        argv = self._exec_argv(command, cwd="/", env={}, user=None)
        with tempfile.TemporaryFile() as archive:
            result = await run_process(
                argv, stdout_to=archive, output_limit=self.output_limit, env=self.process_env
            )
            if result.return_code != 0:
                raise SandboxError(f"download of {remote} failed: {_tail(result.stderr)}")
            archive.seek(0)
            await anyio.to_thread.run_sync(_extract, archive, name, Path(local_path))


def _extract(archive: BinaryIO, name: str, local: Path) -> None:
    with tarfile.open(fileobj=archive, mode="r") as tar:
        _archive.unpack(tar, name, local)


def _env(env: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(env or {})
    for key, value in env.items():
        if not key or "=" in key or "\0" in key or "\0" in str(value):
            raise SandboxError(f"invalid environment variable {key!r}")
    return {key: str(value) for key, value in env.items()}


def _tail(stderr: bytes, limit: int = 500) -> str:
    text = stderr.decode(errors="replace").strip()
    return text[-limit:] or "no error output"


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Delete a sandbox's state even where the sandboxed program removed write permission."""

    def make_writable_and_retry(func: Callable[[str], object], target: str, _exc_info: object) -> None:
        parent = os.path.dirname(target)
        try:
            os.chmod(parent, 0o700)
            if os.path.isdir(target) and not os.path.islink(target):
                os.chmod(target, 0o700)
            func(target)
        except FileNotFoundError:
            pass

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=make_writable_and_retry)

"""platoon's side of the verifiers worker: start it, ask it, stop it.

The worker (`worker.py` beside this file) runs under the verifiers venv's Python and answers on
a unix socket in a private folder, one connection per request, so episodes run side by side
with no multiplexing here. Its stdout says once that it is ready (or why not); its stderr, the
environment's own logging, goes to a file in the same folder, whose last lines say why a worker
died. The key of each episode travels only over the socket, never on a command line.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, TypeVar

import anyio
import anyio.abc
import msgspec

from platoon.envs.service import EnvError

__all__ = ["WORKER", "EpisodeResult", "WorkerProcess", "WorkerTask", "WorkerTasks"]

WORKER = Path(__file__).with_name("worker.py")
_MAX_REPLY = 16 * 1024 * 1024
R = TypeVar("R")


class WorkerTask(msgspec.Struct, frozen=True):
    index: int
    task_id: str
    prompt: str = ""
    system_prompt: str | None = None


class WorkerTasks(msgspec.Struct, frozen=True):
    tasks: list[WorkerTask]


class EpisodeResult(msgspec.Struct, frozen=True):
    """One verifiers episode as the worker scored it: each reward function's value (unweighted),
    their weighted sum, the task's metrics, and what went wrong if anything did."""

    ok: bool
    reward: float
    rewards: dict[str, float] = {}
    metrics: dict[str, float] = {}
    unscored: list[str] = []
    errors: list[str] = []
    reply: str = ""
    turns: int = 0


class _Failure(msgspec.Struct):
    error: str | None = None


class WorkerProcess:
    """One running worker. `start` returns once it has loaded the environment (or raises
    EnvError with the worker's one-line reason); `request` asks it one thing; `aclose` stops it."""

    def __init__(self, venv: Path, settings: Mapping[str, object], paths: Sequence[str] = ()) -> None:
        self.venv = venv
        self.settings = dict(settings)
        self.paths = [os.path.abspath(p) for p in paths]
        self.tasks = 0
        self._process: anyio.abc.Process | None = None
        self._folder: str | None = None
        self._stderr: IO[bytes] | None = None

    @property
    def socket(self) -> str:
        assert self._folder is not None
        return os.path.join(self._folder, "worker.sock")

    async def start(self, timeout: float | None = 600.0) -> None:
        self._folder = tempfile.mkdtemp(prefix="platoon-verifiers-")  # 0700: the socket is ours
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"  # verifiers runs `uv`
        if self.paths:
            env["PYTHONPATH"] = os.pathsep.join(self.paths)
        self._stderr = open(os.path.join(self._folder, "worker.log"), "wb")  # noqa: ASYNC230 - a fresh local file, closed in aclose
        argv = [str(self.venv / "bin" / "python"), str(WORKER), json.dumps(self.settings), self.socket]
        self._process = await anyio.open_process(
            argv, env=env, stdin=subprocess.PIPE, stderr=self._stderr, start_new_session=True
        )
        assert self._process.stdout is not None
        line = b""
        with anyio.move_on_after(timeout) as scope:
            async for chunk in self._process.stdout:
                line += chunk
                if b"\n" in line:
                    break
        if scope.cancelled_caught:
            await self.aclose()
            raise EnvError(
                f"the verifiers environment {self.settings['env_id']} did not load in {timeout:g} s"
            )
        try:
            ready = json.loads(line.split(b"\n", 1)[0])
        except ValueError:
            why = self._log_tail()
            await self.aclose()
            raise EnvError(f"the verifiers worker exited before it was ready: {why}") from None
        if "error" in ready:
            await self.aclose()
            raise EnvError(f"verifiers environment {self.settings['env_id']}: {ready['error']}")
        self.tasks = int(ready.get("tasks", 0))

    async def request(self, reply_type: type[R], op: str, **fields: object) -> R:
        """The worker's reply to one request; raises EnvError when it answered with an error."""
        if self._process is None:
            raise EnvError("the verifiers environment has closed")
        try:
            async with await anyio.connect_unix(self.socket) as stream:
                await stream.send((json.dumps({"op": op, **fields}) + "\n").encode())
                data = b""
                async for chunk in stream:
                    data += chunk
                    if len(data) > _MAX_REPLY:
                        raise EnvError("the verifiers worker's reply is over 16 MiB")
        except OSError as exc:
            raise EnvError(f"the verifiers worker did not answer ({exc}): {self._log_tail()}") from None
        if not data.strip():
            raise EnvError(f"the verifiers worker answered nothing: {self._log_tail()}")
        try:
            failure = msgspec.json.decode(data, type=_Failure)
            if failure.error is not None:
                raise EnvError(failure.error)
            return msgspec.json.decode(data, type=reply_type)
        except msgspec.ValidationError as exc:
            raise EnvError(f"the verifiers worker answered out of protocol: {exc}") from None

    def _log_tail(self) -> str:
        if self._folder is None:
            return "no log"
        try:
            text = Path(self._folder, "worker.log").read_bytes()[-4000:].decode(errors="replace")
        except OSError:
            return "no log"
        lines = [line for line in text.splitlines() if line.strip()]
        return " | ".join(lines[-3:])[-1500:] or "its log is empty"

    async def aclose(self) -> None:
        process, self._process = self._process, None
        with anyio.CancelScope(shield=True):
            if process is not None:
                if process.stdin is not None:
                    await process.stdin.aclose()  # the worker stops at EOF
                with anyio.move_on_after(10):
                    await process.wait()
                if process.returncode is None:
                    try:
                        os.killpg(process.pid, signal.SIGKILL)  # its session: harness programs too
                    except (ProcessLookupError, PermissionError):
                        pass
                    await process.wait()
                if process.stdout is not None:
                    await process.stdout.aclose()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

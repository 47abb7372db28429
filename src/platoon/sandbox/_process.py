"""Run one host process with a deadline, killing its whole process group when it passes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import BinaryIO

import anyio
from anyio.abc import ByteReceiveStream

OUTPUT_LIMIT = 16 * 2**20
_CHUNK = 65536
# How long output may keep flowing after the process exits (from children it left behind).
_LINGER = 1.0


class ProcessResult:
    __slots__ = ("return_code", "stderr", "stdout", "timed_out")

    def __init__(self, stdout: bytes, stderr: bytes, return_code: int, timed_out: bool) -> None:
        self.stdout = stdout
        self.stderr = stderr
        self.return_code = return_code
        self.timed_out = timed_out


async def run_process(
    argv: Sequence[str],
    *,
    stdin: BinaryIO | None = None,
    stdout_to: BinaryIO | None = None,
    timeout: float | None = None,
    output_limit: int = OUTPUT_LIMIT,
    env: Mapping[str, str] | None = None,
) -> ProcessResult:
    """Run `argv` in a new session; past `timeout` seconds the process group gets SIGKILL.

    Captured output keeps the first `output_limit` bytes of each stream and notes the
    cut; `stdout_to` receives stdout in full instead (archives). `env` replaces the host's
    environment for the process (None inherits it).
    """
    process = await anyio.open_process(
        list(argv),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
    )
    out, err = bytearray(), bytearray()
    drained = [anyio.Event(), anyio.Event()]
    timed_out = False
    try:
        with anyio.move_on_after(timeout) as scope:
            async with anyio.create_task_group() as tg:
                assert process.stdout is not None and process.stderr is not None
                tg.start_soon(_drain, process.stdout, out, output_limit, stdout_to, drained[0])
                tg.start_soon(_drain, process.stderr, err, output_limit, None, drained[1])
                if stdin is not None:
                    tg.start_soon(_feed, process, stdin)
                await process.wait()
                with anyio.move_on_after(_LINGER):
                    for event in drained:
                        await event.wait()
                if not all(event.is_set() for event in drained):
                    # Children it left behind hold the pipes; while they live, the group id is theirs.
                    _kill_group(process.pid)
                tg.cancel_scope.cancel()
        timed_out = scope.cancelled_caught
    finally:
        if process.returncode is None or timed_out:
            _kill_group(process.pid)
        with anyio.CancelScope(shield=True):
            await process.wait()
            await process.aclose()
    assert process.returncode is not None  # waited for above
    code = process.returncode if process.returncode >= 0 else 128 - process.returncode
    return ProcessResult(bytes(out), bytes(err), code, timed_out)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _drain(
    stream: ByteReceiveStream, buffer: bytearray, limit: int, sink: BinaryIO | None, done: anyio.Event
) -> None:
    dropped = 0
    try:
        async for chunk in stream:
            if sink is not None:
                sink.write(chunk)
                continue
            room = max(limit - len(buffer), 0)
            buffer += chunk[:room]
            dropped += len(chunk) - min(room, len(chunk))
    finally:
        if dropped:
            buffer += f"\n[platoon: {dropped} more bytes of output dropped]\n".encode()
        done.set()


async def _feed(process: anyio.abc.Process, source: BinaryIO) -> None:
    assert process.stdin is not None
    try:
        while chunk := source.read(_CHUNK):
            await process.stdin.send(chunk)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass  # the process stopped reading; its exit status says why
    finally:
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            await process.stdin.aclose()

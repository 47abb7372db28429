"""A `platoon` server as a user starts it: a real process, watched from outside (what it
printed, its memory from /proc)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path


class Served:
    """A `platoon` command serving until closed; what it printed, and its memory."""

    def __init__(
        self,
        argv: list[str],
        *,
        ready: str,
        env: dict[str, str] | None = None,
        timeout: float = 180,
        umask: int | None = None,
    ) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "platoon", *argv],
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=None if umask is None else (lambda: os.umask(umask) and None),
        )
        self.lines: list[str] = []
        self._ready = threading.Event()
        self._pattern = re.compile(ready)
        # Its output is read all along (a pipe nobody reads fills up and blocks the process).
        self._drain = threading.Thread(target=self._read, daemon=True)
        self._drain.start()
        if not self._ready.wait(timeout) or not self._matched():
            self.close()
            raise AssertionError(f"platoon {argv[0]} did not say it listens: {self.output}")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if self._pattern.search(line):
                self._ready.set()
        self._ready.set()  # it ended

    def _matched(self) -> bool:
        return any(self._pattern.search(line) for line in self.lines)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def memory_mib(self, field: str = "VmHWM") -> float:
        """VmRSS (resident now) or VmHWM (its peak so far), in MiB."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        found = re.search(rf"^{field}:\s+(\d+) kB", status, re.MULTILINE)
        assert found is not None, status
        return int(found.group(1)) / 1024

    def close(self) -> int:
        self.process.terminate()
        try:
            return self.process.wait(timeout=60)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            self._drain.join(timeout=10)
            if self.process.stdout is not None:
                self.process.stdout.close()

"""Run an agent program inside a sandbox, with host endpoints forwarded in through unix sockets.

An agent is untrusted code. It runs inside the sandbox (the task's, for Harbor) so its commands
act on the task's files, with an environment that holds only what its spec names. What it may
reach of the host is an explicit list of forwards, one per endpoint (the gateway, and the MCP
tool server when the spec uses one): for each, platoon listens on a unix socket in a
per-episode folder on the host and connects every connection to the endpoint's host:port; the
folder is bound into the sandbox at `RUN_DIR`, where a launcher (`_launcher.py`, run by the
sandbox's own `python3`) listens on `127.0.0.1:<port>` in the sandbox's network namespace and
relays to the socket. Nothing else of the host is reachable: with no network the sandbox has its
own loopback only; with network it has its own namespace behind slirp4netns (see `._netns`).

The launcher starts the agent in its own process group, keeps the last `output_cap` bytes of its
stdout and stderr (an agent that floods its output costs the event log nothing) and writes how it
ended to `result.json`, which the host reads back. The process group dies with the sandbox command.

Mounts per command need a provider that starts a process per command (bwrap): its `exec` takes
`mounts=`. Providers whose mounts are fixed at start (docker, apptainer, enroot) say so with a
clear error; for them the mounts would have to be declared when the sandbox starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import anyio.abc
import msgspec

from .base import Sandbox
from .errors import SandboxError
from .spec import Mount

__all__ = [
    "AGENT_HOME",
    "RUN_DIR",
    "SPEC_DIR",
    "TOOLCHAIN_DIR",
    "AgentExit",
    "Forward",
    "run_agent",
    "supports_agents",
]

RUN_DIR = "/opt/platoon/run"
AGENT_HOME = "/opt/platoon/home"
TOOLCHAIN_DIR = "/opt/platoon/toolchain"
SPEC_DIR = "/opt/platoon/spec"
OUTPUT_CAP = 65_536
_STARTUP_TIMEOUT_S = 30.0


class Forward(msgspec.Struct, frozen=True, kw_only=True):
    """Inside, `127.0.0.1:port` leads to the host's `target` (`host:port`)."""

    port: int
    target: str


class AgentExit(msgspec.Struct, frozen=True, kw_only=True):
    """How an agent program ended. `return_code` None: it never started (`error` says why)."""

    return_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    timed_out: bool = False
    error: str | None = None
    startup_s: float = 0.0


def supports_agents(box: Sandbox) -> bool:
    """Whether the sandbox takes extra mounts per command (what running an agent in it needs)."""
    return bool(getattr(box, "exec_mounts", False))


async def run_agent(
    box: Sandbox,
    argv: list[str],
    *,
    env: Mapping[str, str],
    files: Mapping[str, str] | None = None,
    forwards: list[Forward] = (),  # type: ignore[assignment]
    toolchain: str | os.PathLike[str] | None = None,
    spec_dir: str | os.PathLike[str] | None = None,
    interpreter: str | os.PathLike[str] | None = None,
    cwd: str | None = None,
    user: str | None = None,
    timeout: float | None = None,
    output_cap: int = OUTPUT_CAP,
    offline: bool = False,
) -> AgentExit:
    """Run `argv` in `box` (see the module docstring); `files` are written into its home, the
    toolchain and the spec's folder are mounted read-only at TOOLCHAIN_DIR and SPEC_DIR, and the
    `interpreter`'s installation folder (one outside the sandbox's base) at its own path. `offline`
    runs it without the sandbox's network (its forwards still reach the host's endpoints)."""
    if not supports_agents(box):
        raise SandboxError(
            f"the {type(box).__name__} provider fixes its mounts when it starts, so an agent cannot "
            "be run in it yet; use bwrap, or run the harness on the host (runs_in = 'host')"
        )
    with tempfile.TemporaryDirectory(prefix="platoon-agent-") as run_dir:
        run = Path(run_dir)
        home = run / "home"
        home.mkdir()
        for name, text in (files or {}).items():
            target = home / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        launcher = resources.files("platoon.sandbox").joinpath("_launcher.py").read_text()
        (run / "launcher.py").write_text(launcher)
        config = {
            "argv": list(argv),
            "forwards": [
                {"port": f.port, "socket": f"{RUN_DIR}/fwd-{i}.sock"} for i, f in enumerate(forwards)
            ],
            "cap": output_cap,
            "result": f"{RUN_DIR}/result.json",
        }
        (run / "config.json").write_text(json.dumps(config))
        # Ours alone: a sandbox that takes per-command mounts (bwrap) maps every user inside it to
        # our uid, so the agent is the owner; another local user may not read or relay through it.
        os.chmod(run, 0o700)
        os.chmod(home, 0o700)
        mounts = [Mount(source=str(run), target=RUN_DIR, read_only=False)]
        mounts.append(Mount(source=str(home), target=AGENT_HOME, read_only=False))
        if toolchain is not None:
            mounts.append(Mount(source=os.fspath(toolchain), target=TOOLCHAIN_DIR, read_only=True))
        if spec_dir is not None:
            mounts.append(Mount(source=os.fspath(spec_dir), target=SPEC_DIR, read_only=True))
        if interpreter is not None:  # a Python installation the toolchain's venv runs on
            prefix = os.fspath(interpreter)
            mounts.append(Mount(source=prefix, target=prefix, read_only=True))
        started = time.monotonic()
        async with _forwarding(run, forwards):
            command = f"exec python3 {RUN_DIR}/launcher.py {shlex.quote(RUN_DIR + '/config.json')}"
            result = await box.exec(  # type: ignore[call-arg]
                command,
                cwd=cwd,
                env={"HOME": AGENT_HOME, **env},
                timeout=timeout,
                user=user,
                mounts=tuple(mounts),
                **({"offline": True} if offline else {}),
            )
        return _exit(run, result, time.monotonic() - started)


def _exit(run: Path, result: object, elapsed: float) -> AgentExit:
    timed_out = bool(getattr(result, "timed_out", False))
    try:
        data = json.loads((run / "result.json").read_text())
    except (OSError, ValueError):
        stderr = str(getattr(result, "stderr", ""))[-2000:].strip()
        if timed_out:
            return AgentExit(timed_out=True, error="the agent passed its timeout", startup_s=elapsed)
        return AgentExit(
            error=f"the agent launcher failed (exit code {getattr(result, 'return_code', '?')}): {stderr}",
            startup_s=elapsed,
        )
    return AgentExit(
        return_code=data.get("code"),
        stdout=data.get("stdout", ""),
        stderr=data.get("stderr", ""),
        stdout_bytes=int(data.get("stdout_bytes", 0)),
        stderr_bytes=int(data.get("stderr_bytes", 0)),
        timed_out=timed_out,
        error=data.get("error"),
        startup_s=float(data.get("startup_s", 0.0)),
    )


@contextlib.asynccontextmanager
async def _forwarding(run: Path, forwards: list[Forward]) -> AsyncIterator[None]:
    """Serve each forward's unix socket in `run` while the block runs."""
    async with contextlib.AsyncExitStack() as stack, anyio.create_task_group() as tg:
        for index, forward in enumerate(forwards):
            host, port = _host_port(forward.target)
            path = run / f"fwd-{index}.sock"
            listener = await stack.enter_async_context(await anyio.create_unix_listener(path))
            os.chmod(path, 0o600)
            tg.start_soon(listener.serve, _relay_to(host, port))
        try:
            yield
        finally:
            tg.cancel_scope.cancel()


def _host_port(target: str) -> tuple[str, int]:
    parts = urlsplit(target if "//" in target else f"//{target}")
    if parts.hostname is None or parts.port is None:
        raise SandboxError(f"a forward needs host:port, got {target!r}")
    return parts.hostname, parts.port


def _relay_to(host: str, port: int):  # type: ignore[no-untyped-def]
    async def handle(client: anyio.abc.ByteStream) -> None:
        async with client:
            try:
                upstream = await anyio.connect_tcp(host, port)
            except OSError:
                return
            async with upstream, anyio.create_task_group() as tg:
                tg.start_soon(_pipe, client, upstream)
                tg.start_soon(_pipe, upstream, client)

    return handle


async def _pipe(source: anyio.abc.ByteStream, sink: anyio.abc.ByteStream) -> None:
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        async for chunk in source:
            await sink.send(chunk)
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        await sink.send_eof()

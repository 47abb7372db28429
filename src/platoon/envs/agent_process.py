"""An env session's side of `AgentProcessRequested`: run the agent in the session's sandbox.

The harness (a bus component of its own, perhaps on another machine's bus) asks; the session
that owns the sandbox runs the agent there, in the task's workdir and as the task's agent user,
with the harness's endpoints forwarded in (see `platoon.sandbox.agent`). A session without a
sandbox simply has no `run_agent`, and the env service answers `unsupported`.
"""

from __future__ import annotations

import json

from platoon.bus.events import AgentProcessExited, AgentProcessRequested
from platoon.sandbox import Sandbox, SandboxError
from platoon.sandbox.agent import Forward, run_agent

__all__ = ["run_requested_agent"]


async def run_requested_agent(
    box: Sandbox,
    req: AgentProcessRequested,
    *,
    cwd: str | None = None,
    user: str | None = None,
    timeout: float | None = None,
    offline: bool = False,
) -> AgentProcessExited:
    """Run what `req` describes in `box`; `timeout` caps the request's own (the task's limit), and
    `offline` runs it without the sandbox's network (a task phase that has none)."""
    try:
        payload = json.loads(req.payload)
        argv = [str(a) for a in payload["argv"]]
        env = {str(k): str(v) for k, v in payload.get("env", {}).items()}
        files = {str(k): str(v) for k, v in payload.get("files", {}).items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return AgentProcessExited(reply_to=req.request_id, error=f"a malformed agent request: {exc}")
    limits = [t for t in (req.timeout, timeout) if t is not None]
    applied = min(limits) if limits else None
    try:
        done = await run_agent(
            box,
            argv,
            env=env,
            files=files,
            forwards=[Forward(port=int(port), target=target) for port, target in req.forwards.items()],
            toolchain=req.toolchain,
            spec_dir=req.spec_dir,
            interpreter=req.interpreter,
            cwd=cwd,
            user=user,
            timeout=applied,
            output_cap=req.output_cap,
            offline=offline,
        )
    except SandboxError as exc:
        return AgentProcessExited(reply_to=req.request_id, error=str(exc))
    return AgentProcessExited(
        reply_to=req.request_id,
        return_code=done.return_code,
        stdout=done.stdout,
        stderr=done.stderr,
        stdout_bytes=done.stdout_bytes,
        stderr_bytes=done.stderr_bytes,
        timed_out=done.timed_out,
        # which limit fired, as the harness says it: "<agent> passed its 15 s timeout"
        error=f"its {applied:g} s timeout" if done.timed_out and applied is not None else done.error,
    )

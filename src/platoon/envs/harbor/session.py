"""One Harbor task's session: its sandbox, played through the `bash` tool (or a command-line
agent run in it) and graded by the task's tests, as Harbor's trial runs them.

Phases, in order: the agent (each command with the agent phase's network, as the agent's user,
within `[agent].timeout_sec`); the collect hooks; the artifacts, copied out to the backend's
artifacts folder; the verifier, in the same sandbox or, for a separate verifier, in a fresh
sandbox of the verifier's environment that gets only the artifacts. A multi-step task repeats
agent and verification per step (`next_step`), each step starting with its `workdir/` files
and `setup.sh`, and its grade combines the steps' (`platoon.envs.harbor.steps`).
"""

from __future__ import annotations

import math
import os
import shlex
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import anyio
from msgspec.structs import replace

from platoon.bus.events import AgentProcessExited, AgentProcessRequested, ToolSpec
from platoon.envs.agent_process import run_requested_agent
from platoon.envs.service import EnvError, Grade, ToolError, ToolResult
from platoon.sandbox import ExecResult, Sandbox, SandboxError
from platoon.sandbox.base import exec_phase, remote_path

from .collect import collect_artifacts, run_collect_hooks, upload_artifacts
from .config import EnvironmentConfig, Healthcheck
from .errors import HarborError
from .grading import VERIFIER_DIR
from .grading import Grade as VerifierGrade
from .grading import grade as run_verifier
from .spec import phase_network, separate_verifier, verifier_environment
from .steps import combine_steps, min_reward_failure
from .task import HarborStep, HarborTask

__all__ = ["BASH_TOOL", "DEFAULT_COMMAND_TIMEOUT", "HarborSession", "healthcheck"]

DEFAULT_COMMAND_TIMEOUT = 60.0
BASH_TOOL = ToolSpec(
    name="bash",
    description=(
        "Run a bash command in the task's sandbox, in its working directory. Files persist "
        "between commands; background processes do not. Returns the output and the exit code."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "the bash command to run"},
            "timeout": {
                "type": "number",
                "description": "seconds before the command is stopped (default 60)",
            },
        },
        "required": ["command"],
    },
)

# Starts a provisioned, health-checked sandbox of the task: its own environment, or another
# `[environment]` table of it (a separate verifier's) with the network given.
Starter = Callable[[HarborTask, EnvironmentConfig | None, bool | None], Awaitable[Sandbox]]


class HarborSession:
    """One task's sandbox, played through the `bash` tool and graded by the task's tests."""

    tools = [BASH_TOOL]

    def __init__(
        self,
        task: HarborTask,
        sandbox: Sandbox,
        *,
        start: Starter,
        pass_env: tuple[str, ...] = (),
        tool_output_chars: int = 30_000,
        artifacts_dir: str | os.PathLike[str] | None = None,
        default_network: bool = False,
        agent_timeout_multiplier: float = 1.0,
    ) -> None:
        self.task = task
        self.agent_timeout_multiplier = agent_timeout_multiplier
        self.sandbox = sandbox
        self.start = start
        self.pass_env = pass_env
        self.tool_output_chars = tool_output_chars
        self.default_network = default_network
        self.name = uuid.uuid4().hex[:12]
        self.artifacts_base = artifacts_dir
        self.artifacts_dir = None if artifacts_dir is None else Path(artifacts_dir, task.name, self.name)
        self.instruction = task.instruction
        self.graded = False
        self.index = 0  # the step being played (0 for a single-step task)
        self.results: list[dict[str, float] | None] = []  # the steps verified so far, in order
        self.notes: list[str] = []  # what went wrong around the agent (hooks, steps cut short)
        self.done = False  # no step is left to play or verify
        self._begin_agent()

    @property
    def step_count(self) -> int:
        """How many steps the agent plays (the env service tells the runner)."""
        return len(self.task.steps) or 1

    @property
    def step(self) -> HarborStep | None:
        return self.task.steps[self.index] if self.task.steps else None

    def _begin_agent(self) -> None:
        """The current step's agent phase: its user, its clock and its network."""
        agent, step = self.task.config.agent, self.step
        user, limit = agent.user, agent.timeout_sec
        if step is not None:
            user = step.config.agent.user if step.config.agent.user is not None else user
            limit = step.config.agent.timeout_sec if step.config.agent.timeout_sec is not None else limit
        self.user = None if user is None else str(user)
        self.limit = limit = None if limit is None else limit * self.agent_timeout_multiplier
        self.deadline = None if limit is None else time.monotonic() + limit
        self.offline = not self._network("agent")

    def _network(self, phase: Literal["setup", "agent", "verifier"]) -> bool:
        return phase_network(self.task, phase, self.step, default_network=self.default_network)

    async def _exec(
        self, command: str, *, offline: bool, timeout: float | None = None, user: str | None = None
    ) -> ExecResult:
        return await exec_phase(self.sandbox, command, offline=offline, timeout=timeout, user=user)

    # --- the agent ------------------------------------------------------------------------------

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        if name != "bash":
            raise ToolError(f"unknown tool {name!r}; the tool is bash")
        if self.graded:
            raise ToolError("the episode has been graded; the sandbox takes no more commands")
        command, timeout = _bash_arguments(arguments)
        left = self._time_left()
        if left is not None and left <= 0:
            return self._time_up()
        cut = left is not None and left < timeout
        try:
            result = await self._exec(
                command,
                offline=self.offline,
                timeout=left if left is not None and cut else timeout,
                user=self.user,
            )
        except SandboxError as exc:
            raise EnvError(f"the sandbox failed: {exc}") from None
        if result.timed_out and cut:
            return self._time_up()
        parts = [result.stdout, result.stderr]
        text = _head_and_tail("\n".join(p.rstrip("\n") for p in parts if p.strip()), self.tool_output_chars)
        status = (
            f"[timed out after {timeout:g} s]" if result.timed_out else f"[exit code {result.return_code}]"
        )
        return ToolResult(output=f"{text}\n{status}" if text else status)

    def _time_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def _time_up(self) -> ToolResult:
        return ToolResult(
            output=f"[the agent's time limit of {self.limit:g} s is up; the task's tests grade the result]",
            finished=True,
        )

    async def run_agent(self, req: AgentProcessRequested) -> AgentProcessExited:
        """Run a command-line agent in this task's sandbox, in its workdir, as its agent user;
        `[agent].timeout_sec` bounds it."""

        left = self._time_left()
        if left is not None and left <= 0:
            return AgentProcessExited(
                reply_to=req.request_id, error=self._limit(), timed_out=True, task_limit=True
            )
        exited = await run_requested_agent(
            self.sandbox,
            req,
            cwd=self.sandbox.spec.workdir,
            user=self.user,
            timeout=left,
            offline=self.offline and self.sandbox.spec.network,
        )
        if exited.timed_out and left is not None and (req.timeout is None or left < req.timeout):
            # The task's limit fired, not the agent's own: the sandbox is kept, and grading runs the
            # task's tests on what the agent left (as Harbor's runner does, and the bash tool).
            return replace(exited, error=self._limit(), task_limit=True)
        return exited

    def _limit(self) -> str:
        """The task's agent time limit, as a stopped agent's reason names it (it has one here)."""
        assert self.limit is not None
        scaled = self.agent_timeout_multiplier != 1
        return f"the task's {self.limit:g} s timeout" + (
            f" ({self.limit / self.agent_timeout_multiplier:g} s x {self.agent_timeout_multiplier:g})"
            if scaled
            else ""
        )

    async def read_file(self, path: str) -> str:
        """A file of the sandbox as text (for a judge's rubric), copied out to a private folder."""
        with tempfile.TemporaryDirectory(prefix="platoon-file-") as folder:
            local = Path(folder) / "file"
            try:
                await self.sandbox.download(remote_path(path), local)
            except SandboxError as exc:
                raise EnvError(f"the sandbox failed: {exc}") from None
            return local.read_bytes()[:262_144].decode("utf-8", errors="replace")

    # --- steps ----------------------------------------------------------------------------------

    async def begin(self) -> None:
        """Put the first step's files in place (a multi-step task); raises HarborError."""
        if self.step is not None:
            await self._prepare_step(self.step)

    async def _prepare_step(self, step: HarborStep) -> None:
        """Before a step's agent: the step's workdir files, its setup.sh, its healthcheck."""
        workdir = self.sandbox.spec.workdir
        offline = not self._network("setup")
        if step.workdir_dir is not None:
            await self.sandbox.upload(step.workdir_dir, workdir)
            if (Path(step.workdir_dir) / "setup.sh").is_file():
                script = shlex.quote(f"{workdir.rstrip('/')}/setup.sh")
                done = await self._exec(f"bash {script}", offline=offline, user=self.user_of(step))
                if done.return_code != 0:
                    tail = (done.stderr.strip() or done.stdout.strip())[-300:]
                    raise HarborError(
                        f"step {step.name!r}: setup.sh exited with code {done.return_code}: {tail}"
                    )
        if step.config.healthcheck is not None:
            await healthcheck(self.sandbox, step.config.healthcheck)

    def user_of(self, step: HarborStep) -> str | None:
        user = step.config.agent.user if step.config.agent.user is not None else self.task.config.agent.user
        return None if user is None else str(user)

    async def next_step(self) -> str | None:
        """Verify the step just played and begin the next: its instruction, or None when the task
        is over (its last step was played, or a step's `min_reward` was not met)."""
        step = self.step
        if step is None or self.done or self.graded:
            return None
        rewards = await self._verify_current()
        if rewards is None or (why := min_reward_failure(rewards, step.config.min_reward)) is not None:
            if rewards is None:
                why = "it has no verifier result"
            self.notes.append(f"step {step.name!r} ended the task: {why}")
            self.done = True
            return None
        if self.index + 1 >= len(self.task.steps):
            self.done = True
            return None
        self.index += 1
        try:
            # A shared verifier left its tests and outputs in the sandbox: the next agent sees neither.
            await self.sandbox.exec(f"shopt -s dotglob nullglob && rm -rf /tests/* {VERIFIER_DIR}/*", cwd="/")
            await self._prepare_step(self.task.steps[self.index])
        except (HarborError, SandboxError) as exc:
            self.notes.append(str(exc))
            self.done = True
            return None
        self._begin_agent()
        self.instruction = self.task.steps[self.index].instruction
        return self.instruction

    # --- verification ---------------------------------------------------------------------------

    async def grade(self) -> Grade:
        """Run the task's tests now (the agent is done) and return every reward they wrote; a
        multi-step task verifies its last step and combines its steps' rewards."""
        if self.graded:
            raise EnvError("this session has already been graded")
        self.graded = True
        if not self.task.steps:
            result = await self._verify(None)
            return Grade(
                reward=result.reward, rewards=dict(result.rewards), reason=self._reason(result.reason)
            )
        if not self.done:
            self.results.append(await self._verify_step())
            if self.index + 1 < len(self.task.steps):
                left = ", ".join(s.name for s in self.task.steps[self.index + 1 :])
                self.notes.append(f"steps {left} were not played")
        combined = combine_steps(self.task.config.multi_step_reward_strategy, self.results)
        parts = {
            f"steps/{step.name}/{key}": value
            for step, result in zip(self.task.steps, self.results, strict=False)
            for key, value in (result or {}).items()
        }
        if combined is None:
            return Grade(reward=None, rewards=parts, reason=self._reason("no step has a verifier result"))
        reward = combined.get("reward", next(iter(combined.values())) if len(combined) == 1 else None)
        reason = None if reward is not None else "the steps' rewards have several keys and no 'reward'"
        return Grade(reward=reward, rewards=combined | parts, reason=self._reason(reason))

    def _reason(self, reason: str | None) -> str | None:
        """The verifier's reason with what else went wrong (hooks, steps cut short)."""
        return "; ".join(([reason] if reason else []) + self.notes) or None

    async def _verify_current(self) -> dict[str, float] | None:
        rewards = await self._verify_step()
        self.results.append(rewards)
        return rewards

    async def _verify_step(self) -> dict[str, float] | None:
        result = await self._verify(self.step)
        if result.reason is not None and self.step is not None:
            self.notes.append(f"step {self.step.name!r}: {result.reason}")
        return dict(result.rewards) if result.rewards else None

    async def _verify(self, step: HarborStep | None) -> VerifierGrade:
        """Collect hooks, artifacts, then the verifier (here, or in a sandbox of its own)."""
        config = self.task.config
        hooks = [*config.verifier.collect, *(step.config.verifier.collect if step is not None else ())]
        self.notes += await run_collect_hooks(self.sandbox, hooks)
        artifacts = [*config.artifacts, *(step.config.artifacts if step is not None else ())]
        separate = separate_verifier(self.task, step)
        with tempfile.TemporaryDirectory(prefix="platoon-artifacts-") as scratch:
            folder = self._artifacts_folder(step) or (Path(scratch) if separate else None)
            workdir = self.sandbox.spec.workdir
            if folder is not None:
                try:
                    await collect_artifacts(self.sandbox, artifacts, folder, workdir=workdir)
                except (SandboxError, OSError) as exc:
                    self.notes.append(f"collecting artifacts failed: {exc}")
            if not separate:
                offline = not self._network("verifier")
                return await run_verifier(
                    self.sandbox, self.task, pass_env=self.pass_env, step=step, offline=offline
                )
            try:
                box = await self.start(
                    self.task, verifier_environment(self.task, step), self._network("verifier")
                )
            except (HarborError, SandboxError) as exc:
                return VerifierGrade({}, None, f"the verifier's sandbox did not start: {exc}")
            try:
                assert folder is not None
                await upload_artifacts(box, artifacts, folder, workdir=box.spec.workdir)
                return await run_verifier(box, self.task, pass_env=self.pass_env, step=step)
            except SandboxError as exc:
                return VerifierGrade({}, None, f"the verifier's sandbox failed: {exc}")
            finally:
                with anyio.CancelScope(shield=True):
                    await box.stop()

    def _artifacts_folder(self, step: HarborStep | None) -> Path | None:
        if self.artifacts_dir is None:
            return None
        return self.artifacts_dir / "steps" / step.name if step is not None else self.artifacts_dir

    async def fork(self, mode: Literal["fresh", "copy"]) -> HarborSession:
        if mode != "fresh":
            raise EnvError("harbor sessions fork only `fresh` (a new sandbox of the same task)")
        try:
            box = await self.start(self.task, None, None)
        except (HarborError, SandboxError) as exc:
            raise EnvError(f"task {self.task.name}: the sandbox did not start: {exc}") from None
        session = HarborSession(
            self.task,
            box,
            start=self.start,
            pass_env=self.pass_env,
            tool_output_chars=self.tool_output_chars,
            artifacts_dir=self.artifacts_base,
            default_network=self.default_network,
            agent_timeout_multiplier=self.agent_timeout_multiplier,
        )
        try:
            await session.begin()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await box.stop()
            raise
        return session

    async def close(self) -> None:
        await self.sandbox.stop()


async def healthcheck(box: Sandbox, check: Healthcheck) -> None:
    """Wait for a healthcheck to pass, as Harbor (and Docker) do: during `start_period_sec` a
    failure only waits `start_interval_sec`; after it, `retries` failures in a row fail it."""
    ends = time.monotonic() + check.start_period_sec
    failures = 0
    while True:
        in_start = time.monotonic() < ends
        result = await box.exec(check.command, timeout=check.timeout_sec)
        if result.ok:
            return
        if in_start:
            await anyio.sleep(check.start_interval_sec)
            continue
        failures += 1
        if failures >= max(check.retries, 1):
            raise HarborError(f"healthcheck {check.command!r} failed {failures} times in a row")
        await anyio.sleep(check.interval_sec)


def _head_and_tail(text: str, limit: int) -> str:
    """`text`, or its first and last parts with how much was cut between them."""
    if len(text) <= limit:
        return text
    note = f"\n[... {len(text) - limit} characters of output cut ...]\n"
    head = (limit - len(note)) // 2
    tail = limit - len(note) - head
    return text[:head] + note + text[len(text) - tail :]


def _bash_arguments(arguments: Mapping[str, Any]) -> tuple[str, float]:
    unknown = set(arguments) - {"command", "timeout"}
    if unknown:
        raise ToolError(f"bash takes command and timeout, not {', '.join(sorted(unknown))}")
    command = arguments.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ToolError("bash needs a non-empty `command` string")
    timeout = arguments.get("timeout", DEFAULT_COMMAND_TIMEOUT)
    if timeout is None:
        timeout = DEFAULT_COMMAND_TIMEOUT
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not (math.isfinite(timeout) and timeout > 0)
    ):
        raise ToolError(f"bash `timeout` must be a positive number of seconds, got {timeout!r}")
    return command, float(timeout)

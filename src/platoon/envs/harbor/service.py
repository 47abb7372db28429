"""`service: harbor`: a Harbor dataset as an env backend, each session a sandbox of its task.

    environments:
      - service: harbor
        service_kwargs:
          dataset: ./dataset          # a directory of tasks, or hf://<org>/<name>@<commit>
          index: [{metadata: [topic]}]
          holdout: {fraction: 0.25, group_by: topic}

Splits are `train` and `eval` (the held-out groups; `test` is the same tasks). A session
starts the task's sandbox with the site profile's provider, gives the agent one `bash`
tool that runs in the task's workdir, and grades by the task's own tests when the grader
asks, after the agent is done. `[agent].timeout_sec` ends the agent (its tool answers
`finished` once the time is up); the verifier still runs. Closing stops the sandbox.

Under bwrap the host's system directories are the base (bwrap cannot run images) and the
task's files come from the layer `platoon prepare` built, or from replaying its Dockerfile
when it was not prepared (see `platoon.envs.harbor.prepare`). Other providers run the
task's `docker_image`, or the image `platoon prepare` built from its Dockerfile.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import anyio
from msgspec.structs import replace

from platoon.bus.events import AgentProcessExited, AgentProcessRequested, ToolSpec
from platoon.config import load_site
from platoon.envs.agent_process import run_requested_agent
from platoon.envs.service import EnvError, Grade, TaskInfo, ToolError, ToolResult
from platoon.sandbox import Sandbox, SandboxError, SandboxSpec, create_sandbox, resolve_provider
from platoon.sandbox.base import remote_path

from . import prepare
from .dataset import Dataset, load_dataset
from .errors import HarborError
from .grading import grade
from .spec import sandbox_spec_for
from .task import HarborTask

TOOL_OUTPUT_CHARS = 30_000  # of one bash call's output

__all__ = ["BASH_TOOL", "HarborBackend", "HarborSession"]

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
_SPLITS = ("train", "eval", "test")


class HarborBackend:
    """The env backend of `service: harbor` (see the module docstring).

    `provider` and `cache` default to the site profile's; `provider_options` go to the
    sandbox provider (for docker: `url`, `ulimits`; for bwrap: `state_dir`). A `bash` call's
    output is kept to `tool_output_chars` characters (its head and its tail): what a model can
    read of it, and what the event log stores.
    """

    def __init__(
        self,
        dataset: str | os.PathLike[str],
        *,
        index: Sequence[Mapping[str, Sequence[str]]] = (),
        holdout: Mapping[str, Any] | None = None,
        provider: str | None = None,
        cache: str | os.PathLike[str] | None = None,
        provider_options: Mapping[str, Any] | None = None,
        tool_output_chars: int = TOOL_OUTPUT_CHARS,
        pass_env: Sequence[str] = (),
    ) -> None:
        if tool_output_chars < 256:
            raise EnvError(f"tool_output_chars must be at least 256, got {tool_output_chars}")
        self.tool_output_chars = tool_output_chars
        self.pass_env = tuple(pass_env)  # host variables tasks' ${VAR} templates may read
        if provider is None or cache is None:
            site = load_site()
            provider = provider or site.provider
            cache = cache if cache is not None else site.cache
        try:
            self.provider = resolve_provider(provider)
        except SandboxError as exc:
            raise EnvError(f"provider: {exc}") from None
        self.cache = os.fspath(cache)
        self.provider_options = dict(provider_options or {})
        try:
            self.root = prepare.resolve_dataset(dataset, self.cache)
            self.dataset: Dataset = load_dataset(self.root, index=index, holdout=holdout)
        except HarborError as exc:
            raise EnvError(str(exc)) from None

    async def list_splits(self) -> list[str]:
        return list(_SPLITS)

    async def list_tasks(self, split: str) -> list[TaskInfo]:
        if split not in _SPLITS:
            raise EnvError(f"unknown split {split!r}; splits are train, eval (or test)")
        names = self.dataset.train if split == "train" else self.dataset.eval
        return [
            TaskInfo(split=split, task_id=name, index=i, spec=dict(self.dataset.records[name]))
            for i, name in enumerate(names)
        ]

    async def open(self, task: TaskInfo, secrets: Mapping[str, str]) -> HarborSession:
        """Start the task's sandbox and put its files in place. Secrets do not enter the sandbox."""
        harbor_task = self.dataset.tasks.get(task.task_id)
        if harbor_task is None:
            raise EnvError(f"unknown task {task.task_id!r}")
        try:
            spec, provision = self._sandbox_for(harbor_task)
        except HarborError as exc:
            raise EnvError(f"task {harbor_task.name}: {exc}") from None
        box = create_sandbox(spec, self.provider, **self.provider_options)
        try:
            await box.start()
            await provision(box)
            await _healthcheck(box, harbor_task)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await box.stop()
            if isinstance(exc, SandboxError | HarborError):
                raise EnvError(
                    f"task {harbor_task.name}: the sandbox did not start: {exc}{self._hint(spec)}"
                ) from None
            raise
        return HarborSession(self, harbor_task, box)

    def _sandbox_for(self, task: HarborTask) -> tuple[SandboxSpec, Any]:
        """The sandbox spec, and what to do in the started sandbox before the agent comes."""
        if self.provider != "bwrap":
            image = task.config.environment.docker_image or prepare.image_tag(task)
            if image is None:
                raise HarborError(
                    f"provider {self.provider} needs [environment].docker_image or a Dockerfile"
                )
            return sandbox_spec_for(task, image=image, pass_env=self.pass_env), _nothing
        if task.dockerfile is None and task.config.environment.docker_image is None:
            raise HarborError("bwrap runs a Dockerfile's steps; this task has a compose file only")
        plan = prepare.plan_dockerfile(task) if task.dockerfile is not None else None
        spec = prepare.bwrap_spec(task, plan, self.pass_env)
        if plan is None:
            return spec, _nothing
        layer = prepare.find_layer(task, self.cache)
        if layer is not None:
            return spec, lambda box: prepare.restore_layer(box, layer)
        return spec, lambda box: prepare.apply_plan(
            box, plan, timeout=task.config.environment.build_timeout_sec
        )

    def _hint(self, spec: SandboxSpec) -> str:
        if spec.image is not None and spec.image.startswith(prepare.IMAGE_REPOSITORY):
            return " (its image is built by `platoon prepare CONFIG`)"
        return ""

    async def aclose(self) -> None:
        """Nothing to release: each session owns its sandbox."""


async def _nothing(box: Sandbox) -> None:
    return None


async def _healthcheck(box: Sandbox, task: HarborTask) -> None:
    """Wait for `[environment.healthcheck]` to pass, as Harbor does before the agent starts."""
    check = task.config.environment.healthcheck
    if check is None:
        return
    await anyio.sleep(check.start_period_sec)
    for attempt in range(check.retries + 1):
        result = await box.exec(check.command, timeout=check.timeout_sec)
        if result.ok:
            return
        if attempt < check.retries:
            await anyio.sleep(check.interval_sec)
    raise HarborError(f"healthcheck {check.command!r} did not pass after {check.retries + 1} tries")


class HarborSession:
    """One task's sandbox, played through the `bash` tool and graded by the task's tests."""

    tools = [BASH_TOOL]

    def __init__(self, backend: HarborBackend, task: HarborTask, sandbox: Sandbox) -> None:
        self.backend = backend
        self.task = task
        self.sandbox = sandbox
        self.instruction = task.instruction
        agent = task.config.agent
        self.user = None if agent.user is None else str(agent.user)
        self.deadline = None if agent.timeout_sec is None else time.monotonic() + agent.timeout_sec
        self.graded = False

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
            result = await self.sandbox.exec(
                command, timeout=left if left is not None and cut else timeout, user=self.user
            )
        except SandboxError as exc:
            raise EnvError(f"the sandbox failed: {exc}") from None
        if result.timed_out and cut:
            return self._time_up()
        parts = [result.stdout, result.stderr]
        text = _head_and_tail(
            "\n".join(p.rstrip("\n") for p in parts if p.strip()), self.backend.tool_output_chars
        )
        status = (
            f"[timed out after {timeout:g} s]" if result.timed_out else f"[exit code {result.return_code}]"
        )
        return ToolResult(output=f"{text}\n{status}" if text else status)

    def _time_left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def _time_up(self) -> ToolResult:
        limit = self.task.config.agent.timeout_sec
        return ToolResult(
            output=f"[the agent's time limit of {limit:g} s is up; the task's tests grade the result]",
            finished=True,
        )

    async def run_agent(self, req: AgentProcessRequested) -> AgentProcessExited:
        """Run a command-line agent in this task's sandbox, in its workdir, as its agent user;
        `[agent].timeout_sec` bounds it."""

        left = self._time_left()
        if left is not None and left <= 0:
            return AgentProcessExited(reply_to=req.request_id, error=self._limit(), timed_out=True)
        exited = await run_requested_agent(
            self.sandbox, req, cwd=self.sandbox.spec.workdir, user=self.user, timeout=left
        )
        if exited.timed_out and left is not None and (req.timeout is None or left < req.timeout):
            return replace(exited, error=self._limit())  # the task's limit fired, not the agent's own
        return exited

    def _limit(self) -> str:
        """The task's agent time limit, as a stopped agent's reason names it (it has one here)."""
        return f"the task's {self.task.config.agent.timeout_sec:g} s timeout"

    async def read_file(self, path: str) -> str:
        """A file of the sandbox as text (for a judge's rubric), copied out to a private folder."""
        import tempfile

        with tempfile.TemporaryDirectory(prefix="platoon-file-") as folder:
            local = Path(folder) / "file"
            try:
                await self.sandbox.download(remote_path(path), local)
            except SandboxError as exc:
                raise EnvError(f"the sandbox failed: {exc}") from None
            return local.read_bytes()[:262_144].decode("utf-8", errors="replace")

    async def grade(self) -> Grade:
        """Run the task's tests now (the agent is done) and return every reward they wrote."""
        self.graded = True
        result = await grade(self.sandbox, self.task, pass_env=self.backend.pass_env)
        return Grade(reward=result.reward, rewards=dict(result.rewards), reason=result.reason)

    async def fork(self, mode: Literal["fresh", "copy"]) -> HarborSession:
        if mode != "fresh":
            raise EnvError("harbor sessions fork only `fresh` (a new sandbox of the same task)")
        return await self.backend.open(TaskInfo(split="train", task_id=self.task.name, index=0), {})

    async def close(self) -> None:
        await self.sandbox.stop()


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

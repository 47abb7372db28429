"""`service: harbor`: a Harbor dataset as an env backend, each session a sandbox of its task.

    environments:
      - service: harbor
        service_kwargs:
          dataset: ./dataset          # a directory of tasks, or hf://<org>/<name>@<commit>
          index: [{metadata: [topic]}]
          holdout: {fraction: 0.25, group_by: topic}

          artifacts_dir: ./artifacts    # where artifacts go, <task>/<session>/ (a run: its run dir's)
          agent_timeout_multiplier: 10  # each task's agent.timeout_sec times this (a slow policy)

Splits are `train` and `eval` (the held-out groups; `test` is the same tasks). A session
starts the task's sandbox with the site profile's provider, gives the agent one `bash`
tool that runs in the task's workdir, and grades by the task's own tests when the grader
asks, after the agent is done (see `platoon.envs.harbor.session` for the phases). Closing
stops the sandbox.

How a task's sandbox is started, with each provider: `platoon.envs.harbor.sandboxes`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from platoon.config import load_site
from platoon.envs.service import EnvError, TaskInfo
from platoon.sandbox import Sandbox, SandboxError, resolve_provider

from . import prepare
from .config import EnvironmentConfig
from .dataset import Dataset, load_dataset
from .errors import HarborError
from .sandboxes import TaskSandboxes, stopped_on_failure
from .session import BASH_TOOL, HarborSession
from .task import HarborTask

TOOL_OUTPUT_CHARS = 30_000  # of one bash call's output

__all__ = ["BASH_TOOL", "HarborBackend", "HarborSession"]

_SPLITS = ("train", "eval", "test")


class HarborBackend:
    """The env backend of `service: harbor` (see the module docstring).

    `provider` and `cache` default to the site profile's; `provider_options` go to the
    sandbox provider (for docker: `url`, `ulimits`; for bwrap: `state_dir`). A `bash` call's
    output is kept to `tool_output_chars` characters (its head and its tail): what a model can
    read of it, and what the event log stores. `artifacts_dir` receives each session's artifacts
    (none are kept without it). `agent_timeout_multiplier` scales every task's (and step's)
    `agent.timeout_sec`, as Harbor's runner's timeout multiplier does: a task's author timed it
    for a fast model, and a policy sampled on a CPU may need many times that.
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
        artifacts_dir: str | os.PathLike[str] | None = None,
        agent_timeout_multiplier: float = 1.0,
    ) -> None:
        if tool_output_chars < 256:
            raise EnvError(f"tool_output_chars must be at least 256, got {tool_output_chars}")
        if not agent_timeout_multiplier > 0:
            raise EnvError(f"agent_timeout_multiplier must be positive, got {agent_timeout_multiplier}")
        self.agent_timeout_multiplier = float(agent_timeout_multiplier)
        self.tool_output_chars = tool_output_chars
        self.pass_env = tuple(pass_env)  # host variables tasks' ${VAR} templates may read
        self.artifacts_dir = None if artifacts_dir is None else os.fspath(artifacts_dir)
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
        self.sandboxes = TaskSandboxes(self.provider, self.cache, self.provider_options, self.pass_env)
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
            box = await self.start(harbor_task)
        except HarborError as exc:
            raise EnvError(f"task {harbor_task.name}: {exc}") from None
        session = HarborSession(
            harbor_task,
            box,
            start=self.start,
            pass_env=self.pass_env,
            tool_output_chars=self.tool_output_chars,
            artifacts_dir=self.artifacts_dir,
            agent_timeout_multiplier=self.agent_timeout_multiplier,
        )
        async with stopped_on_failure(box, lambda exc: EnvError(f"task {harbor_task.name}: {exc}")):
            await session.begin()
        return session

    async def start(
        self, task: HarborTask, environment: EnvironmentConfig | None = None, network: bool | None = None
    ) -> Sandbox:
        """A started sandbox of `task` (see `TaskSandboxes.start`)."""
        return await self.sandboxes.start(task, environment, network)

    async def aclose(self) -> None:
        """Nothing to release: each session owns its sandbox."""

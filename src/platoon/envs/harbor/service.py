"""`service: harbor`: a Harbor dataset as an env backend, each session a sandbox of its task.

    environments:
      - service: harbor
        service_kwargs:
          dataset: ./dataset          # a directory of tasks, or hf://<org>/<name>@<commit>
          index: [{metadata: [topic]}]
          holdout: {fraction: 0.25, group_by: topic}

          artifacts_dir: ./artifacts    # where artifacts go, <task>/<session>/ (a run: its run dir's)

Splits are `train` and `eval` (the held-out groups; `test` is the same tasks). A session
starts the task's sandbox with the site profile's provider, gives the agent one `bash`
tool that runs in the task's workdir, and grades by the task's own tests when the grader
asks, after the agent is done (see `platoon.envs.harbor.session` for the phases). Closing
stops the sandbox.

Under bwrap the host's system directories are the base (bwrap cannot run images) and the
task's files come from the layer `platoon prepare` built, or from replaying its Dockerfile
when it was not prepared (see `platoon.envs.harbor.prepare`). Other providers run the
task's `docker_image`, or the image `platoon prepare` built from its Dockerfile.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from platoon.config import load_site
from platoon.envs.service import EnvError, TaskInfo
from platoon.sandbox import (
    Sandbox,
    SandboxError,
    SandboxSpec,
    create_sandbox,
    get_provider,
    resolve_provider,
    supports_offline,
)

from . import prepare
from .config import EnvironmentConfig
from .dataset import Dataset, load_dataset
from .errors import HarborError
from .session import BASH_TOOL, HarborSession, healthcheck
from .spec import phase_network, sandbox_network, sandbox_spec_for, separate_verifier
from .task import HarborStep, HarborTask

TOOL_OUTPUT_CHARS = 30_000  # of one bash call's output

__all__ = ["BASH_TOOL", "HarborBackend", "HarborSession"]

_SPLITS = ("train", "eval", "test")
_LOGS = "/logs/agent /logs/verifier /logs/artifacts"


class HarborBackend:
    """The env backend of `service: harbor` (see the module docstring).

    `provider` and `cache` default to the site profile's; `provider_options` go to the
    sandbox provider (for docker: `url`, `ulimits`; for bwrap: `state_dir`). A `bash` call's
    output is kept to `tool_output_chars` characters (its head and its tail): what a model can
    read of it, and what the event log stores. `artifacts_dir` receives each session's artifacts
    (none are kept without it).
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
    ) -> None:
        if tool_output_chars < 256:
            raise EnvError(f"tool_output_chars must be at least 256, got {tool_output_chars}")
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
        )
        try:
            await session.begin()
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await box.stop()
            if isinstance(exc, SandboxError | HarborError):
                raise EnvError(f"task {harbor_task.name}: {exc}") from None
            raise
        return session

    async def start(
        self, task: HarborTask, environment: EnvironmentConfig | None = None, network: bool | None = None
    ) -> Sandbox:
        """A started sandbox of `task` (or of another `[environment]` of it, with `network`), its
        files in place and its healthcheck passed; raises HarborError saying why not."""
        env_config = environment or task.config.environment
        if network is None:
            network = sandbox_network(task)
            self._check_phases(task, network)
        spec, provision = self._sandbox_for(task, env_config, network)
        box = create_sandbox(spec, self.provider, **self.provider_options)
        try:
            await box.start()
            # Harbor's log folders exist before anything runs, writable by the agent's user.
            made = await box.exec(f"mkdir -p {_LOGS} && chmod 777 {_LOGS}", cwd="/")
            if not made.ok:
                raise HarborError(f"could not make {_LOGS}: {made.stderr.strip()}")
            offline = network and not phase_network(task, "setup") and environment is None
            await provision(box, offline)
            if env_config.storage_mb is not None:
                await _check_storage(box, env_config.storage_mb)
            if env_config.healthcheck is not None:
                await healthcheck(box, env_config.healthcheck)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await box.stop()
            if isinstance(exc, SandboxError | HarborError):
                raise HarborError(f"the sandbox did not start: {exc}{self._hint(spec)}") from None
            raise
        return box

    def _check_phases(self, task: HarborTask, network: bool) -> None:
        """Refuse phases with different networks where the provider cannot part them."""
        steps: list[HarborStep | None] = list(task.steps) or [None]
        phases = [phase_network(task, "setup")]
        phases += [phase_network(task, "agent", step) for step in steps]
        phases += [
            phase_network(task, "verifier", step) for step in steps if not separate_verifier(task, step)
        ]
        if network and not all(phases) and not supports_offline(get_provider(self.provider)):
            raise HarborError(
                "its phases differ in network (agent.network_mode or verifier.network_mode): the "
                f"{self.provider} provider cannot take the network from one phase's commands; use bwrap"
            )

    def _sandbox_for(
        self, task: HarborTask, environment: EnvironmentConfig | None = None, network: bool | None = None
    ) -> tuple[SandboxSpec, Any]:
        """The sandbox spec, and what to do in the started sandbox before the agent comes."""
        environment = environment or task.config.environment
        network = sandbox_network(task) if network is None else network
        if self.provider != "bwrap":
            image = (
                environment.docker_image or task.config.environment.docker_image or prepare.image_tag(task)
            )
            if image is None:
                raise HarborError(
                    f"provider {self.provider} needs [environment].docker_image or a Dockerfile"
                )
            spec = sandbox_spec_for(
                task, image=image, environment=environment, network=network, pass_env=self.pass_env
            )
            return spec, _nothing
        if task.dockerfile is None and task.config.environment.docker_image is None:
            raise HarborError("bwrap runs a Dockerfile's steps; this task has a compose file only")
        plan = prepare.plan_dockerfile(task) if task.dockerfile is not None else None
        spec = prepare.bwrap_spec(task, plan, self.pass_env, environment=environment, network=network)
        if plan is None:
            return spec, _nothing
        layer = prepare.find_layer(task, self.cache)
        if layer is not None:
            return spec, lambda box, offline: prepare.restore_layer(box, layer)
        return spec, lambda box, offline: prepare.apply_plan(
            box, plan, timeout=task.config.environment.build_timeout_sec, offline=offline
        )

    def _hint(self, spec: SandboxSpec) -> str:
        if spec.image is not None and spec.image.startswith(prepare.IMAGE_REPOSITORY):
            return " (its image is built by `platoon prepare CONFIG`)"
        return ""

    async def aclose(self) -> None:
        """Nothing to release: each session owns its sandbox."""


async def _nothing(box: Sandbox, offline: bool) -> None:
    return None


async def _check_storage(box: Sandbox, storage_mb: int) -> None:
    """`storage_mb`: the sandbox must have that much free space where the agent works (no provider
    here can cap a sandbox's disk, as Harbor's docker cannot)."""
    workdir = shlex.quote(box.spec.workdir)
    result = await box.exec(f"df -Pk {workdir} | tail -n 1", cwd="/")
    fields = result.stdout.split()
    if not result.ok or len(fields) < 4 or not fields[3].isdigit():
        raise HarborError(f"environment.storage_mb: could not read the free space of {box.spec.workdir}")
    free_mb = int(fields[3]) // 1024
    if free_mb < storage_mb:
        raise HarborError(
            f"environment.storage_mb = {storage_mb}: the sandbox has {free_mb} MB free at {box.spec.workdir}"
        )

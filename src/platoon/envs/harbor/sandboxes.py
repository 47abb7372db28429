"""Starting a Harbor task's sandbox with a provider: the spec, the task's files, its checks.

One place for what `service: harbor` sessions and Harbor's own runner (through
`platoon.envs.harbor.runner_env`) start, so both run a task in the same sandbox.

Under bwrap the host's system directories are the base (bwrap cannot run images) and the
task's files come from the layer `platoon prepare` built, or from replaying its Dockerfile
when it was not prepared (see `platoon.envs.harbor.prepare`). Other providers run the
task's `docker_image`, or the image `platoon prepare` built from its Dockerfile.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio

from platoon.sandbox import (
    Sandbox,
    SandboxError,
    SandboxSpec,
    create_sandbox,
    get_provider,
    supports_offline,
)

from . import prepare
from .config import EnvironmentConfig
from .errors import HarborError
from .session import healthcheck
from .spec import phase_network, sandbox_network, sandbox_spec_for, separate_verifier
from .task import HarborStep, HarborTask

__all__ = ["LOG_DIRS", "TaskSandboxes"]

# Harbor's log folders: they exist before anything runs, writable by the agent's user.
LOG_DIRS = ("/logs/agent", "/logs/verifier", "/logs/artifacts")

Provision = Callable[[Sandbox, bool], Awaitable[None]]


class TaskSandboxes:
    """Starts sandboxes of Harbor tasks with one provider (a name `resolve_provider` gave),
    its options, the site cache (where `platoon prepare` put layers) and the host variables
    tasks' `${VAR}` templates may read."""

    def __init__(
        self,
        provider: str,
        cache: str | os.PathLike[str],
        provider_options: Mapping[str, Any] | None = None,
        pass_env: Sequence[str] = (),
    ) -> None:
        self.provider = provider
        self.cache = os.fspath(cache)
        self.provider_options = dict(provider_options or {})
        self.pass_env = tuple(pass_env)

    async def start(
        self, task: HarborTask, environment: EnvironmentConfig | None = None, network: bool | None = None
    ) -> Sandbox:
        """A started sandbox of `task` (or of another `[environment]` of it, with `network`), its
        files in place and its healthcheck passed; raises HarborError saying why not."""
        env_config = environment or task.config.environment
        if network is None:
            network = sandbox_network(task)
            self.check_phases(task, network)
        spec, provision = self.sandbox_for(task, env_config, network)
        box = create_sandbox(spec, self.provider, **self.provider_options)
        async with stopped_on_failure(
            box, lambda exc: HarborError(f"the sandbox did not start: {exc}{self._hint(spec)}")
        ):
            await box.start()
            logs = " ".join(LOG_DIRS)
            made = await box.exec(f"mkdir -p {logs} && chmod 777 {logs}", cwd="/")
            if not made.ok:
                raise HarborError(f"could not make {logs}: {made.stderr.strip()}")
            offline = network and not phase_network(task, "setup") and environment is None
            await provision(box, offline)
            if env_config.storage_mb is not None:
                await _check_storage(box, env_config.storage_mb)
            if env_config.healthcheck is not None:
                await healthcheck(box, env_config.healthcheck)
        return box

    def check_phases(self, task: HarborTask, network: bool) -> None:
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

    def sandbox_for(
        self, task: HarborTask, environment: EnvironmentConfig | None = None, network: bool | None = None
    ) -> tuple[SandboxSpec, Provision]:
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


@contextlib.asynccontextmanager
async def stopped_on_failure(box: Sandbox, error: Callable[[Exception], Exception]) -> AsyncIterator[None]:
    """Stop `box` if the block fails (shielded, so a cancelled start still stops it), and turn a
    sandbox's or Harbor's error into `error(exc)`, one line for the caller."""
    try:
        yield
    except BaseException as exc:
        with anyio.CancelScope(shield=True):
            await box.stop()
        if isinstance(exc, SandboxError | HarborError):
            raise error(exc) from None
        raise


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

"""Mapping a Harbor task to the sandbox it asks for, and each phase to its network."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Literal

from ...sandbox import Mount, SandboxSpec
from .config import EnvironmentConfig, NetworkMode
from .errors import HarborError
from .task import HarborStep, HarborTask, resolve_env

__all__ = [
    "Phase",
    "phase_network",
    "sandbox_network",
    "sandbox_spec_for",
    "separate_verifier",
    "verifier_environment",
]

DEFAULT_WORKDIR = "/app"

Phase = Literal["setup", "agent", "verifier"]


def sandbox_spec_for(
    task: HarborTask,
    *,
    rootfs: str | os.PathLike[str] | None = None,
    image: str | None = None,
    default_network: bool = False,
    mounts: Sequence[Mount] = (),
    pass_env: Sequence[str] = (),
    environment: EnvironmentConfig | None = None,
    network: bool | None = None,
) -> SandboxSpec:
    """The SandboxSpec for `task`: its image (or the given `image`/`rootfs`), workdir,
    resources and env; `environment` another `[environment]` table of the task (a separate
    verifier's) instead of its own.

    Network is on only for `network_mode = "public"` (or `allow_internet = true`);
    "allowlist" gets none, since no provider here can filter hosts, and a task that
    does not say gets `default_network` (Harbor would give it the network). `network`, when
    given, is the sandbox's network outright (on when any phase needs it: `sandbox_network`).
    """
    env = environment or task.config.environment
    if env.gpus:
        raise HarborError(
            f"task {task.name}: environment.gpus = {env.gpus}: platoon's sandboxes provide no GPU"
        )
    return SandboxSpec(
        image=image or env.docker_image,
        rootfs=os.fspath(rootfs) if rootfs is not None else None,
        workdir=env.workdir or DEFAULT_WORKDIR,
        network=_public(env.network_mode, default_network) if network is None else network,
        cpus=env.cpus,
        memory_mb=env.memory_mb,
        env=resolve_env(env.env, allowed=pass_env),
        mounts=tuple(mounts),
    )


def _public(mode: NetworkMode | None, default: bool) -> bool:
    return default if mode is None else mode == "public"


def phase_network(
    task: HarborTask, phase: Phase, step: HarborStep | None = None, *, default_network: bool = False
) -> bool:
    """Whether `phase` (of `step`, in a multi-step task) has the network, by Harbor's rule: the
    step's own `network_mode` for the phase, else the task's, else the baseline (the agent's
    environment; a separate verifier's own)."""
    config = task.config
    baseline = _public(config.environment.network_mode, default_network)
    if phase == "setup":
        return baseline
    if phase == "verifier" and separate_verifier(task, step):
        baseline = _public(verifier_environment(task, step).network_mode, default_network)
    own = (step.config.agent if phase == "agent" else step.config.verifier) if step is not None else None
    task_phase = config.agent if phase == "agent" else config.verifier
    for policy in (own, task_phase):
        if policy is not None and policy.network_mode is not None:
            return policy.network_mode == "public"
    return baseline


def sandbox_network(task: HarborTask, *, default_network: bool = False) -> bool:
    """Whether the agent's sandbox needs the network at all: its setup, any agent phase, or a
    verifier that runs in it (commands of the other phases then run without it)."""
    steps: list[HarborStep | None] = list(task.steps) or [None]
    needs = [phase_network(task, "setup", default_network=default_network)]
    for step in steps:
        needs.append(phase_network(task, "agent", step, default_network=default_network))
        if not separate_verifier(task, step):
            needs.append(phase_network(task, "verifier", step, default_network=default_network))
    return any(needs)


def separate_verifier(task: HarborTask, step: HarborStep | None = None) -> bool:
    """Whether the verifier (of `step`) runs in a sandbox of its own, by Harbor's rule: the step's
    explicit mode, else a step's own verifier environment, else the task's setting."""
    if step is not None:
        own = step.config.verifier
        if own.environment_mode is not None:
            return own.environment_mode == "separate"
        if own.environment is not None:
            return True
    return task.config.verifier.separate


def verifier_environment(task: HarborTask, step: HarborStep | None = None) -> EnvironmentConfig:
    """The `[environment]` a separate verifier starts from: the step's, the task's verifier's,
    or a fresh one like the agent's."""
    if step is not None and step.config.verifier.environment is not None:
        return step.config.verifier.environment
    return task.config.verifier.environment or task.config.environment

"""Mapping a Harbor task to the sandbox it asks for."""

from __future__ import annotations

import os
from collections.abc import Sequence

from ...sandbox import Mount, SandboxSpec
from .errors import HarborError
from .task import HarborTask, resolve_env

__all__ = ["sandbox_spec_for"]

DEFAULT_WORKDIR = "/app"


def sandbox_spec_for(
    task: HarborTask,
    *,
    rootfs: str | os.PathLike[str] | None = None,
    image: str | None = None,
    default_network: bool = False,
    mounts: Sequence[Mount] = (),
    pass_env: Sequence[str] = (),
) -> SandboxSpec:
    """The SandboxSpec for `task`: its image (or the given `image`/`rootfs`), workdir,
    resources and env.

    Network is on only for `network_mode = "public"` (or `allow_internet = true`);
    "allowlist" gets none, since no provider here can filter hosts, and a task that
    does not say gets `default_network` (Harbor would give it the network).
    """
    env = task.config.environment
    if env.gpus:
        raise HarborError(f"task {task.name}: needs {env.gpus} GPU(s); platoon sandboxes provide none")
    mode = env.network_mode
    network = default_network if mode is None else mode == "public"
    return SandboxSpec(
        image=image or env.docker_image,
        rootfs=os.fspath(rootfs) if rootfs is not None else None,
        workdir=env.workdir or DEFAULT_WORKDIR,
        network=network,
        cpus=env.cpus,
        memory_mb=env.memory_mb,
        env=resolve_env(env.env, allowed=pass_env),
        mounts=tuple(mounts),
    )

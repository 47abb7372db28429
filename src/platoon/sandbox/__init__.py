"""Sandbox providers: one async protocol (start, exec, upload, download, stop) and
providers chosen by name: `bwrap`, `docker`, `apptainer`/`singularity`, `enroot`, and
any registered through the `platoon.sandbox_providers` entry point group.

    async with create_sandbox(SandboxSpec(rootfs=...), provider="bwrap") as box:
        result = await box.exec("echo hi")
"""

from .base import BaseSandbox, CommandSandbox, Sandbox, supports_offline
from .errors import SandboxError
from .registry import (
    ENTRY_POINT_GROUP,
    create_sandbox,
    default_provider,
    engine_answers,
    engine_url,
    get_provider,
    provider_names,
    register_provider,
    resolve_provider,
)
from .spec import ExecResult, Mount, SandboxSpec

__all__ = [
    "ENTRY_POINT_GROUP",
    "BaseSandbox",
    "CommandSandbox",
    "ExecResult",
    "Mount",
    "Sandbox",
    "SandboxError",
    "SandboxSpec",
    "create_sandbox",
    "default_provider",
    "engine_answers",
    "engine_url",
    "get_provider",
    "provider_names",
    "register_provider",
    "resolve_provider",
    "supports_offline",
]

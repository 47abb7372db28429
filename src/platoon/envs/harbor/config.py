"""task.toml as typed data, following Harbor's schema (unknown keys are ignored, as
Harbor does; deprecated keys are mapped to their current names)."""

from __future__ import annotations

import math
import re
from typing import Any, Literal

import msgspec

from .errors import HarborError

__all__ = [
    "AgentConfig",
    "Author",
    "EnvironmentConfig",
    "Healthcheck",
    "NetworkMode",
    "PackageInfo",
    "SolutionConfig",
    "TaskConfig",
    "VerifierConfig",
    "parse_task_config",
]

NetworkMode = Literal["public", "no-network", "allowlist"]
_PACKAGE_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*/[a-zA-Z0-9][a-zA-Z0-9._-]*$")


class Author(msgspec.Struct, frozen=True):
    name: str
    email: str | None = None


class PackageInfo(msgspec.Struct, frozen=True):
    """`[task]`: the package identity used by Harbor's registry (`org/name`)."""

    name: str
    version: str | None = None
    description: str = ""
    authors: list[Author] = []
    keywords: list[str] = []


class VerifierConfig(msgspec.Struct, frozen=True):
    timeout_sec: float = 600.0
    env: dict[str, str] = {}
    user: str | int | None = None
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None
    environment_mode: Literal["shared", "separate"] | None = None


class AgentConfig(msgspec.Struct, frozen=True):
    timeout_sec: float | None = None
    user: str | int | None = None
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None


class Healthcheck(msgspec.Struct, frozen=True):
    command: str
    interval_sec: float = 5.0
    timeout_sec: float = 30.0
    start_period_sec: float = 0.0
    start_interval_sec: float = 5.0
    retries: int = 3


class EnvironmentConfig(msgspec.Struct, frozen=True):
    """`[environment]`. `network_mode` None means the task did not say; Harbor would then
    use "public", platoon gives no network unless asked (see `sandbox_spec_for`)."""

    build_timeout_sec: float = 600.0
    docker_image: str | None = None
    os: Literal["linux", "windows"] = "linux"
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    gpus: int | None = None
    gpu_types: list[str] | None = None
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None
    env: dict[str, str] = {}
    workdir: str | None = None
    skills_dir: str | None = None
    healthcheck: Healthcheck | None = None
    mcp_servers: list[dict[str, Any]] = []


class SolutionConfig(msgspec.Struct, frozen=True):
    env: dict[str, str] = {}


class TaskConfig(msgspec.Struct, frozen=True):
    schema_version: str = "1.4"
    task: PackageInfo | None = None
    metadata: dict[str, Any] = {}
    verifier: VerifierConfig = VerifierConfig()
    agent: AgentConfig = AgentConfig()
    environment: EnvironmentConfig = EnvironmentConfig()
    solution: SolutionConfig = SolutionConfig()
    source: str | None = None
    artifacts: list[str | dict[str, Any]] = []
    multi_step_reward_strategy: Literal["mean", "final"] | None = None
    steps: list[dict[str, Any]] | None = None


def parse_task_config(raw: dict[str, Any]) -> TaskConfig:
    """Validate a decoded task.toml; raises HarborError naming the offending key."""
    raw = _migrate(raw)
    verifier = raw.get("verifier")
    if isinstance(verifier, dict) and verifier.get("environment") is not None:
        if verifier.get("environment_mode", "separate") != "shared":
            raise HarborError("task.toml: a separate verifier environment is not supported (shared only)")
    try:
        config = msgspec.convert(raw, TaskConfig, str_keys=True)
    except msgspec.ValidationError as exc:
        raise HarborError(f"task.toml: {str(exc).replace('`$.', '`')}") from None
    _check(config)
    return config


def _migrate(raw: dict[str, Any]) -> dict[str, Any]:
    raw = dict(raw)
    if "version" in raw:
        version = raw.pop("version")
        raw.setdefault("schema_version", version)
    if isinstance(raw.get("schema_version"), int | float):
        raw["schema_version"] = str(raw["schema_version"])
    env = raw.get("environment")
    if isinstance(env, dict):
        env = dict(env)
        for legacy, current in (("memory", "memory_mb"), ("storage", "storage_mb")):
            if legacy in env:
                value = env.pop(legacy)
                if isinstance(value, str):
                    size = _size_mb(value, legacy)
                    if current in env and env[current] != size:
                        raise HarborError(
                            f"task.toml: environment.{legacy}={value!r} ({size} MB) conflicts with "
                            f"environment.{current}={env[current]!r}"
                        )
                    env.setdefault(current, size)
        allow = env.pop("allow_internet", None)
        if allow is not None and "network_mode" not in env and env.get("allowed_hosts") is None:
            if not isinstance(allow, bool):
                raise HarborError("task.toml: environment.allow_internet must be true or false")
            env["network_mode"] = "public" if allow else "no-network"
        if isinstance(env.get("os"), str):
            env["os"] = env["os"].lower()
        if isinstance(env.get("cpus"), int) and not isinstance(env["cpus"], bool):
            env["cpus"] = float(env["cpus"])
        raw["environment"] = env
    return raw


def _size_mb(text: str, key: str) -> int:
    """Harbor's legacy sizes: a number with a K, M or G suffix ("4G" is 4096 MB)."""
    value = text.strip().upper()
    scale = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}.get(value[-1:])
    try:
        if scale is None:
            raise ValueError
        return int(float(value[:-1]) * scale)
    except ValueError:
        raise HarborError(
            f"task.toml: environment.{key}={text!r} is not a size like '4G' or '512M'"
        ) from None


# A task's time limits: anything longer is a typo (1e308 would never time out).
_MAX_SECONDS = 7 * 24 * 3600.0


def _check(config: TaskConfig) -> None:
    env, verifier, agent = config.environment, config.verifier, config.agent
    if config.task is not None and (not _PACKAGE_NAME.match(config.task.name) or ".." in config.task.name):
        raise HarborError(f"task.toml: task.name must look like 'org/name', got {config.task.name!r}")
    for where, value in (
        ("verifier.timeout_sec", verifier.timeout_sec),
        ("agent.timeout_sec", agent.timeout_sec),
        ("environment.build_timeout_sec", env.build_timeout_sec),
        ("environment.cpus", env.cpus),
        ("environment.memory_mb", env.memory_mb),
        ("environment.storage_mb", env.storage_mb),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise HarborError(f"task.toml: {where} must be a positive number, got {value!r}")
        if value is not None and where.endswith("timeout_sec") and value > _MAX_SECONDS:
            raise HarborError(
                f"task.toml: {where} must be at most {_MAX_SECONDS:.0f} (a week), got {value!r}"
            )
    major, _, minor = config.schema_version.partition(".")
    if major != "1" or not minor.isdigit():
        raise HarborError(
            f"task.toml: schema_version {config.schema_version!r} is not one platoon reads (Harbor's 1.x, "
            "up to 1.4)"
        )
    if env.gpus is not None and env.gpus < 0:
        raise HarborError(f"task.toml: environment.gpus must not be negative, got {env.gpus}")
    for where, mode, hosts in (
        ("environment", env.network_mode, env.allowed_hosts),
        ("verifier", verifier.network_mode, verifier.allowed_hosts),
        ("agent", agent.network_mode, agent.allowed_hosts),
    ):
        if hosts is not None and mode != "allowlist":
            raise HarborError(
                f"task.toml: {where}.allowed_hosts is only valid with network_mode = 'allowlist'"
            )
    if env.workdir is not None and not env.workdir.startswith("/"):
        raise HarborError(f"task.toml: environment.workdir must be an absolute path, got {env.workdir!r}")
    if env.os == "windows":
        raise HarborError("task.toml: environment.os = 'windows' cannot run in platoon's Linux sandboxes")
    if config.steps:
        raise HarborError("task.toml: multi-step tasks ([[steps]]) are not supported")
    if verifier.environment_mode == "separate":
        raise HarborError("task.toml: verifier.environment_mode = 'separate' is not supported (shared only)")

"""task.toml as typed data, following Harbor 0.25's `TaskConfig` field for field (unknown keys are
ignored, as Harbor does; deprecated keys are mapped to their current names).

Every field is either honoured or refused here with a line naming it; what platoon does with each
is the table in docs/how-to/harbor-tasks.md, which a test holds to these structs.
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import Any, Literal

import msgspec

from .errors import HarborError

__all__ = [
    "AgentConfig",
    "Artifact",
    "ArtifactConfig",
    "Author",
    "EnvironmentConfig",
    "Healthcheck",
    "MCPServerConfig",
    "NetworkMode",
    "PackageInfo",
    "SolutionConfig",
    "StepConfig",
    "TaskConfig",
    "TpuSpec",
    "VerifierCollectConfig",
    "VerifierConfig",
    "decode_task_config",
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


class TpuSpec(msgspec.Struct, frozen=True):
    type: str
    topology: str


class MCPServerConfig(msgspec.Struct, frozen=True):
    """`[[environment.mcp_servers]]`: an MCP server Harbor hands the agent (refused by platoon)."""

    name: str
    transport: Literal["stdio", "sse", "streamable-http", "http"] = "sse"
    url: str | None = None
    command: str | None = None
    args: list[str] = []
    headers: dict[str, str] = {}


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
    tpu: TpuSpec | None = None
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None
    env: dict[str, str] = {}
    workdir: str | None = None
    skills_dir: str | None = None
    healthcheck: Healthcheck | None = None
    mcp_servers: list[MCPServerConfig] = []


class VerifierCollectConfig(msgspec.Struct, frozen=True):
    """`[[verifier.collect]]`: a command run after the agent, before artifacts are collected."""

    command: str
    service: str = "main"
    timeout_sec: float = 60.0
    user: str | int | None = None


class VerifierConfig(msgspec.Struct, frozen=True):
    timeout_sec: float = 600.0
    env: dict[str, str] = {}
    user: str | int | None = None
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None
    environment_mode: Literal["shared", "separate"] | None = None
    environment: EnvironmentConfig | None = None
    collect: list[VerifierCollectConfig] = []

    @property
    def separate(self) -> bool:
        """Harbor's rule: an explicit mode, else separate exactly when an environment is given."""
        if self.environment_mode is not None:
            return self.environment_mode == "separate"
        return self.environment is not None


class AgentConfig(msgspec.Struct, frozen=True):
    timeout_sec: float | None = None
    user: str | int | None = None
    network_mode: NetworkMode | None = None
    allowed_hosts: list[str] | None = None


class SolutionConfig(msgspec.Struct, frozen=True):
    env: dict[str, str] = {}


class ArtifactConfig(msgspec.Struct, frozen=True):
    """An artifact entry: a sandbox path copied out after the agent (a bare string is `source`)."""

    source: str
    destination: str | None = None
    exclude: list[str] = []
    service: str | None = None


Artifact = str | ArtifactConfig


class StepConfig(msgspec.Struct, frozen=True):
    """`[[steps]]`: one step of a multi-step task (its files are under `steps/<name>/`)."""

    name: str
    agent: AgentConfig = AgentConfig()
    verifier: VerifierConfig = VerifierConfig()
    min_reward: float | dict[str, float] | None = None
    healthcheck: Healthcheck | None = None
    artifacts: list[Artifact] = []


class TaskConfig(msgspec.Struct, frozen=True):
    schema_version: str = "1.4"
    task: PackageInfo | None = None
    metadata: dict[str, Any] = {}
    verifier: VerifierConfig = VerifierConfig()
    agent: AgentConfig = AgentConfig()
    environment: EnvironmentConfig = EnvironmentConfig()
    solution: SolutionConfig = SolutionConfig()
    source: str | None = None
    artifacts: list[Artifact] = []
    multi_step_reward_strategy: Literal["mean", "final"] | None = None
    steps: list[StepConfig] | None = None


def parse_task_config(raw: dict[str, Any]) -> TaskConfig:
    """Validate a decoded task.toml and refuse what platoon cannot honour; raises HarborError
    naming the offending key."""
    config = decode_task_config(raw)
    _check(config)
    return config


def decode_task_config(raw: dict[str, Any]) -> TaskConfig:
    """A decoded task.toml as Harbor's schema types it, legacy keys mapped, nothing refused yet."""
    try:
        return msgspec.convert(_migrate(raw), TaskConfig, str_keys=True)
    except msgspec.ValidationError as exc:
        raise HarborError(f"task.toml: {str(exc).replace('`$.', '`')}") from None


def _migrate(raw: dict[str, Any]) -> dict[str, Any]:
    raw = dict(raw)
    if "version" in raw:
        version = raw.pop("version")
        raw.setdefault("schema_version", version)
    if isinstance(raw.get("schema_version"), int | float):
        raw["schema_version"] = str(raw["schema_version"])
    if isinstance(raw.get("environment"), dict):
        raw["environment"] = _migrate_environment(raw["environment"], "environment")
    verifiers = [("verifier", raw)]
    if isinstance(raw.get("steps"), list):
        raw["steps"] = [dict(step) if isinstance(step, dict) else step for step in raw["steps"]]
        verifiers += [(f"steps.{i}.verifier", s) for i, s in enumerate(raw["steps"]) if isinstance(s, dict)]
    for where, holder in verifiers:
        verifier = holder.get("verifier")
        if isinstance(verifier, dict) and isinstance(verifier.get("environment"), dict):
            verifier = holder["verifier"] = dict(verifier)
            verifier["environment"] = _migrate_environment(verifier["environment"], f"{where}.environment")
    return raw


def _migrate_environment(env: dict[str, Any], where: str) -> dict[str, Any]:
    """Harbor's deprecated `memory`/`storage` sizes and `allow_internet`, as their current keys."""
    env = dict(env)
    for legacy, current in (("memory", "memory_mb"), ("storage", "storage_mb")):
        if legacy in env:
            value = env.pop(legacy)
            if isinstance(value, str):
                size = _size_mb(value, f"{where}.{legacy}")
                if current in env and env[current] != size:
                    raise HarborError(
                        f"task.toml: {where}.{legacy}={value!r} ({size} MB) conflicts with "
                        f"{where}.{current}={env[current]!r}"
                    )
                env.setdefault(current, size)
    allow = env.pop("allow_internet", None)
    if allow is not None and "network_mode" not in env and env.get("allowed_hosts") is None:
        if not isinstance(allow, bool):
            raise HarborError(f"task.toml: {where}.allow_internet must be true or false")
        env["network_mode"] = "public" if allow else "no-network"
    if isinstance(env.get("os"), str):
        env["os"] = env["os"].lower()
    if isinstance(env.get("cpus"), int) and not isinstance(env["cpus"], bool):
        env["cpus"] = float(env["cpus"])
    return env


def _size_mb(text: str, key: str) -> int:
    """Harbor's legacy sizes: a number with a K, M or G suffix ("4G" is 4096 MB)."""
    value = text.strip().upper()
    scale = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}.get(value[-1:])
    try:
        if scale is None:
            raise ValueError
        return int(float(value[:-1]) * scale)
    except ValueError:
        raise HarborError(f"task.toml: {key}={text!r} is not a size like '4G' or '512M'") from None


# A task's time limits: anything longer is a typo (1e308 would never time out).
_MAX_SECONDS = 7 * 24 * 3600.0
# Harbor's portable step names: one directory name on every host OS.
_BAD_STEP_NAME = re.compile(r'[<>:"/\\|?*\x00-\x1f\x7f]')
_ARTIFACT_MANIFEST = "manifest.json"


def _check(config: TaskConfig) -> None:
    if config.task is not None and (not _PACKAGE_NAME.match(config.task.name) or ".." in config.task.name):
        raise HarborError(f"task.toml: task.name must look like 'org/name', got {config.task.name!r}")
    major, _, minor = config.schema_version.partition(".")
    if major != "1" or not minor.isdigit():
        raise HarborError(
            f"task.toml: schema_version {config.schema_version!r} is not one platoon reads (Harbor's 1.x, "
            "up to 1.4)"
        )
    _check_environment(config.environment, "environment")
    _check_phases(config.agent, config.verifier, "")
    _check_artifacts(config.artifacts, "artifacts")
    seen: set[str] = set()
    for index, step in enumerate(config.steps or ()):
        where = f"steps.{index}"
        name = step.name
        if (
            not name.strip()
            or name in (".", "..")
            or name.endswith((".", " "))
            or _BAD_STEP_NAME.search(name)
        ):
            raise HarborError(f"task.toml: {where}.name {name!r} is not a portable directory name")
        key = unicodedata.normalize("NFC", name).casefold()
        if key in seen:
            raise HarborError(f"task.toml: {where}.name {name!r} repeats another step's name")
        seen.add(key)
        _check_phases(step.agent, step.verifier, f"{where}.")
        _check_artifacts(step.artifacts, f"{where}.artifacts")
        if step.healthcheck is not None:
            _check_healthcheck(step.healthcheck, f"{where}.healthcheck")
        if isinstance(step.min_reward, float) and not math.isfinite(step.min_reward):
            raise HarborError(f"task.toml: {where}.min_reward must be finite")


def _positive(where: str, value: float | int | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise HarborError(f"task.toml: {where} must be a positive number, got {value!r}")
    if value is not None and where.endswith("timeout_sec") and value > _MAX_SECONDS:
        raise HarborError(f"task.toml: {where} must be at most {_MAX_SECONDS:.0f} (a week), got {value!r}")


def _check_network(where: str, mode: NetworkMode | None, hosts: list[str] | None) -> None:
    if hosts is not None and mode != "allowlist":
        raise HarborError(f"task.toml: {where}.allowed_hosts is only valid with network_mode = 'allowlist'")


def _check_healthcheck(check: Healthcheck, where: str) -> None:
    for key in ("interval_sec", "timeout_sec", "start_interval_sec"):
        _positive(f"{where}.{key}", getattr(check, key))
    if not (math.isfinite(check.start_period_sec) and 0 <= check.start_period_sec <= _MAX_SECONDS):
        raise HarborError(f"task.toml: {where}.start_period_sec must be between 0 and a week")
    if check.retries < 0:
        raise HarborError(f"task.toml: {where}.retries must not be negative, got {check.retries}")


def _check_environment(env: EnvironmentConfig, where: str) -> None:
    """What every `[environment]` table must satisfy, and what platoon refuses of one."""
    for key in ("build_timeout_sec", "cpus", "memory_mb", "storage_mb"):
        _positive(f"{where}.{key}", getattr(env, key))
    if env.gpus is not None and env.gpus < 0:
        raise HarborError(f"task.toml: {where}.gpus must not be negative, got {env.gpus}")
    _check_network(where, env.network_mode, env.allowed_hosts)
    if env.workdir is not None and not env.workdir.startswith("/"):
        raise HarborError(f"task.toml: {where}.workdir must be an absolute path, got {env.workdir!r}")
    if env.healthcheck is not None:
        _check_healthcheck(env.healthcheck, f"{where}.healthcheck")
    # Refused: what platoon's sandboxes cannot give, or what no platoon harness would use.
    if env.os == "windows":
        raise HarborError(f"task.toml: {where}.os = 'windows' cannot run in platoon's Linux sandboxes")
    if env.gpus:
        raise HarborError(f"task.toml: {where}.gpus = {env.gpus}: platoon's sandboxes provide no GPU")
    if env.tpu is not None:
        raise HarborError(f"task.toml: {where}.tpu: platoon's sandboxes provide no TPU")
    if env.mcp_servers:
        raise HarborError(
            f"task.toml: {where}.mcp_servers: platoon does not run a task's MCP servers (its agents get "
            "the task's tools from platoon)"
        )
    if env.skills_dir is not None:
        raise HarborError(f"task.toml: {where}.skills_dir: platoon's harnesses do not load a task's skills")


def _check_phases(agent: AgentConfig, verifier: VerifierConfig, prefix: str) -> None:
    _positive(f"{prefix}agent.timeout_sec", agent.timeout_sec)
    _positive(f"{prefix}verifier.timeout_sec", verifier.timeout_sec)
    _check_network(f"{prefix}agent", agent.network_mode, agent.allowed_hosts)
    _check_network(f"{prefix}verifier", verifier.network_mode, verifier.allowed_hosts)
    if verifier.environment_mode == "shared" and verifier.environment is not None:
        raise HarborError(
            f"task.toml: {prefix}verifier.environment_mode = 'shared' contradicts [{prefix}verifier.environment]"
        )
    if verifier.environment is not None:
        _check_environment(verifier.environment, f"{prefix}verifier.environment")
    for index, hook in enumerate(verifier.collect):
        where = f"{prefix}verifier.collect.{index}"
        _positive(f"{where}.timeout_sec", hook.timeout_sec)
        if hook.service != "main":
            raise HarborError(
                f"task.toml: {where}.service = {hook.service!r}: platoon runs only the main service, "
                "not a compose file's other services"
            )


def _check_artifacts(artifacts: list[Artifact], where: str) -> None:
    for index, entry in enumerate(artifacts):
        artifact = ArtifactConfig(source=entry) if isinstance(entry, str) else entry
        at = f"{where}.{index}"
        if not artifact.source or ".." in artifact.source.split("/"):
            raise HarborError(f"task.toml: {at} source {artifact.source!r} must be a path without '..'")
        if artifact.service not in (None, "main"):
            raise HarborError(
                f"task.toml: {at}.service = {artifact.service!r}: platoon runs only the main service, "
                "not a compose file's other services"
            )
        destination = artifact.destination
        if destination:
            parts = destination.split("/")
            if destination.startswith("/") or "\\" in destination or ".." in parts:
                raise HarborError(
                    f"task.toml: {at}.destination {destination!r} must be a relative path without '..'"
                )
            if destination.rstrip("/") == _ARTIFACT_MANIFEST:
                raise HarborError(f"task.toml: {at}.destination {_ARTIFACT_MANIFEST!r} is reserved")

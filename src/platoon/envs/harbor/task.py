"""One Harbor task directory, parsed and checked.

A task is `task.toml`, `instruction.md`, `environment/` (or a prebuilt
`[environment].docker_image`), `tests/test.sh` and optionally `solution/`.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Collection
from pathlib import Path
from typing import Any

import msgspec

from .checks import COMPOSE_FILES, check_compose, check_dockerfile, check_tree
from .config import TaskConfig, parse_task_config
from .errors import HarborError

__all__ = ["HarborTask", "load_task", "resolve_env"]


class HarborTask(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed task. `name` is the directory name (unique within a dataset); paths are
    absolute host paths."""

    name: str
    path: str
    instruction: str
    config: TaskConfig
    tests_dir: str
    environment_dir: str | None = None
    dockerfile: str | None = None
    compose_file: str | None = None
    solution_dir: str | None = None

    @property
    def metadata(self) -> dict[str, Any]:
        return self.config.metadata

    @property
    def test_script(self) -> str:
        return os.path.join(self.tests_dir, "test.sh")


def load_task(task_dir: str | os.PathLike[str]) -> HarborTask:
    """Parse and check a task directory; raises HarborError with the reason it is refused."""
    given = Path(task_dir)
    if not given.is_dir():
        raise HarborError(f"{given}: not a task directory")
    root = Path(os.path.realpath(given))
    try:
        return _load(root)
    except HarborError as exc:
        raise HarborError(f"task {given.name}: {exc}") from None


def _load(root: Path) -> HarborTask:
    config_path = root / "task.toml"
    if not config_path.is_file():
        raise HarborError("task.toml is missing")
    check_tree(root)
    try:
        raw = tomllib.loads(config_path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise HarborError(f"task.toml is not valid TOML: {exc}") from None
    config = parse_task_config(raw)
    instruction_path = root / "instruction.md"
    if not instruction_path.is_file():
        raise HarborError("instruction.md is missing")
    try:
        instruction = instruction_path.read_text()
    except UnicodeDecodeError:
        raise HarborError("instruction.md is not UTF-8 text") from None
    tests = root / "tests"
    if not (tests / "test.sh").is_file():
        raise HarborError("tests/test.sh is missing")
    env_dir = root / "environment"
    if not env_dir.is_dir() and not config.environment.docker_image:
        raise HarborError("needs environment/ or [environment].docker_image")
    dockerfile = compose = None
    if env_dir.is_dir():
        if (env_dir / "Dockerfile").is_file():
            dockerfile = env_dir / "Dockerfile"
            check_dockerfile(dockerfile, root)
        compose = next((env_dir / n for n in COMPOSE_FILES if (env_dir / n).is_file()), None)
        if compose is not None:
            check_compose(compose, root)
        if dockerfile is None and compose is None and not config.environment.docker_image:
            raise HarborError("environment/ has neither a Dockerfile nor a compose file")
    solution = root / "solution"
    return HarborTask(
        name=root.name,
        path=str(root),
        instruction=instruction,
        config=config,
        tests_dir=str(tests),
        environment_dir=str(env_dir) if env_dir.is_dir() else None,
        dockerfile=str(dockerfile) if dockerfile else None,
        compose_file=str(compose) if compose else None,
        solution_dir=str(solution) if solution.is_dir() else None,
    )


def resolve_env(
    env: dict[str, str],
    environ: os._Environ[str] | dict[str, str] | None = None,
    *,
    allowed: Collection[str] = (),
) -> dict[str, str]:
    """Fill Harbor's whole-value templates `${VAR}` / `${VAR:-default}` from the host env.

    A task is untrusted: it reads only the host variables the config lets it (`allowed`, the
    entry's `service_kwargs.pass_env`), never the trainer's keys by naming them. A variable it
    may not read takes the template's default, or is an error naming the setting.
    """
    source = os.environ if environ is None else environ
    resolved = {}
    for key, value in env.items():
        if value.startswith("${") and value.endswith("}") and "}" not in value[2:-1]:
            name, sep, default = value[2:-1].partition(":-")
            if name in allowed and name in source:
                resolved[key] = source[name]
            elif sep:
                resolved[key] = default
            elif name not in allowed:
                raise HarborError(
                    f"the task reads the host variable {name!r} (for {key}); a task reads only those "
                    "its entry passes (service_kwargs.pass_env)"
                )
            else:
                raise HarborError(f"environment variable {name!r} (for {key}) is not set on the host")
        else:
            resolved[key] = value
    return resolved

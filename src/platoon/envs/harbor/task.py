"""One Harbor task directory, parsed and checked.

A task is `task.toml`, `instruction.md`, `environment/` (or a prebuilt
`[environment].docker_image`), `tests/test.sh` and optionally `solution/`. A multi-step task
(`[[steps]]`) has `steps/<name>/instruction.md` per step, and its tests in
`steps/<name>/tests/` or the task's `tests/`, with optional `steps/<name>/workdir/` files (and a
`setup.sh` among them) put in place before the step's agent starts.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Collection
from pathlib import Path
from typing import Any

import msgspec

from .checks import COMPOSE_FILES, check_compose, check_dockerfile, check_tree
from .config import StepConfig, TaskConfig, parse_task_config
from .errors import HarborError

__all__ = ["HarborStep", "HarborTask", "load_task", "resolve_env"]

# Harbor seeds an agent with a task's prior ATIF trajectory; no platoon harness takes one.
_TRAJECTORY = "trajectory.json"


class HarborStep(msgspec.Struct, frozen=True, kw_only=True):
    """One step of a multi-step task. `tests_dirs` are uploaded to /tests in order (the task's
    tests, then the step's own), so a step's `test.sh` replaces the task's."""

    name: str
    instruction: str
    config: StepConfig
    tests_dirs: list[str]
    workdir_dir: str | None = None


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
    steps: list[HarborStep] = []

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
    if (root / _TRAJECTORY).exists():
        raise HarborError(f"{_TRAJECTORY}: platoon does not seed an agent with a prior trajectory")
    tests = root / "tests"
    steps = [_load_step(root, step) for step in config.steps or ()]
    if steps:
        instruction = steps[0].instruction
    else:
        instruction = _read_text(root, "instruction.md")
        if not (tests / "test.sh").is_file():
            raise HarborError("tests/test.sh is missing")
    separate = [config.verifier.separate] + [s.config.verifier.separate for s in steps]
    for folder in [tests] + [Path(d) for s in steps for d in s.tests_dirs]:
        bundled = [n for n in ("Dockerfile", "docker-compose.yaml") if (folder / n).is_file()]
        if any(separate) and bundled:
            raise HarborError(
                f"{folder.relative_to(root)}/{bundled[0]}: a separate verifier built from its tests needs a "
                "container engine; platoon starts the verifier from the task's environment"
            )
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
        steps=steps,
    )


def _read_text(root: Path, rel: str) -> str:
    path = root / rel
    if not path.is_file():
        raise HarborError(f"{rel} is missing")
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise HarborError(f"{rel} is not UTF-8 text") from None


def _load_step(root: Path, config: StepConfig) -> HarborStep:
    """A step's folder: its instruction, its tests (its own or the task's), its workdir files."""
    folder = root / "steps" / config.name
    if not folder.is_dir():
        raise HarborError(f"step {config.name!r}: steps/{config.name}/ is missing")
    if (folder / _TRAJECTORY).exists():
        raise HarborError(
            f"steps/{config.name}/{_TRAJECTORY}: platoon does not seed an agent with a prior trajectory"
        )
    instruction = _read_text(root, f"steps/{config.name}/instruction.md")
    tests = [d for d in (root / "tests", folder / "tests") if d.is_dir()]
    if not any((d / "test.sh").is_file() for d in tests):
        raise HarborError(
            f"step {config.name!r}: neither steps/{config.name}/tests/test.sh nor tests/test.sh exists"
        )
    workdir = folder / "workdir"
    return HarborStep(
        name=config.name,
        instruction=instruction,
        config=config,
        tests_dirs=[str(d) for d in tests],
        workdir_dir=str(workdir) if workdir.is_dir() else None,
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

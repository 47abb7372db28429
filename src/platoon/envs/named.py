"""Named environments: `env: NAME[@VERSION]`, from the `platoon.environments` entry points.

An installed package offers an ORS `Environment` class under a name; the class says its
version in a `version` attribute. Asking for a version pins it: another installed version
is an error before anything runs, so a config never silently trains on a changed task set.
"""

from __future__ import annotations

from typing import Any

from platoon.envs.service import EnvError
from platoon.naming import unknown_name
from platoon.plugins import PluginError, available, load

__all__ = ["load_named_env", "parse_env_name"]


def parse_env_name(ref: str) -> tuple[str, str | None]:
    """`platoon-number-search@1` -> (`platoon-number-search`, `1`)."""
    name, sep, version = ref.partition("@")
    if not name or (sep and not version):
        raise EnvError(f"an environment is named NAME or NAME@VERSION, not {ref!r}")
    return name, version or None


def load_named_env(ref: str) -> Any:
    """The environment class registered under `ref`'s name, checked against its version."""
    name, version = parse_env_name(ref)
    if name not in available("environments"):
        raise EnvError(unknown_name("environment", name, available("environments")))
    try:
        env = load("environments", name)
    except PluginError as exc:
        raise EnvError(str(exc)) from exc
    installed = getattr(env, "version", None)
    if version is not None:
        if installed is None:
            raise EnvError(f"environment {name!r} declares no version, but {ref!r} asks for {version}")
        if str(installed) != version:
            raise EnvError(f"environment {name!r} is version {installed}, but the config asks for {version}")
    return env

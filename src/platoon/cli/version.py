"""`platoon version`."""

from __future__ import annotations

import argparse
import platform
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version

KEY_DEPENDENCIES = ("anyio", "msgspec", "transformers", "tinker", "openreward", "torch", "peft", "nats-py")


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"platoon": dist_version("platoon"), "python": platform.python_version()}
    for name in KEY_DEPENDENCIES:
        try:
            found[name] = dist_version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def version(args: argparse.Namespace) -> int:
    for name, value in versions().items():
        print(f"{name:<14}{value or '(not installed)'}")
    return 0

"""The Python >= 3.12 venv a verifiers environment runs in, built once into the site cache.

It is a toolchain like a command-line agent's (`platoon.harness.toolchain`): pinned packages in
a content-addressed folder of the cache, built under a lock by the first process that needs it
(or by `platoon prepare`), with the first Python 3.12 the site profile names (`pythons:`) or
platoon finds. Besides verifiers it holds `uv`, which verifiers' harnesses use to run their
chat program; the environment's own packages are added to the pins.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from platoon.harness.toolchain import Toolchain, ToolchainError, build_toolchain

__all__ = ["PYTHON", "UV", "VERIFIERS", "ToolchainError", "build_venv", "venv_toolchain"]

VERIFIERS = "verifiers==0.4.0"
UV = "uv==0.13.9"
PYTHON = "3.12"


def venv_toolchain(packages: Sequence[str] = ()) -> Toolchain:
    """The toolchain of a verifiers venv with `packages` (pip specs) besides verifiers and uv."""
    return Toolchain(pip=[VERIFIERS, UV, *packages], python=PYTHON)


async def build_venv(
    packages: Sequence[str], cache: str | os.PathLike[str], pythons: Sequence[str] = ()
) -> Path:
    """The venv's folder (its interpreter is `bin/python`), built now unless it already is;
    raises ToolchainError saying why not (no Python 3.12, an install that failed)."""
    return await build_toolchain(venv_toolchain(packages), cache, pythons)

"""The Python >= 3.12 venv a verifiers environment runs in: one per (verifiers version, packages),
built once into the site cache.

It is a toolchain like a command-line agent's (`platoon.harness.toolchain`): pinned packages in
a content-addressed folder of the cache, built under a lock by the first process that needs it
(or by `platoon prepare`), with the first Python 3.12 the site profile names (`pythons:`) or
platoon finds. Besides verifiers it holds `uv`, which verifiers' v1 harnesses use to run their
chat program; the environment's own packages are added to the pins.

The verifiers version is the one the config names (`service_kwargs.verifiers`), else the newest
release within what the environment's packages require (read from their metadata, fetched once
with pip and remembered in the cache, so a later run needs no index) and what the worker speaks
(`SUPPORTED`). A requirement outside that range is refused before anything is built.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
import tomllib
import zipfile
from collections.abc import Sequence
from pathlib import Path

import anyio.to_thread
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from platoon.harness.toolchain import Toolchain, ToolchainError, build_toolchain, find_python, pip_conclusion

__all__ = [
    "DEFAULT",
    "PYTHON",
    "SUPPORTED",
    "UV",
    "ToolchainError",
    "build_venv",
    "resolve_version",
    "venv_toolchain",
]

DEFAULT = "0.4.0"  # the newest verifiers the worker speaks; an environment that names none gets it
SUPPORTED = SpecifierSet(">=0.1.8,<0.5")  # the classic API from 0.1.8, and v1 up to 0.4.x
UV = "uv==0.13.9"
PYTHON = "3.12"
_RANGE = "0.1.8 to 0.4.x"


def venv_toolchain(packages: Sequence[str] = (), version: str = DEFAULT) -> Toolchain:
    """The toolchain of a verifiers venv with `packages` (pip specs) besides verifiers and uv."""
    return Toolchain(pip=[f"verifiers=={version}", UV, *packages], python=PYTHON)


async def build_venv(
    packages: Sequence[str],
    cache: str | os.PathLike[str],
    pythons: Sequence[str] = (),
    *,
    version: str | None = None,
    paths: Sequence[str | os.PathLike[str]] = (),
) -> Path:
    """The venv's folder (its interpreter is `bin/python`), built now unless it already is;
    raises ToolchainError saying why not (no Python 3.12, an unsupported verifiers version, an
    install that failed: pip's conclusion and where its whole log is)."""
    resolved = await resolve_version(packages, cache, pythons, named=version, paths=paths)
    return await build_toolchain(venv_toolchain(packages, resolved), cache, pythons)


async def resolve_version(
    packages: Sequence[str],
    cache: str | os.PathLike[str],
    pythons: Sequence[str] = (),
    *,
    named: str | None = None,
    paths: Sequence[str | os.PathLike[str]] = (),
) -> str:
    """The verifiers version the venv pins (see the module docstring); ToolchainError in one line
    when it is outside `SUPPORTED`."""
    if named is not None:
        _check(named, "named in service_kwargs.verifiers")
        return named
    needs = [(str(p), spec) for p in paths if (spec := _path_requirement(Path(p))) is not None]
    if packages:
        needs += await anyio.to_thread.run_sync(_package_requirements, list(packages), Path(cache), pythons)
    if not needs:
        return DEFAULT
    wanted = SpecifierSet(",".join(str(spec) for _, spec in needs if str(spec)))
    candidates = _releases(wanted & SUPPORTED)
    if not candidates:
        found = ", ".join(f"{who} requires verifiers{spec}" for who, spec in needs)
        raise ToolchainError(f"{found}; platoon speaks verifiers {_RANGE} ({SUPPORTED})")
    return str(max(candidates))


def _check(version: str, where: str) -> None:
    try:
        supported = SUPPORTED.contains(Version(version), prereleases=True)
    except InvalidVersion:
        raise ToolchainError(f"verifiers {version!r} ({where}) is not a version") from None
    if not supported:
        raise ToolchainError(
            f"verifiers {version} ({where}) is not supported: platoon speaks verifiers {_RANGE} ({SUPPORTED})"
        )


# The releases of verifiers the worker speaks, newest last: the range is closed, so the list is too.
_KNOWN = (
    "0.1.8 0.1.8.post0 0.1.8.post1 0.1.8.post2 0.1.9 0.1.9.post0 0.1.9.post1 0.1.9.post2 "
    "0.1.9.post3 0.1.10 0.1.11 0.1.12 0.1.14 0.2.0 0.2.1 0.3.0 0.3.1 0.4.0"
).split()


def _releases(spec: SpecifierSet) -> list[Version]:
    return [v for v in map(Version, _KNOWN) if spec.contains(v, prereleases=True)]


def _path_requirement(folder: Path) -> SpecifierSet | None:
    """What an environment being written (`paths`) requires of verifiers, from its pyproject.toml."""
    try:
        project = tomllib.loads((folder / "pyproject.toml").read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return _verifiers_spec(project.get("dependencies") or [])


def _verifiers_spec(
    requirements: Sequence[str], extras: set[str] | frozenset[str] = frozenset()
) -> SpecifierSet | None:
    """The specifier on verifiers among `requirements` (with the package's `extras` asked for)."""
    for text in requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name.lower() != "verifiers":
            continue
        env = {"python_version": PYTHON, "python_full_version": f"{PYTHON}.0"}
        if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in {"", *extras}):
            return req.specifier
    return None


def _package_requirements(
    packages: list[str], cache: Path, pythons: Sequence[str]
) -> list[tuple[str, SpecifierSet]]:
    """Each package's requirement on verifiers, from its metadata: remembered in the cache, else
    fetched (`pip download --no-deps`, with the venv's Python so its own wheel is chosen)."""
    memo = cache / "verifiers" / "requirements.json"
    key = hashlib.sha256(json.dumps(sorted(packages)).encode()).hexdigest()[:20]
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):
        known = {}
    if key not in known:
        known[key] = {p: _fetch_requirement(p, pythons) for p in packages}
        memo.parent.mkdir(parents=True, exist_ok=True)
        memo.write_text(json.dumps(known, indent=1) + "\n")
    found = []
    for package, spec in known[key].items():
        if spec is not None:
            try:
                found.append((package, SpecifierSet(spec)))
            except InvalidSpecifier:
                continue
    return found


def _fetch_requirement(package: str, pythons: Sequence[str]) -> str | None:
    if Path(package).is_dir():
        spec = _path_requirement(Path(package))
        return None if spec is None else str(spec)
    python = find_python(PYTHON, pythons)
    if python is None:
        raise ToolchainError(
            f"it needs Python {PYTHON} and there is none: name one in the site profile (pythons:)"
        )
    with tempfile.TemporaryDirectory(prefix="platoon-vf-meta-") as folder:
        argv = [python[0], "-m", "pip", "download", "--no-deps", "--no-input", "--only-binary=:all:"]
        done = subprocess.run([*argv, "-d", folder, package], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            why = pip_conclusion(f"{done.stdout}\n{done.stderr}") or done.stderr.strip()[-300:]
            raise ToolchainError(f"the metadata of {package} could not be read: {why}")
        for wheel in Path(folder).glob("*.whl"):
            with zipfile.ZipFile(wheel) as archive:
                name = next(n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
                lines = archive.read(name).decode("utf-8", errors="replace").splitlines()
            requires = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]
            try:
                extras = set(Requirement(package).extras)
            except InvalidRequirement:
                extras = set()
            spec = _verifiers_spec(requires, extras)
            return None if spec is None else str(spec)
    return None

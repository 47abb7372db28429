"""`uv.lock` says what `pyproject.toml` asks for, so `uv sync` installs what pip would.

`uv lock --check` would ask the package index; this reads the lock's record of the requirements it
was resolved from and holds it to the project's own, offline. After a change to the requirements:
`uv lock` (uv from `pip install uv`), and commit the lock.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def _wanted() -> set[tuple[str, str, str, str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = [(line, "") for line in project["dependencies"]]
    lines += [(line, extra) for extra, group in project["optional-dependencies"].items() for line in group]
    out = set()
    for line, extra in lines:
        req = Requirement(line)
        out.add((canonicalize_name(req.name), ",".join(sorted(req.extras)), str(req.specifier), extra))
    return out


def _locked() -> tuple[set[tuple[str, str, str, str]], list[str]]:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    (package,) = [p for p in lock["package"] if p["name"] == "platoon"]
    out = set()
    for entry in package["metadata"]["requires-dist"]:
        marker = entry.get("marker", "")
        extra = marker.removeprefix("extra == '").removesuffix("'") if marker else ""
        specifier = str(Requirement(f"x{entry.get('specifier', '')}").specifier)
        extras = ",".join(sorted(entry.get("extras", [])))
        out.add((canonicalize_name(entry["name"]), extras, specifier, extra))
    return out, package["metadata"]["provides-extras"]


def test_the_lock_was_made_from_the_requirements_of_today():
    locked, extras = _locked()
    wanted = _wanted()
    assert locked == wanted, (
        f"uv.lock is stale: run `uv lock`. Only in pyproject.toml: {sorted(wanted - locked)}; "
        f"only in uv.lock: {sorted(locked - wanted)}"
    )
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert extras == list(project["optional-dependencies"])


def test_the_lock_pins_every_package_it_installs():
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    names = {p["name"] for p in lock["package"]}
    assert {"tinker", "openreward", "torch", "msgspec", "anyio"} <= names
    for package in lock["package"]:
        if package["name"] != "platoon":
            assert package.get("version"), package["name"]

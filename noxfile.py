"""Developer sessions: `nox -s tests`, `nox -s lint`, `nox -s bench`.

The embedded backend needs torch, whose small CPU wheel exists for Python 3.11 only on our
machines, so 3.12 and 3.13 run the suite without the `local` extra (the torch tests skip).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.default_venv_backend = "venv"

PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"


def interpreter(version: str) -> str | None:
    """A full path where pyenv has the version (its shims fail here), else the bare name."""
    for candidate in sorted(PYENV.glob(f"{version}.*"), reverse=True):
        python = candidate / "bin" / "python"
        if python.exists():
            return str(python)
    return shutil.which(f"python{version}")


PYTHONS = {v: interpreter(v) for v in ("3.11", "3.12", "3.13")}


@nox.session(python=PYTHONS["3.11"] or "3.11", name="tests")
def tests(session: nox.Session) -> None:
    session.install("torch==2.13.0")
    session.install("-e", ".[all,dev]")
    session.install("-e", "./plugins/platoon-textcraft")
    session.run("pytest", *session.posargs)


def _tests_without_torch(session: nox.Session) -> None:
    session.install("-e", ".[tinker,ors,nats,docker,dev]")
    session.install("-e", "./plugins/platoon-textcraft")
    session.run("pytest", "-m", "not torch", *session.posargs)


for _version in ("3.12", "3.13"):
    if PYTHONS[_version]:
        nox.session(python=PYTHONS[_version], name=f"tests-no-torch-{_version}")(_tests_without_torch)


@nox.session(python=PYTHONS["3.11"] or "3.11")
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "format", "--check", ".")
    session.run("ruff", "check", ".")


@nox.session(python=PYTHONS["3.11"] or "3.11")
def bench(session: nox.Session) -> None:
    session.install("-e", ".[all,dev]")
    for script in sorted(Path("benchmarks").glob("*.py")):
        session.run("python", str(script))

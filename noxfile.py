"""Developer sessions: `nox -s tests`, `nox -s lint`, `nox -s bench`, `nox -s flaky -- N`.

The embedded backend needs torch, whose small CPU wheel exists for Python 3.11 only on our
machines, so 3.12 and 3.13 run the suite without the `local` extra (the torch tests skip).
"""

from __future__ import annotations

import os
import shutil
import xml.etree.ElementTree as ElementTree
from collections import Counter
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
    session.install("--no-deps", "tinker-cookbook==0.6.1")  # as README's test command does
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


@nox.session(python=PYTHONS["3.11"] or "3.11", reuse_venv=True)
def flaky(session: nox.Session) -> None:
    """Run the learning, distributed and server tests N times (`nox -s flaky -- 20`), each time
    in another random order (and under xdist, as CI runs them), and print each test's pass count."""
    runs = int(session.posargs[0]) if session.posargs else 20
    session.install("torch==2.13.0")
    session.install("-e", ".[all,dev]")
    session.install("--no-deps", "tinker-cookbook==0.6.1")  # as README's test command does
    session.install("-e", "./plugins/platoon-textcraft")
    reports = Path(session.create_tmp()) / "flaky"
    reports.mkdir(exist_ok=True)
    passed: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    for run in range(1, runs + 1):
        report = reports / f"run-{run}.xml"
        session.run(
            *("pytest", "-q", "-p", "no:cacheprovider", "-m", "learning or distributed or server"),
            *(f"--randomly-seed={run}", f"--junitxml={report}"),
            success_codes=[0, 1],
        )
        for case in ElementTree.parse(report).iter("testcase"):
            if case.find("skipped") is not None:
                continue
            name = f"{case.get('classname')}::{case.get('name')}"
            seen[name] += 1
            passed[name] += case.find("failure") is None and case.find("error") is None
    for name in sorted(seen, key=lambda n: (passed[n] - seen[n], n)):
        print(f"{passed[name]:>3}/{seen[name]:<3} {name}")
    failing = sorted(n for n in seen if passed[n] < seen[n])
    print(f"{len(seen)} tests, {runs} runs: {len(failing)} failed at least once")
    if failing:
        session.error("flaky: " + ", ".join(failing))

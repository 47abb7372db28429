"""Harbor's own runner against platoon's eval, task by task: the table of each reward key that
its oracle and no-op agents and platoon's scripted policies like them get on the same tasks
(see tests/envs/harbor/runner_check.py), and the time each side took.

Run: python benchmarks/harbor_runner.py [DATASET ...]
Without a dataset: the example dataset with a multi-step task beside it (the held-out check's
tasks). Each task needs a solution/solve.sh (each step of a multi-step one, its own). Harbor's
venv (Python 3.12) is built into the site cache the first time. Exits 1 when the two disagree.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "envs" / "harbor"))

from runner_check import (  # the check lives beside its test
    EXAMPLE_DATASET,
    compare,
    harbor_python,
    no_python,
    run_harbor,
    run_platoon,
    table,
    write_steps_task,
)

AGENTS = (("oracle", "solve"), ("nop", "noop"))


def check(dataset: Path, work: Path, python: Path) -> list[str]:
    began = time.perf_counter()
    harbor = run_harbor(python, dataset, [agent for agent, _ in AGENTS], work / "jobs", work / "cache")
    harbor_s = time.perf_counter() - began
    began = time.perf_counter()
    ours = {agent: run_platoon(dataset, policy, work / agent, work / "cache") for agent, policy in AGENTS}
    platoon_s = time.perf_counter() - began
    runs = {agent: (ours[agent], harbor[agent]) for agent, _ in AGENTS}
    print(f"{dataset}: {len(harbor['oracle'])} tasks")
    print(table(runs))
    print(
        f"Harbor's runner {harbor_s:.1f} s (both agents, one job); platoon's eval {platoon_s:.1f} s (both)\n"
    )
    return [f"{agent}: {problem}" for agent, (a, b) in runs.items() for problem in compare(a, b)]


def main(args: list[str]) -> int:
    why = no_python()
    if why is not None:
        print(why)
        return 2
    began = time.perf_counter()
    python = harbor_python()
    print(f"Harbor's venv: {python} (ready in {time.perf_counter() - began:.1f} s)\n")
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="platoon-harbor-check-") as scratch:
        work = Path(scratch)
        datasets = [Path(a).resolve() for a in args]
        if not datasets:
            default = work / "dataset"
            shutil.copytree(EXAMPLE_DATASET, default)
            write_steps_task(default)
            datasets = [default]
        for index, dataset in enumerate(datasets):
            problems += check(dataset, work / str(index), python)
    print("\n".join(problems) or "platoon and Harbor's runner agree on every task and key")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

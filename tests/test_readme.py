"""The README's commands, read from the README itself and run, so it cannot rot: the set-up
commands (the test command is exactly what CI runs; the main job trains, here for 2 steps) and
every `platoon` line of the quickstart."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def blocks(section: str) -> list[str]:
    """The code blocks of a `## section` of the README."""
    body = README.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```\n(.*?)```", body, flags=re.S)


def platoon(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`platoon ARGS` with this interpreter's platoon (the README's `.venv/bin/platoon`)."""
    command = [sys.executable, "-m", "platoon", *argv]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "site.yaml").write_text(f"runs: {tmp_path / 'runs'}\ncache: {tmp_path / 'cache'}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TINKER_", "PLATOON_"))}
    return env | {"PLATOON_SITE": str(tmp_path / "site.yaml")}


def test_the_test_command_is_what_ci_runs():
    main_job, tiny, _, tests = [b.strip() for b in blocks("Set up")]
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()
    assert tests.startswith("python3.11 -m venv .venv && ") and tests.endswith("-m pytest --cov")
    assert main_job.startswith("python3.11 -m venv .venv && . .venv/bin/activate && ")
    assert tiny.startswith(".venv/bin/platoon train ")


def test_the_main_job_is_the_real_model_example():
    """The main job trains `examples/real-model/train.yaml`, which tests/examples/test_real_model.py
    trains (shortened, it is slow) and checks that the held-out reward rises."""
    main_job = blocks("Set up")[0].strip()
    assert shlex.split(main_job.split(" && ")[-1]) == ["platoon", "train", "examples/real-model/train.yaml"]
    test = (ROOT / "tests" / "examples" / "test_real_model.py").read_text()
    assert '"examples/real-model/train.yaml"' in test
    config = (ROOT / "examples" / "real-model" / "train.yaml").read_text()
    assert "model_name: smollm2-135m" in config and "at_start: true" in config


@pytest.mark.slow
@pytest.mark.torch
def test_the_tiny_check_runs(env, tmp_path):
    tiny = blocks("Set up")[1].strip()
    last = shlex.split(tiny)
    assert last[0] == ".venv/bin/platoon"
    done = platoon([*last[1:], "train.max_training_steps=2", "train.save_every=0"], ROOT, env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained 2 steps in" in done.stdout and "reward  first 2 steps" in done.stdout


def test_the_export_and_eval_commands_name_the_main_jobs_run():
    export, evaluate = blocks("Set up")[2].strip().splitlines()
    run_dir = "~/platoon-runs/real-model/sums"  # the site's default runs, the config's experiment and trial
    assert shlex.split(export) == [".venv/bin/platoon", "export", run_dir, "--out", "smollm2-sums"]
    assert shlex.split(evaluate)[1:] == [
        "eval",
        "examples/real-model/train.yaml",
        f"eval.model_path={run_dir}",
    ]
    config = (ROOT / "examples" / "real-model" / "train.yaml").read_text()
    assert "experiment_name: real-model" in config and "trial_name: sums" in config


@pytest.mark.slow
def test_the_quickstart_commands_run(env):
    [block] = blocks("A first run")
    lines = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert lines[0] == "cd examples/quickstart"
    cwd = ROOT / "examples" / "quickstart"
    ran = []
    for line in lines[1:]:
        assignment, program, *argv = shlex.split(line)
        assert (assignment, program) == ("PYTHONPATH=.", "platoon")
        done = platoon(argv, cwd, env | {"PYTHONPATH": "."})
        ran.append(argv[0])
        if argv[0] == "train":
            # Training needs a service: without one the command says, in one line, what to set.
            assert done.returncode == 1
            assert "TINKER_API_KEY" in done.stderr and "train.backend=local" in done.stderr
            assert "Traceback" not in done.stderr
        else:
            assert done.returncode == 0, done.stderr[-3000:]
    assert ran == ["rollout", "eval", "train"]

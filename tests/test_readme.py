"""What the README's commands are: the test command is exactly what CI runs, the main job is the
real-model example, the export and eval name its run. The blocks themselves run in order, as a
reader types them, in tests/docs/test_doc_blocks.py (README.md is one of its pages)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def blocks(section: str) -> list[str]:
    """The code blocks of a `## section` of the README."""
    body = README.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```\w*\n(.*?)```", body, flags=re.S)


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

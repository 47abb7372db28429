"""The command line: help, version, one-line errors and exit codes."""

import json
import subprocess
import sys

import pytest

from platoon.cli import main


def run(*argv, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "platoon", *argv], capture_output=True, text=True, timeout=60, **kwargs
    )


def test_help_lists_every_command():
    done = run("--help")
    assert done.returncode == 0
    for command in (
        "run",
        "train",
        "eval",
        "rollout",
        "prepare",
        "worker",
        "harness",
        "events",
        "serve",
        "env",
        "version",
    ):
        assert command in done.stdout


def test_version_names_platoon_and_python(capsys):
    assert main(["version"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("platoon")
    assert "python" in out


def test_a_bad_config_is_one_line_per_problem_and_exit_code_2(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(
        "environments:\n  - {name: x, env: platoon-number-search@1, harness: platoon-react,"
        " harness_options: {num_retries: 3}}\ntrain: {model_name: m, renderer_name: r, batch_sise: 2}\n"
    )
    assert main(["eval", str(config)]) == 2
    err = capsys.readouterr().err
    assert "train.batch_sise: unknown key (did you mean train.batch_size?)" in err
    assert "Traceback" not in err


def test_a_missing_config_file_is_a_clear_error(tmp_path, capsys):
    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert "nope.yaml" in err
    assert err.count("\n") <= 3


def test_a_bad_override_names_its_path(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("environments: []\n")
    assert main(["eval", str(config), "environments.3.harness=x"]) == 2
    assert "environments.3" in capsys.readouterr().err


def test_debug_shows_the_traceback(tmp_path):
    done = run("--debug", "events", str(tmp_path))
    assert done.returncode != 0
    assert "Traceback" in done.stderr


def test_errors_without_debug_are_one_line(tmp_path):
    done = run("events", str(tmp_path))
    assert done.returncode == 1
    assert done.stderr.startswith("platoon: error: no event log at")
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_json_logs(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(
        "environments:\n  - {name: n, env: platoon-number-search@1, harness: platoon-react}\n"
        "stats: {experiment_name: e, trial_name: t}\n"
    )
    site = tmp_path / "site.yaml"
    site.write_text(f"runs: {tmp_path / 'runs'}\n")
    done = run(
        "--log-format",
        "json",
        "rollout",
        str(config),
        "--task",
        "train:0",
        "--policy",
        "scripted:nonexistent_module:f",
        env={"PLATOON_SITE": str(site), "PATH": ""},
    )
    assert done.returncode == 1
    lines = [line for line in done.stderr.splitlines() if line.startswith("{")]
    for line in lines:
        assert json.loads(line)["level"]


def test_no_command_prints_help():
    done = run()
    assert done.returncode == 2
    assert "usage: platoon" in done.stdout


def test_a_native_crash_prints_where_python_was_not_only_aborted():
    """A command that dies in native code (here SIGABRT) leaves every thread's Python stack on
    stderr, for the bug report."""
    code = (
        "import os\n"
        "from platoon.cli import _report_crashes\n"
        "_report_crashes()\n"
        "def crash():\n"
        "    os.abort()\n"
        "crash()\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "Fatal Python error: Aborted" in result.stderr
    assert 'File "<string>", line 5 in crash' in result.stderr

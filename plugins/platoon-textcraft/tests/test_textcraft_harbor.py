import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from platoon_textcraft import harbor_cli
from platoon_textcraft.env import TextCraftSynth
from platoon_textcraft.harbor_export import ExportError, export_tasks, main, write_task


@pytest.fixture
def sandbox(tmp_path):
    """A stand-in for the task container: `textcraft` and `python3` on PATH, /app and /logs as
    temporary directories (TEXTCRAFT_STATE, TEXTCRAFT_LOGS_DIR)."""

    def make(task_dir: Path) -> dict[str, str]:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "python3").unlink(missing_ok=True)
        (bin_dir / "python3").symlink_to(sys.executable)
        shim = bin_dir / "textcraft"
        shim.write_text(f'#!/bin/sh\nexec python3 {task_dir}/environment/textcraft.py "$@"\n')
        shim.chmod(0o755)
        return {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "TEXTCRAFT_WORLD": str(task_dir / "environment" / "world.json"),
            "TEXTCRAFT_STATE": str(tmp_path / "app" / "inventory.json"),
            "TEXTCRAFT_LOGS_DIR": str(tmp_path / "logs"),
            "HOME": str(tmp_path),
        }

    return make


def bash(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)


def reward(env: dict[str, str]) -> str:
    return (Path(env["TEXTCRAFT_LOGS_DIR"]) / "verifier" / "reward.txt").read_text()


def test_export_writes_valid_harbor_task_dirs(tmp_path):
    written = export_tasks(tmp_path / "out", TextCraftSynth, "test-depth3", n=3, start=4)
    assert [p.name for p in written] == [f"textcraft-test-depth3-{i}" for i in (4, 5, 6)]
    for task in written:
        config = tomllib.loads((task / "task.toml").read_text())
        assert config["metadata"]["difficulty"] == 3
        assert config["task"]["name"] == f"platoon/textcraft-{task.name.removeprefix('textcraft-')}"
        assert config["environment"]["network_mode"] == "no-network"
        assert config["verifier"]["timeout_sec"] > 0
        assert config["metadata"]["target"] in (task / "instruction.md").read_text()
        for name in ("environment/Dockerfile", "environment/textcraft.py", "environment/crafting.py"):
            assert (task / name).is_file()
        assert os.access(task / "tests" / "test.sh", os.X_OK)
        assert os.access(task / "solution" / "solve.sh", os.X_OK)
        world = json.loads((task / "tests" / "world.json").read_text())
        assert world == json.loads((task / "environment" / "world.json").read_text())
        assert world["task"]["target"] == config["metadata"]["target"]
    assert not list((tmp_path / "out").glob(".*"))  # no leftover temporary directories


def test_solution_passes_and_doing_nothing_fails(tmp_path, sandbox):
    (task,) = export_tasks(tmp_path / "out", split="test-depth4", n=1)
    env = sandbox(task)
    assert bash(task / "tests" / "test.sh", env).returncode == 0
    assert reward(env) == "0\n"  # no state file yet

    solved = bash(task / "solution" / "solve.sh", env)
    assert solved.returncode == 0, solved.stderr
    assert bash(task / "tests" / "test.sh", env).returncode == 0
    assert reward(env) == "1\n"


def test_verifier_replays_actions_and_ignores_a_forged_inventory(tmp_path, sandbox):
    (task,) = export_tasks(tmp_path / "out", split="test-depth2", n=1)
    env = sandbox(task)
    target = json.loads((task / "tests" / "world.json").read_text())["task"]["target"]
    state = Path(env["TEXTCRAFT_STATE"])
    state.parent.mkdir()
    state.write_text(json.dumps({"actions": [], "inventory": {target: 99}}))
    bash(task / "tests" / "test.sh", env)
    assert reward(env) == "0\n"
    state.write_text(json.dumps({"actions": [["craft", target, 1]]}))  # not makeable from nothing
    bash(task / "tests" / "test.sh", env)
    assert reward(env) == "0\n"
    state.write_text("not json")
    bash(task / "tests" / "test.sh", env)
    assert reward(env) == "0\n"


def test_cli_commands_and_errors(tmp_path, capsys):
    (task,) = export_tasks(tmp_path / "out", split="test-depth1", n=1)
    world = json.loads((task / "environment" / "world.json").read_text())
    target, base = world["task"]["target"], world["base_items"][0]
    files = ["--world", str(task / "environment" / "world.json"), "--state", str(tmp_path / "state.json")]

    def run(*args):
        code = harbor_cli.main([*files, *args])
        out, err = capsys.readouterr()
        return code, out.strip(), err.strip()

    assert run("goal")[1].startswith(f"Craft {world['task']['count']} {target}.")
    assert run("inventory") == (0, "The inventory is empty.", "")
    assert run("info", *base.split())[1] == f"{base} is a base item: fetch it with `textcraft get N {base}`."
    assert run("info", *target.split())[1].startswith(f"{target} is crafted from:")
    code, _, err = run("craft", target)
    assert code == 1 and err.startswith(f"Cannot craft 1 {target}: missing")
    assert run("get", "2", *base.split()) == (0, f"Got 2 {base}; you now have 2 {base}.", "")
    assert run("get", "nothing")[2] == "Unknown item 'nothing'."
    assert run("craft", base)[2] == f"{base} is a base item: fetch it with `textcraft get` instead."
    assert json.loads((tmp_path / "state.json").read_text()) == {
        "actions": [["get", base, 2]],
        "inventory": {base: 2},
    }
    assert run("grade") == (0, "0", "")


def test_export_refuses_to_overwrite_and_bad_requests(tmp_path):
    out = tmp_path / "out"
    (task,) = export_tasks(out, split="test", n=1)
    (task / "marker").write_text("keep")
    with pytest.raises(ExportError, match="already exists"):
        export_tasks(out, split="test", n=1)
    assert (task / "marker").read_text() == "keep"
    export_tasks(out, split="test", n=1, force=True)
    assert not (task / "marker").exists()
    with pytest.raises(ExportError, match="unknown TextCraft split"):
        export_tasks(out, split="nope", n=1)
    with pytest.raises(ExportError, match="not all in split"):
        export_tasks(out, split="test", n=10**6)
    with pytest.raises(ExportError, match="exactly one of"):
        write_task(tmp_path / "bad", {"target": "x"})


def test_command_line_entry_point(tmp_path, capsys):
    assert (
        main(
            [
                str(tmp_path / "d"),
                "--env",
                "textcraft-synth",
                "--split",
                "test-depth7",
                "--n",
                "2",
                "--seed",
                "3",
            ]
        )
        == 0
    )
    assert "wrote 2 Harbor tasks" in capsys.readouterr().out
    config = tomllib.loads((tmp_path / "d" / "textcraft-test-depth7-1" / "task.toml").read_text())
    assert config["metadata"]["difficulty"] == 7
    assert main([str(tmp_path / "d"), "--split", "test-depth9"]) == 1
    assert "unknown TextCraft split" in capsys.readouterr().err

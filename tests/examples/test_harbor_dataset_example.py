"""examples/harbor-dataset on CPU: its README's commands, with the scripted policies standing in
for a model and bubblewrap for the container runtime (`platoon train` comes with the trainer)."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import pytest

from platoon.cli import main
from platoon.envs.harbor import load_dataset

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "harbor-dataset"
pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(f"runs: {tmp_path}/runs\ncache: {tmp_path}/cache\nprovider: bwrap\n")
    monkeypatch.setenv("PLATOON_SITE", str(path))
    return tmp_path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_dataset_has_topics_tests_and_solutions():
    dataset = load_dataset(
        EXAMPLE / "dataset", index=[{"metadata": ["topic"]}], holdout={"fraction": 0.25, "group_by": "topic"}
    )
    assert len(dataset.tasks) == 8 and len(dataset.train) == 6  # train.yaml's batch_size: all six
    assert {r["topic"] for r in dataset.records.values()} == {"csv", "text", "files"}
    assert {dataset.records[n]["topic"] for n in dataset.eval} == {"files"}
    for task in dataset.tasks.values():
        assert task.solution_dir is not None and task.dockerfile is not None
        assert (
            tomllib.loads(Path(task.path, "task.toml").read_text())["environment"]["network_mode"]
            == "no-network"
        )


def test_rollout_solves_a_training_task(site, capsys):
    code, out, err = run(
        capsys,
        "rollout",
        str(EXAMPLE / "train.yaml"),
        "--task",
        "train:csv-top-city",
        "--policy",
        "scripted:scripted_agent:solve",
    )
    assert code == 0, err
    assert "task data-questions train:csv-top-city" in out and "harness platoon-bash" in out
    assert "tool bash(" in out and "-> [exit code 0]" in out
    assert "reward: 1  {'answered': 1.0}" in out


@pytest.mark.slow
def test_prepare_then_eval_on_the_held_out_topic(site, capsys):
    code, out, _ = run(capsys, "prepare", str(EXAMPLE / "train.yaml"))
    assert code == 0 and "built: 8 layer" in out
    assert (
        "held out as the eval split, 2 of 8 tasks (topic: files):\n    files-count-py, files-largest" in out
    )

    code, out, err = run(
        capsys, "eval", str(EXAMPLE / "train.yaml"), "--policy", "scripted:scripted_agent:solve"
    )
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["episodes"] == 2 and summary["reward_mean"] == 1.0 and summary["failures"] == {}


def test_a_wrong_answer_gets_reward_0(site, capsys):
    code, out, err = run(
        capsys,
        "eval",
        str(EXAMPLE / "train.yaml"),
        "--split",
        "train",
        "--policy",
        "scripted:scripted_agent:wrong",
    )
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["episodes"] == 6 and summary["reward_mean"] == 0.0
    report = json.loads((site / "runs" / "harbor-dataset" / "qwen3-4b-eval" / "eval.json").read_text())
    assert report["episodes"] == 6

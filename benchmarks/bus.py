"""Events/s from publish to delivery through the bus, next to a raw anyio memory stream.

Run: python benchmarks/bus.py [--events N] [--backend asyncio|trio]
"""

from __future__ import annotations

import argparse
import time

import anyio

from platoon.bus import Bus
from platoon.bus.events import TrainStepFinished


async def raw_stream(n: int, event, nowait: bool = False) -> float:
    """The floor: one producer, one consumer, no routing. `nowait` skips the checkpoint that
    anyio's `send` takes on every call, as the bus's publish does while a buffer has room."""
    send, receive = anyio.create_memory_object_stream(1024)

    async def consume():
        async with receive:
            async for _ in receive:
                pass

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        async with send:
            for _ in range(n):
                if nowait:
                    try:
                        send.send_nowait(event)
                        continue
                    except anyio.WouldBlock:
                        pass
                await send.send(event)
    return n / (time.perf_counter() - start)


async def through_bus(n: int, subscribers: int, event) -> float:
    count = 0

    def handler(_):
        nonlocal count
        count += 1

    start = time.perf_counter()
    async with Bus(buffer_size=1024) as bus:
        for _ in range(subscribers):
            bus.subscribe(TrainStepFinished, handler)
        for _ in range(n):
            await bus.publish(event)
        await bus.drained()
    elapsed = time.perf_counter() - start
    assert count == n * subscribers
    return n / elapsed


async def main(n: int) -> None:
    event = TrainStepFinished(step=1, metrics={"loss:sum": 1.0})
    raw = await raw_stream(n, event)
    raw_nowait = await raw_stream(n, event, nowait=True)
    one = await through_bus(n, 1, event)
    eight = await through_bus(n, 8, event)
    print(f"raw anyio memory stream : {raw:>12,.0f} events/s")
    print(f"raw, send_nowait first  : {raw_nowait:>12,.0f} events/s")
    print(
        f"bus, 1 subscriber       : {one:>12,.0f} events/s  ({one / raw:.2f} x raw, {one / raw_nowait:.2f} x raw nowait)"
    )
    print(f"bus, 8 subscribers      : {eight:>12,.0f} events/s published, {eight * 8:,.0f} deliveries/s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--backend", default="asyncio", choices=["asyncio", "trio"])
    args = parser.parse_args()
    anyio.run(main, args.events, backend=args.backend)

"""Soak: minutes of continuous in-process episodes, printing the process's RSS over time.

The set-up of `rollout.py`'s `inproc` mode (number search, a scripted binary search, every
model and tool call recorded, the event log written), run batch after batch for `--minutes`.
Every `--every` seconds it prints the resident set size, episodes so far and their rate. A
steady state shows as an RSS that stops growing once the first minutes' caches are full;
`--tracemalloc` adds the ten allocation sites that grew most between the first and last sample.

    python benchmarks/soak.py [--minutes 6] [--every 20] [--concurrency 16] [--tracemalloc]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import anyio
from rollout import ToolCounter, binary_search, env_service, tokenizer_dir

from platoon import system
from platoon.bus import Bus, EventLog
from platoon.gateway import Gateway
from platoon.gateway.renderers import get_renderer
from platoon.programs import EntrySettings, EpisodeRunner, Grader
from platoon.testing.policies import ScriptedSamplerFactory
from platoon.train.evaluate import evaluate, list_tasks


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _size_mb(path: str) -> float:
    return os.path.getsize(path) / 2**20


async def soak(minutes: float, every: float, concurrency: int, trace: bool) -> None:
    tokenizer = system.load_tokenizer(tokenizer_dir("qwen3"))
    if trace:
        tracemalloc.start(10)
    with tempfile.TemporaryDirectory() as run_dir:
        async with env_service("inproc") as service:
            components = [
                service,
                Gateway(
                    renderer=get_renderer("qwen3_instruct", tokenizer),
                    sampler_factory=ScriptedSamplerFactory(tokenizer, binary_search),
                    serve_http=False,
                ),
                EpisodeRunner([EntrySettings(name="ns", harness="bench-inproc", max_steps=12)]),
                Grader(),
                ToolCounter(),
                EventLog(run_dir),
            ]
            async with Bus() as bus, system.running(bus, components):
                tasks = await list_tasks(bus, "ns", "train")
                started = time.perf_counter()
                episodes, next_report, first = 0, 0.0, None
                print(f"{'minute':>7} {'episodes':>9} {'ep/s':>7} {'rss MB':>8}", flush=True)
                while (elapsed := time.perf_counter() - started) < minutes * 60:
                    if elapsed >= next_report:
                        rate = episodes / elapsed if elapsed else 0.0
                        print(f"{elapsed / 60:7.2f} {episodes:9d} {rate:7.1f} {rss_mb():8.1f}", flush=True)
                        if trace and first is None and elapsed > 0:
                            first = tracemalloc.take_snapshot()
                        next_report += every
                    report = await evaluate(
                        bus, tasks[: concurrency * 4], concurrency=concurrency, publish=False
                    )
                    episodes += report.episodes
                elapsed = time.perf_counter() - started
                print(
                    f"{elapsed / 60:7.2f} {episodes:9d} {episodes / elapsed:7.1f} {rss_mb():8.1f}", flush=True
                )
                log_mb = _size_mb(os.path.join(run_dir, "events.msgpack"))
                print(f"event log: {log_mb:.1f} MB for {episodes} episodes", flush=True)
                if trace and first is not None:
                    last = tracemalloc.take_snapshot()
                    print("allocation sites that grew most:")
                    for stat in last.compare_to(first, "lineno")[:10]:
                        print(f"  {stat}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=6.0)
    parser.add_argument("--every", type=float, default=20.0, help="seconds between RSS samples")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tracemalloc", action="store_true")
    args = parser.parse_args()
    anyio.run(soak, args.minutes, args.every, args.concurrency, args.tracemalloc)


if __name__ == "__main__":
    main()

"""Soak: minutes of continuous in-process episodes, printing the process's RSS over time.

The set-up of `rollout.py`'s `inproc` mode (number search, a scripted binary search, every
model and tool call recorded, the event log written), run batch after batch for `--minutes`.
Every `--every` seconds it prints the resident set size, episodes so far and their rate. A
steady state shows as an RSS that stops growing once the first minutes' caches are full;
`--tracemalloc` adds the Python heap to each line (tracemalloc's count, which RSS hides behind
the allocator's free lists) and, at the end, the ten allocation sites that grew most between the
first sample and the last, with `--frames` frames of traceback each (1: cheap, enough to find
the line; more costs much more). The last lines say how much RSS and the heap grew per thousand
episodes over the second half of the soak, past the warm-up.

    python benchmarks/soak.py [--minutes 6] [--every 20] [--concurrency 16] [--tracemalloc [--frames 1]]

Measured (2026-12-04, 2 shared cores): 6 min at concurrency 16, 40,960 episodes: RSS 373.6 MB at
start, 375.0 at 3k episodes, 375.9 from 12k to 41k. 8 min at concurrency 64, 16,896 episodes:
322.4, 325.6 at 4k, 326.4 from 10k to 17k (+0.002 MB per 1000 episodes over the second half).
The early growth is bounded caches filling, which tracemalloc's diff names: the event log's delta
memory (4096 agents' last records), the env service's graded episode ids (10,000). Past them the
heap is flat.
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

from platoon.bus import Bus, EventLog, running
from platoon.gateway import Gateway, GatewayPolicy, GatewaySettings
from platoon.gateway.renderers import get_renderer
from platoon.models.loading import load_tokenizer
from platoon.programs import EntrySettings, EpisodeRunner, Grader
from platoon.testing.policies import ScriptedSamplerFactory
from platoon.train.evaluate import EvalSettings, evaluate, list_tasks


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _size_mb(path: str) -> float:
    return os.path.getsize(path) / 2**20


def heap_mb() -> float:
    return tracemalloc.get_traced_memory()[0] / 2**20 if tracemalloc.is_tracing() else float("nan")


async def soak(minutes: float, every: float, concurrency: int, trace: bool, frames: int = 1) -> None:
    tokenizer = load_tokenizer(tokenizer_dir("qwen3"))
    if trace:
        tracemalloc.start(frames)
    with tempfile.TemporaryDirectory() as run_dir:
        async with env_service("inproc") as service:
            components = [
                service,
                Gateway(
                    GatewayPolicy(
                        get_renderer("qwen3_instruct", tokenizer),
                        ScriptedSamplerFactory(tokenizer, binary_search),
                    ),
                    GatewaySettings(serve_http=False),
                ),
                EpisodeRunner([EntrySettings(name="ns", harness="bench-inproc", max_steps=12)]),
                Grader(),
                ToolCounter(),
                EventLog(run_dir),
            ]
            async with Bus() as bus, running(bus, components):
                tasks = await list_tasks(bus, "ns", "train")
                started = time.perf_counter()
                episodes, next_report, first = 0, 0.0, None
                samples: list[tuple[float, int, float, float]] = []  # (s, episodes, rss, heap)
                heading = f"{'minute':>7} {'episodes':>9} {'ep/s':>7} {'rss MB':>8}"
                print(heading + (f" {'heap MB':>8}" if trace else ""), flush=True)

                def sample(elapsed: float) -> None:
                    rate = episodes / elapsed if elapsed else 0.0
                    samples.append((elapsed, episodes, rss_mb(), heap_mb()))
                    line = f"{elapsed / 60:7.2f} {episodes:9d} {rate:7.1f} {samples[-1][2]:8.1f}"
                    print(line + (f" {samples[-1][3]:8.1f}" if trace else ""), flush=True)

                while (elapsed := time.perf_counter() - started) < minutes * 60:
                    if elapsed >= next_report:
                        sample(elapsed)
                        if trace and first is None and elapsed > 0:
                            first = tracemalloc.take_snapshot()
                        next_report += every
                    report = await evaluate(
                        bus, tasks[: concurrency * 4], EvalSettings(concurrency=concurrency), publish=False
                    )
                    episodes += report.episodes
                sample(time.perf_counter() - started)
                log_mb = _size_mb(os.path.join(run_dir, "events.msgpack"))
                print(f"event log: {log_mb:.1f} MB for {episodes} episodes", flush=True)
                _growth(samples)
                if trace and first is not None:
                    last = tracemalloc.take_snapshot()
                    print("allocation sites that grew most:")
                    for stat in last.compare_to(first, "lineno")[:10]:
                        print(f"  {stat}")


def _growth(samples: list[tuple[float, int, float, float]]) -> None:
    """RSS (and heap) growth per thousand episodes over the second half of the soak."""
    half = [s for s in samples if s[0] >= samples[-1][0] / 2]
    if len(half) < 2 or half[-1][1] == half[0][1]:
        return
    thousands = (half[-1][1] - half[0][1]) / 1000
    rss = (half[-1][2] - half[0][2]) / thousands
    line = f"second half: rss {rss:+.3f} MB per 1000 episodes"
    if half[0][3] == half[0][3]:  # not NaN: tracing
        line += f", heap {(half[-1][3] - half[0][3]) / thousands:+.3f} MB per 1000 episodes"
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=6.0)
    parser.add_argument("--every", type=float, default=20.0, help="seconds between RSS samples")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--frames", type=int, default=1, help="traceback frames tracemalloc keeps")
    args = parser.parse_args()
    anyio.run(soak, args.minutes, args.every, args.concurrency, args.tracemalloc, args.frames)


if __name__ == "__main__":
    main()

"""Sandbox start, exec round trip and teardown per provider, and Harbor episodes/s with
8 sandboxes at once (start, one agent command, grading by the task's tests, stop).

Run: python benchmarks/sandbox.py [--rounds N] [--episodes N] [--concurrency N]
The docker provider runs against podman's API service when podman is installed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import anyio

from platoon.envs.harbor import grade, load_task, sandbox_spec_for
from platoon.sandbox import Sandbox, SandboxError, SandboxSpec, create_sandbox
from platoon.sandbox.fixtures import minimal_rootfs, podman_image, podman_service

CACHE = Path(f"/tmp/platoon-bench-cache-{os.getuid()}")
TEST_SH = """#!/bin/bash
if [ "$(cat /app/answer.txt)" = "42" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""

Factory = Callable[[SandboxSpec], Sandbox]


async def lifecycle(make: Factory, spec: SandboxSpec, rounds: int, execs: int) -> dict[str, float]:
    starts, stops, round_trips = [], [], []
    for _ in range(rounds):
        box = make(spec)
        began = time.perf_counter()
        await box.start()
        starts.append(time.perf_counter() - began)
        for _ in range(execs):
            began = time.perf_counter()
            await box.exec("true")
            round_trips.append(time.perf_counter() - began)
        began = time.perf_counter()
        await box.stop()
        stops.append(time.perf_counter() - began)
    ms = lambda xs: 1000 * statistics.median(xs)  # noqa: E731
    return {"start_ms": ms(starts), "exec_ms": ms(round_trips), "stop_ms": ms(stops)}


def write_task(root: Path) -> Path:
    task = root / "answer-42"
    (task / "tests").mkdir(parents=True)
    (task / "environment").mkdir()
    (task / "task.toml").write_text('schema_version = "1.4"\n[verifier]\ntimeout_sec = 30\n')
    (task / "instruction.md").write_text("Write 42 to /app/answer.txt\n")
    (task / "environment" / "Dockerfile").write_text("FROM debian:bookworm-slim\nWORKDIR /app\n")
    (task / "tests" / "test.sh").write_text(TEST_SH)
    return task


async def episodes(
    make: Factory, overrides: dict, task_dir: Path, count: int, concurrency: int
) -> tuple[float, int]:
    task = load_task(task_dir)
    spec = sandbox_spec_for(task, **overrides)
    limiter = anyio.Semaphore(concurrency)
    rewards: list[float | None] = []

    async def one(i: int) -> None:
        async with limiter, make(spec) as box:
            await box.exec(f"echo {42 if i % 2 == 0 else 41} > answer.txt")
            rewards.append((await grade(box, task)).reward)

    began = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for i in range(count):
            tg.start_soon(one, i)
    elapsed = time.perf_counter() - began
    assert sorted(rewards) == sorted(float(i % 2 == 0) for i in range(count)), rewards
    return count / elapsed, sum(r == 1.0 for r in rewards)


async def main(args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
    rootfs = minimal_rootfs(CACHE / "rootfs")
    providers: list[tuple[str, Factory, dict]] = []
    if shutil.which("bwrap"):
        providers += [
            ("bwrap (host base)", lambda s: create_sandbox(s, "bwrap"), {}),
            ("bwrap (rootfs copy)", lambda s: create_sandbox(s, "bwrap"), {"rootfs": rootfs}),
            (
                "bwrap (rootfs read-only)",
                lambda s: create_sandbox(s, "bwrap", copy_rootfs=False),
                {"rootfs": rootfs},
            ),
        ]
    if shutil.which("podman"):
        try:
            url = stack.enter_context(podman_service(CACHE / "podman"))
            image = podman_image(CACHE / "podman", rootfs)
            ulimits = {"nofile": 20000, "nproc": 1000}
            providers.append(
                (
                    "docker (podman API)",
                    lambda s: create_sandbox(s, "docker", url=url, ulimits=ulimits),
                    {"image": image},
                )
            )
        except SandboxError as exc:
            print(f"docker (podman API): skipped, {exc}")
    for name in ("apptainer", "singularity", "enroot"):
        if not shutil.which(name):
            print(f"{name}: not installed, not measured")
    print(
        f"\n{'provider':26} {'start ms':>9} {'exec ms':>8} {'stop ms':>8} {'episodes/s':>11}  (x{args.concurrency})"
    )
    with tempfile.TemporaryDirectory() as tmp:
        task_dir = write_task(Path(tmp))
        for name, make, overrides in providers:
            spec = SandboxSpec(**{k: str(v) if k == "rootfs" else v for k, v in overrides.items()})
            times = await lifecycle(make, spec, args.rounds, args.execs)
            rate, _ = await episodes(make, overrides, task_dir, args.episodes, args.concurrency)
            print(
                f"{name:26} {times['start_ms']:9.1f} {times['exec_ms']:8.1f} {times['stop_ms']:8.1f} {rate:11.1f}"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="start/stop cycles per provider")
    parser.add_argument("--execs", type=int, default=20, help="exec round trips per cycle")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    with contextlib.ExitStack() as stack:
        asyncio.run(main(parser.parse_args(), stack))

"""Start-up cost of a command: a scripted one-episode rollout of the quickstart, wall time and
where its imports go (by top-level package, from `python -X importtime`).

    python benchmarks/startup.py [--runs N]

The episode itself takes about 0.01 s; everything else is starting Python, importing, loading
the tokenizer and the environment. Each run is a fresh process with a warm file cache.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart"
COMMAND = ["rollout", "train.yaml", "--task", "train:train-41", "--policy", "scripted:scripted:binary_search"]
LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)")


def run(env: dict[str, str], importtime: bool) -> tuple[float, str]:
    argv = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "platoon", *COMMAND]
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=QUICKSTART, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - started, done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site.yaml"
        site.write_text(f"runs: {tmp}/runs\ncache: {tmp}/cache\n")
        env = os.environ | {"PYTHONPATH": ".", "PLATOON_SITE": str(site), "HF_HUB_OFFLINE": "1"}
        run(env, importtime=False)  # warm the file cache
        walls = [run(env, importtime=False)[0] for _ in range(args.runs)]
        _, trace = run(env, importtime=True)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        python = time.perf_counter() - started
    by_package: collections.Counter[str] = collections.Counter()
    for match in LINE.finditer(trace):
        own_us, _, _, name = match.groups()
        by_package[name.split(".")[0]] += int(own_us)
    total = sum(by_package.values()) / 1e6
    print(f"scripted one-episode rollout of the quickstart, {args.runs} runs")
    print(f"  wall      median {statistics.median(walls):.2f} s   min {min(walls):.2f} s")
    print(f"  python    {python:.2f} s to start and exit an empty interpreter")
    print(f"  imports   {total:.2f} s in all; by top-level package:")
    for name, us in by_package.most_common(12):
        print(f"    {name:<24} {us / 1e6:6.2f} s")


if __name__ == "__main__":
    main()

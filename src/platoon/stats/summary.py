"""The few lines `platoon train` ends with: how the reward moved, and where the run is."""

from __future__ import annotations

import importlib.util
import json
import statistics
from collections.abc import Sequence
from pathlib import Path

__all__ = ["sparkline", "train_summary"]

_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 60) -> str:
    """A one-line curve of `values` (averaged into at most `width` columns)."""
    if not values:
        return ""
    if len(values) > width:
        size = len(values) / width  # > 1, so no column is empty
        values = [statistics.fmean(values[int(i * size) : int((i + 1) * size)]) for i in range(width)]
    low, high = min(values), max(values)
    span = high - low
    return "".join(_BARS[0 if span == 0 else round((v - low) / span * (len(_BARS) - 1))] for v in values)


def train_summary(run_dir: Path, seconds: float | None = None) -> str:
    """The end-of-training summary of the run in `run_dir`, from its `metrics.jsonl`."""
    rows = []
    path = run_dir / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a line cut by a kill: the others still tell the story
    rewards = [r["reward/mean"] for r in rows if isinstance(r.get("reward/mean"), int | float)]
    lines = []
    took = f" in {seconds:.0f} s" if seconds is not None else ""
    lines.append(f"trained {len(rows)} step{'s' * (len(rows) != 1)}{took}")
    if rewards:
        n = min(3, len(rewards))
        first, last = sum(rewards[:n]) / n, sum(rewards[-n:]) / n
        span = f"first {n} steps {first:.3f}, last {n} steps {last:.3f}"
        lines.append(f"reward  {span}  ({rewards[0]:.2f} → {rewards[-1]:.2f})")
        lines.append(f"        {sparkline(rewards)}  {min(rewards):.2f}–{max(rewards):.2f}")
    else:
        lines.append("reward  no step was graded (see the step lines above)")
    evals = sorted((run_dir / "evals").glob("step-*.json")) if (run_dir / "evals").is_dir() else []
    for path in evals[:1] + evals[-1:] if len(evals) > 1 else evals:
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        mean = report.get("reward_mean")
        passes = report.get("pass_at_k") or {}
        shown = f"reward {mean:.3f}" if isinstance(mean, int | float) else "reward n/a"
        if "1" in passes:
            shown += f", pass@1 {passes['1']:.3f}"
        lines.append(f"eval    step {int(path.stem.removeprefix('step-'))}: {shown}")
    lines.append(f"run     {run_dir}")
    if importlib.util.find_spec("platoon.visualization") is not None:
        lines.append(f"view    platoon view {run_dir}")
    else:
        lines.append(f"events  platoon events {run_dir}")
    return "\n".join(lines)

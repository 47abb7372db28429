"""Recorded episodes for the SFT tests: evaluations of number search (0..15) played by scripted
policies, whose event logs hold the exact tokens of every call, as any run's do.

`bisect` is the scripted expert (`examples/number-search/bisect_policy.py`): binary search as
Qwen3-style tool calls, several turns per episode, every episode solved (reward 1). `babble`
answers with text and no tool call, so its episodes end after one turn with reward 0.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "number-search"))

from bisect_policy import bisect

from platoon.api import evaluate
from platoon.config import validate_config

__all__ = ["babble", "bisect", "number_search", "record"]


def babble(messages: list[dict]) -> str:
    """A policy that never calls the tool: its episodes score 0."""
    return "zzz qqq xxx"


def number_search(*, max_steps: int = 6) -> dict:
    return {
        "name": "numbers",
        "env": "platoon-number-search@1",
        "harness": "platoon-react",
        "service_kwargs": {"options": {"hi": 15, "train_size": 64, "test_size": 16}},
        "workflow_config": {
            "rollout_config": {"max_steps": max_steps, "inference_params": {"max_completion_tokens": 40}}
        },
    }


def record(run_dir: Path, policy: str, *, tasks: int = 16, model_name: str | None = None) -> Path:
    """Play `tasks` training tasks with the scripted `policy` (`bisect` or `babble`, by name) and
    return the run directory holding their event log."""
    config = validate_config(
        {
            "environments": [number_search()],
            "eval": {
                "max_tasks": tasks,
                "concurrency": 4,
                "split": "train",
                **({"model_name": model_name} if model_name else {}),
            },
            "stats": {"experiment_name": "recorded", "trial_name": run_dir.name},
        }
    )
    anyio.run(lambda: evaluate(config, run_dir, policy=f"scripted:recordings:{policy}"))
    return run_dir

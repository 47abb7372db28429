"""A multi-step task's reward, from its steps' verifier results, as Harbor derives it.

`mean` (the default) averages each key over the steps that have a verifier result, a key a step
did not report counting as 0; `final` takes the last step's result as it is. A step whose
`min_reward` is not met ends the task: the steps after it never run and do not count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

__all__ = ["combine_steps", "min_reward_failure"]


def combine_steps(
    strategy: Literal["mean", "final"] | None, results: Sequence[Mapping[str, float] | None]
) -> dict[str, float] | None:
    """The task's rewards from its steps' (in order; None: the step has no verifier result)."""
    if not results:
        return None
    if strategy == "final":
        last = results[-1]
        return dict(last) if last else None
    valid = [r for r in results if r]
    if not valid:
        return None
    keys = sorted({key for rewards in valid for key in rewards})
    return {key: sum(r.get(key, 0.0) for r in valid) / len(valid) for key in keys}


def min_reward_failure(
    rewards: Mapping[str, float] | None, min_reward: float | Mapping[str, float] | None
) -> str | None:
    """Why a step's rewards fail its `min_reward` (a number gates `reward`; a table gates each
    key, a missing one failing), or None when they pass or there is no threshold."""
    if min_reward is None:
        return None
    thresholds = {"reward": float(min_reward)} if isinstance(min_reward, int | float) else min_reward
    for key, threshold in thresholds.items():
        value = (rewards or {}).get(key, float("-inf"))
        if value < threshold:
            return f"{key}={value:g} is below its min_reward {threshold:g}"
    return None

"""Per-turn credit learns faster than outcome credit where each turn is paid on its own.

`turns.VowelTurns` pays each of four answers its vowel share as it comes. Outcome credit gives
every answer the episode's advantage, so each turn's signal carries the other three turns'
noise; per-turn credit (`turn_discount: 0`) gives each answer its own reward against the group's
answers at the same turn. Same model, seed, steps and learning rate: only the credit differs.
"""

import json

import anyio
import pytest
from turns import turns_config

from platoon.config import validate_config
from platoon.train.loop import train

pytestmark = pytest.mark.torch

STEPS = 10


def rewards(site, tiny_model, credit, **workflow):
    import turns  # noqa: F401 - registers the harness

    config = validate_config(turns_config(tiny_model, STEPS, credit=credit, **workflow))
    run_dir = site / credit
    anyio.run(lambda: train(config, run_dir=run_dir, console=False))
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == STEPS
    return [m["reward/mean"] for m in metrics], metrics


def test_per_turn_credit_learns_faster_than_outcome_credit(site, tiny_model):
    per_turn, metrics = rewards(site, tiny_model, "per_turn", turn_discount=0.0)
    outcome, _ = rewards(site, tiny_model, "outcome")
    start = (sum(per_turn[:2]) + sum(outcome[:2])) / 4
    late_turn, late_outcome = sum(per_turn[-3:]) / 3, sum(outcome[-3:]) / 3
    assert late_turn > start + 0.2, (per_turn, outcome)
    assert late_turn > late_outcome + 0.1, (per_turn, outcome)
    # four calls per episode merge into one datum; 2 tasks x 8 rollouts
    assert metrics[0]["train/datums"] == 16
    assert metrics[0]["credit/calls"] == 64

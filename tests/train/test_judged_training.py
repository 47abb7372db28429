"""A config trains with a model judge, weighted reward rules and a KL penalty, end to end: the
embedded backend's tiny model is the policy and, frozen at its base weights, the judge (reached
as a Tinker sampling client on the run's own training service); the reference is the base model.

The tiny model judges at random, so some replies hold no score and are retried; an episode whose
judge never answers a score is not graded (never a 0). What must hold is the wiring: the judge's
calls are recorded with kind `judge` and their exact tokens and are never trained, each part of
the reward is in the metrics and the episode record, the judge's reasoning is in `notes`, and
`kl/mean` is reported every step.
"""

import json
import math

import anyio
import pytest
from learnable import learn_config

from platoon.api import train
from platoon.bus import read_events
from platoon.bus.events import EpisodeGraded, ModelCallFinished
from platoon.config import validate_config

pytestmark = pytest.mark.torch


@pytest.mark.slow
def test_training_with_a_tiny_model_judge_weighted_rules_and_kl(site, tiny_model):
    import learnable  # noqa: F401 - registers the harness

    raw = learn_config(tiny_model, steps=2, kl={"coefficient": 0.05}, batch_size=2)
    raw["environments"][0] |= {
        "judge": {
            "backend": "tinker",
            "rubric": "Rate the answer {final_answer} to {task}.",
            "score": {"number": [0, 9]},
            "max_tokens": 12,
            "retries": 5,
        },
        "reward": {
            "rules": [
                {"rule": "env", "weight": 1.0},
                {"rule": "judge", "weight": 0.1},
                {"rule": "length_penalty", "max_tokens": 4, "per_token": -0.01},
            ]
        },
    }
    config = validate_config(raw)
    run_dir = site / "run"
    anyio.run(lambda: train(config, run_dir=run_dir, console=False))

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2
    # before the first update the policy is the reference: no divergence; after it, some
    assert abs(metrics[0]["kl/mean"]) < 1e-3 and metrics[1]["kl/max"] > 0
    for step in metrics:
        assert math.isfinite(step["kl/mean"]) and step["kl/coefficient"] == 0.05
        for part in ("env", "rule/env", "rule/judge", "rule/length_penalty"):
            assert f"reward/{part}/mean" in step, sorted(step)
        assert step["train/datums"] <= 16  # policy calls only: 2 tasks x 8 rollouts, one call each

    events = list(read_events(run_dir))
    judge_calls = [e for e in events if isinstance(e, ModelCallFinished) and e.kind == "judge"]
    policy_calls = [e for e in events if isinstance(e, ModelCallFinished) and e.kind == "policy"]
    assert len(policy_calls) == 32
    assert len(judge_calls) >= 16  # one per graded episode at least, more where retried
    assert all(c.agent_id == "judge" and c.prompt_tokens and c.completion_tokens for c in judge_calls)
    graded = [e for e in events if isinstance(e, EpisodeGraded)]
    scored = [g for g in graded if g.reward is not None]
    assert scored, [g.reason for g in graded]
    for g in scored:
        parts = g.rewards
        expected = parts["rule/env"] + 0.1 * parts["rule/judge"] + parts["rule/length_penalty"]
        assert g.reward == pytest.approx(expected)
        assert 0.0 <= parts["rule/judge"] <= 1.0 and g.notes["judge"]
    for g in graded:
        if g.reward is None:
            assert "the judge gave no score" in g.reason
    assert all(m["credit/calls"] <= 16 for m in metrics)  # judge calls are not counted as trainable

"""The end-to-end proof: a tiny random-init model, trained through the real tinker SDK on the
embedded backend, raises its mean reward on an environment it can learn.

If tokens, credit, datums, the loss or the sampler refresh were wrong, the reward would not
move: this is the test that says the whole loop is right.
"""

import json

import anyio
import pytest
from learnable import learn_config

from platoon.config import validate_config
from platoon.train.loop import train

pytestmark = pytest.mark.torch


def test_mean_reward_rises_on_the_embedded_backend(site, tiny_model):
    import learnable  # noqa: F401 - registers the harness

    config = validate_config(learn_config(tiny_model, steps=14))
    run_dir = site / "run"
    anyio.run(lambda: train(config, run_dir=run_dir, console=False))
    rewards = [
        json.loads(line)["reward/mean"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert len(rewards) == 14
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.25, rewards
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics[0]["train/datums"] == 32  # 4 tasks x 8 rollouts, one call each: one datum per agent
    assert metrics[-1]["policy/version"] >= 10

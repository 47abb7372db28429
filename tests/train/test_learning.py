"""The end-to-end proof: a tiny random-init model, trained through the real tinker SDK on the
embedded backend, raises its mean reward on an environment it can learn.

If tokens, credit, datums, the loss or the sampler refresh were wrong, the reward would not
move: this is the test that says the whole loop is right.
"""

import json

import anyio
import pytest
from learnable import learn_config

from platoon.api import train
from platoon.bus import read_events
from platoon.bus.events import EpisodeRequested, ModelCallFinished
from platoon.config import validate_config

pytestmark = pytest.mark.torch


@pytest.mark.learning
@pytest.mark.slow
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


@pytest.mark.learning
@pytest.mark.slow
def test_a_run_with_the_same_seed_samples_and_trains_the_same(site, tiny_model):
    """The run's seed decides every sample (the gateway seeds each call from its episode's seed),
    so a rerun draws the same completions, grades them the same and trains the same weights."""
    import learnable  # noqa: F401 - registers the harness

    def sampled(seed: int, name: str) -> tuple[list[float], list[tuple[int, list[int]]]]:
        config = validate_config(learn_config(tiny_model, steps=3, seed=seed))
        run_dir = site / name
        anyio.run(lambda: train(config, run_dir=run_dir, console=False))
        rewards = [
            json.loads(line)["reward/mean"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        ]
        events = list(read_events(run_dir))
        seeds = {e.episode_id: e.seed for e in events if isinstance(e, EpisodeRequested)}
        calls = [
            (seeds[e.episode_id], list(e.completion_tokens))
            for e in events
            if isinstance(e, ModelCallFinished)
        ]
        return rewards, sorted(calls)

    first = sampled(1, "first")
    assert len(first[1]) == 3 * 32
    again = sampled(1, "again")
    assert again[1] == first[1]
    assert again[0] == pytest.approx(first[0], rel=1e-12)  # summed in the order episodes finished
    other = sampled(2, "other")
    assert [tokens for _, tokens in other[1]] != [tokens for _, tokens in first[1]]

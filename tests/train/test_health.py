"""The learning signal's health per step, from the sampler's recorded logprobs and the trainer's
of the same tokens: mismatch, importance ratios, what the loss clipped, entropy, datum sizes."""

import math

import pytest

from platoon.bus.events import Datum
from platoon.train.health import clipped, health_metrics


def datum(sampler: list[float], advantage: float = 1.0, version: int = 0) -> Datum:
    n = len(sampler)
    return Datum(
        model_input=list(range(n + 1)),
        target_tokens=list(range(1, n + 2)),
        logprobs=[0.0, *sampler],
        advantages=[0.0] + [advantage] * n,
        weights=[0.0] + [1.0] * n,
        policy_version=version,
        num_trained_tokens=n,
    )


def test_mismatch_ratios_and_entropy_of_a_step():
    fresh = datum([-1.0, -2.0])
    stale = datum([-1.0], version=0)
    metrics = health_metrics(
        [fresh, stale], [[-9.0, -1.0, -2.5], [-9.0, -0.5]], version=0, loss_fn="importance_sampling"
    )
    deltas = [0.0, -0.5, 0.5]
    assert metrics["mismatch/mean_abs"] == pytest.approx(1 / 3)
    assert metrics["mismatch/max_abs"] == 0.5
    assert metrics["mismatch/kl"] == pytest.approx(sum(math.exp(d) - 1 - d for d in deltas) / 3)
    assert metrics["mismatch/tokens"] == 3
    assert metrics["ratio/max"] == pytest.approx(math.exp(0.5))
    assert metrics["ratio/min"] == pytest.approx(math.exp(-0.5))
    assert metrics["ratio/clipped_fraction"] == 0.0  # importance_sampling clips nothing
    assert metrics["entropy/mean"] == pytest.approx(4 / 3)
    assert metrics["train/tokens_per_datum"] == 2.5
    assert metrics["train/trained_tokens_per_datum"] == 1.5


def test_mismatch_counts_only_datums_of_the_weights_the_trainer_holds():
    """A stale datum's tokens also differ by the updates since: they count in the ratios only."""
    metrics = health_metrics([datum([-1.0], version=3)], [[0.0, -2.0]], version=4, loss_fn="ppo")
    assert "mismatch/kl" not in metrics
    assert metrics["ratio/min"] == pytest.approx(math.exp(-1.0))


def test_what_each_loss_clips():
    up, down = math.log(1.5), math.log(0.5)
    # ppo cuts a token's gradient when its ratio passed the bound on the side its advantage pushes
    assert clipped("ppo", [up, down], [1.0, 1.0], 0.8, 1.2) == 1
    assert clipped("ppo", [up, down], [-1.0, -1.0], 0.8, 1.2) == 1
    assert clipped("ppo", [0.0, 0.0], [1.0, -1.0], 0.8, 1.2) == 0
    assert clipped("cispo", [up, down, 0.0], [1.0, 1.0, 1.0], 0.8, 1.2) == 2  # either side
    assert clipped("gspo", [up, up], [1.0, 1.0], 0.8, 1.2) == 2  # one ratio for the datum
    assert clipped("importance_sampling", [up], [1.0], 0.8, 1.2) == 0


def test_the_loss_configs_bounds_are_used():
    d = datum([-1.0])
    wide = health_metrics(
        [d], [[0.0, -0.5]], version=0, loss_fn="ppo", loss_fn_config={"clip_high_threshold": 2}
    )
    narrow = health_metrics([d], [[0.0, -0.5]], version=0, loss_fn="ppo")
    assert (wide["ratio/clipped_fraction"], narrow["ratio/clipped_fraction"]) == (0.0, 1.0)


def test_without_the_trainers_logprobs_only_the_samplers_side():
    metrics = health_metrics([datum([-2.0])], None, version=0, loss_fn="ppo")
    assert metrics == {
        "train/tokens_per_datum": 2.0,
        "train/trained_tokens_per_datum": 1.0,
        "entropy/mean": 2.0,
    }
    assert "ratio/mean" not in health_metrics(
        [datum([-2.0])], [[0.0]], version=0, loss_fn="ppo"
    )  # wrong shape

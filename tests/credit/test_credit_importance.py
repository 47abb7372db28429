"""Truncated and masked importance sampling against the sampler, as pure functions: each token's
weight from the ratio of the trainer's logprob to the sampler's, in the advantage it trains with."""

import math

import pytest

from platoon.bus.events import Datum
from platoon.config.schema import CorrectionConfig
from platoon.credit import CreditError
from platoon.credit.importance import correct, correction_weight

# The sampler's logprobs of 4 sampled tokens, and the trainer's: agreeing, ratio e, e^-2, e^3.
SAMPLER = [-1.0, -1.0, -1.0, -4.0]
TRAINER = [-1.0, 0.0, -3.0, -1.0]


def datum() -> Datum:
    return Datum(
        model_input=[1, 2, 3, 4, 5],
        target_tokens=[2, 3, 4, 5, 6],
        logprobs=[0.0, *SAMPLER],
        advantages=[0.0, 0.5, 0.5, 0.5, 0.5],
        weights=[0.0, 1.0, 1.0, 1.0, 1.0],
        num_trained_tokens=4,
    )


def trainer_row() -> list[float]:
    return [-7.0, *TRAINER]  # a prompt position: the trainer scores it, nothing trains on it


def test_truncate_caps_each_tokens_weight_and_keeps_every_token():
    cfg = CorrectionConfig(mode="truncate", high=2.0)
    (out,), stats = correct([datum()], [trainer_row()], cfg)
    weights = [1.0, 2.0, math.exp(-2.0), 2.0]  # e and e^3 capped at 2
    assert out.advantages == pytest.approx([0.0, *(0.5 * w for w in weights)])
    assert out.logprobs == [0.0, *TRAINER]  # the loss's own ratio is 1 at the step's start
    assert stats["correction/truncated_fraction"] == 0.5
    assert stats["correction/weight_mean"] == pytest.approx(sum(weights) / 4)


def test_mask_drops_the_tokens_whose_ratio_strays_and_weighs_the_others():
    cfg = CorrectionConfig(mode="mask", high=2.0, low=0.5)
    (out,), stats = correct([datum()], [trainer_row()], cfg)
    assert out.advantages == pytest.approx([0.0, 0.5, 0.0, 0.0, 0.0])  # e, e^-2 and e^3 dropped
    assert stats["correction/masked_fraction"] == 0.75


def test_without_mismatch_a_correction_changes_nothing():
    agreeing = [0.0, *SAMPLER]
    for cfg in (CorrectionConfig(mode="truncate"), CorrectionConfig(mode="mask", low=0.5)):
        (out,), stats = correct([datum()], [agreeing], cfg)
        assert out.advantages == datum().advantages
        assert stats["correction/weight_mean"] == 1.0


def test_the_weight_of_one_ratio():
    assert correction_weight(5.0, CorrectionConfig(mode="truncate", high=3.0)) == 3.0
    assert correction_weight(0.1, CorrectionConfig(mode="truncate", high=3.0)) == 0.1
    assert correction_weight(0.1, CorrectionConfig(mode="mask", high=3.0, low=0.2)) == 0.0
    assert correction_weight(2.5, CorrectionConfig(mode="mask", high=3.0, low=0.2)) == 2.5


def test_rows_that_do_not_fit_the_datums_are_refused():
    with pytest.raises(CreditError, match="rows"):
        correct([datum()], [], CorrectionConfig())
    with pytest.raises(CreditError, match="targets"):
        correct([datum()], [[0.0]], CorrectionConfig())


def test_bounds_out_of_order_are_refused():
    with pytest.raises(ValueError, match="below"):
        CorrectionConfig(mode="mask", low=2.0, high=1.0)

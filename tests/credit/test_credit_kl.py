"""The KL penalty: per-token divergence from the reference on sampled tokens only, its mean as
the metric, and the centred penalty folded into the advantages."""

import pytest

from platoon.bus.events import Datum
from platoon.credit import CreditError, kl_penalty, reference_targets


def datum(logprobs, weights, advantage=1.0):
    n = len(logprobs)
    return Datum(
        model_input=list(range(n)),
        target_tokens=list(range(1, n + 1)),
        logprobs=logprobs,
        advantages=[advantage * w for w in weights],
        weights=weights,
        num_trained_tokens=int(sum(weights)),
    )


def test_kl_is_measured_on_sampled_tokens_and_folded_in_centred():
    d1 = datum([0.0, -1.0, -0.5], [0.0, 1.0, 1.0])
    d2 = datum([-2.0, -0.2], [1.0, 1.0], advantage=-1.0)
    ref = [[-9.0, -1.5, -0.5], [-1.0, None]]  # the prompt position is ignored; None: no divergence
    out, stats = kl_penalty([d1, d2], ref, coefficient=0.5)
    kls = [0.5, 0.0, -1.0, 0.0]
    mean = sum(kls) / 4
    assert stats == pytest.approx({"kl/mean": mean, "kl/max": 0.5, "kl/tokens": 4.0, "kl/coefficient": 0.5})
    assert out[0].advantages == pytest.approx([0.0, 1.0 + 0.5 * (mean - 0.5), 1.0 + 0.5 * mean])
    assert out[1].advantages == pytest.approx([-1.0 + 0.5 * (mean + 1.0), -1.0 + 0.5 * mean])
    # with coefficient 0 only the metric is reported; a scale multiplies the penalty
    same, _ = kl_penalty([d1], [ref[0]], 0.0)
    assert same[0].advantages == d1.advantages
    scaled, _ = kl_penalty([d1], [ref[0]], 0.5, scale=0.1)
    assert scaled[0].advantages[1] == pytest.approx(1.0 + 0.05 * (0.25 - 0.5))


def test_reference_rows_line_up_with_targets():
    d = datum([-1.0, -1.0], [1.0, 1.0])
    assert reference_targets(d, [None, -0.3, -0.7]) == [-0.3, -0.7]
    with pytest.raises(CreditError, match="2 reference logprobs for a sequence of 3"):
        reference_targets(d, [None, -0.3])
    with pytest.raises(CreditError, match="1 reference rows for 2 datums"):
        kl_penalty([d, d], [[-1.0, -1.0]], 0.1)

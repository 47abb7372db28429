"""The losses against the documented math: values in numpy, gradients in closed form.

The SDK-facing tests (`test_training.py`, `test_stability.py`) check the same losses through
the real tinker client; these pin down what a datum boundary and a stop-gradient do.
"""

import numpy as np
import pytest
import torch

from platoon.backends.local import losses

pytestmark = pytest.mark.torch


def _inputs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Learner logprobs, sampler logprobs and advantages, in float64 as the references are."""
    rng = np.random.default_rng(seed)
    p = rng.normal(-2.0, 0.5, n)
    return p, p + rng.normal(0.0, 0.3, n), rng.normal(0.0, 1.0, n)


def _grad(
    loss_fn: str, p: np.ndarray, inputs: dict[str, np.ndarray], config, lengths
) -> tuple[float, np.ndarray]:
    p_t = torch.tensor(p, dtype=torch.float64, requires_grad=True)
    x = {k: torch.tensor(v, dtype=torch.float64) for k, v in inputs.items()}
    names = {"target_tokens", *inputs}
    resolved = losses.check_loss(loss_fn, names, config)
    loss = losses.compute_loss(loss_fn, p_t, x, resolved, lengths)
    loss.backward()
    return float(loss.detach()), p_t.grad.numpy()


def test_gspo_is_one_clipped_ratio_per_datum_with_each_tokens_own_gradient():
    lengths = [5, 3, 4]
    p, q, a = _inputs(sum(lengths))
    mask = np.array([0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1], dtype=np.float64)  # datum 1: one token off
    low, high = 0.9, 1.1
    value, grad = _grad(
        "gspo",
        p,
        {"logprobs": q, "advantages": a, "sequence_ratio_mask": mask},
        {"clip_low_threshold": low, "clip_high_threshold": high},
        lengths,
    )
    expected_value, expected_grad, start = 0.0, np.zeros_like(p), 0
    for n in lengths:
        d = slice(start, start + n)
        m = mask[d] != 0
        s = np.exp((p[d] - q[d])[m].mean()) if m.any() else 1.0
        clipped = np.clip(s, low, high)
        expected_value += -np.minimum(s * a[d], clipped * a[d]).sum()
        # d/dp_t of s * exp(p_t - sg(p_t)) is s; the min keeps it where the unclipped term is the smaller.
        expected_grad[d] = np.where(s * a[d] <= clipped * a[d], -s * a[d], 0.0)
        start += n
    assert value == pytest.approx(expected_value, rel=1e-6)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-6, atol=1e-9)


def test_gspo_without_a_mask_takes_the_sampled_tokens_and_a_datum_without_any_has_ratio_one():
    lengths = [4, 3]
    p, q, _ = _inputs(7)
    a = np.array([0, 0, 1.5, 1.5, 0, 0, 0], dtype=np.float64)  # datum 1 has no sampled token
    value, grad = _grad("gspo", p, {"logprobs": q, "advantages": a}, {}, lengths)
    s = np.exp((p[2:4] - q[2:4]).mean())
    assert value == pytest.approx(-(np.minimum(s, np.clip(s, 0.8, 1.2)) * a[2:4]).sum(), rel=1e-6)
    assert grad[4:].tolist() == [0.0, 0.0, 0.0]


def test_stable_reinforce_is_reinforce_with_a_truncated_weight_on_sampled_tokens():
    p, q, a = _inputs(8)
    q[3] = p[3] - 2.0  # ratio e^2 > 2: truncated
    sampled = np.array([0, 0, 1, 1, 1, 1, 1, 1], dtype=np.float64)
    inputs = {"advantages": a, "sampler_logprobs": q, "sampled": sampled, "logprobs": q}
    value, grad = _grad("stable_reinforce", p, inputs, {}, [8])
    weight = np.minimum(np.exp(p - q), 2.0) * sampled
    assert value == pytest.approx(-(weight * p * a).sum(), rel=1e-6)
    np.testing.assert_allclose(grad, -weight * a, rtol=1e-6)
    assert weight[3] == 2.0
    # On-policy it is plain REINFORCE: the gradient is -A on every sampled token.
    _, on_policy = _grad("stable_reinforce", p, inputs | {"sampler_logprobs": p}, {}, [8])
    np.testing.assert_allclose(on_policy, -a * sampled, rtol=1e-6)


def test_custom_and_unknown_losses_are_refused_by_name():
    with pytest.raises(losses.LossError, match="server-side custom losses"):
        losses.check_loss("custom", {"target_tokens"}, {})
    with pytest.raises(losses.LossError, match="unsupported loss_fn 'nope'"):
        losses.check_loss("nope", {"target_tokens"}, {})

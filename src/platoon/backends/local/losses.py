"""The Tinker loss functions as pure tensor math.

Every loss is a sum over tokens (and datums), never a mean: a caller who wants a mean folds
it into the weights or advantages. Inputs arrive flattened: one 1-D tensor per input name,
aligned with `logprobs`, the learner's log-probabilities of the target tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

__all__ = ["LOSSES", "LossError", "LossSpec", "check_loss", "compute_loss"]


class LossError(ValueError):
    """A loss request the server refuses: unknown loss, missing input, unknown option."""


Tensors = Mapping[str, torch.Tensor]


def _cross_entropy(p: torch.Tensor, x: Tensors, cfg: Mapping[str, float]) -> torch.Tensor:
    weights = x.get("weights")
    return -(p if weights is None else p * weights).sum()


def _ratio(p: torch.Tensor, x: Tensors) -> torch.Tensor:
    return torch.exp(p - x["logprobs"])


def _bounds(x: Tensors, cfg: Mapping[str, float]) -> tuple[torch.Tensor | float, torch.Tensor | float]:
    # Per-token thresholds in loss_fn_inputs win over the request-wide config.
    low = x.get("clip_low_threshold", cfg["clip_low_threshold"])
    high = x.get("clip_high_threshold", cfg["clip_high_threshold"])
    return low, high


def _clip(r: torch.Tensor, low: torch.Tensor | float, high: torch.Tensor | float) -> torch.Tensor:
    low_t = torch.as_tensor(low, dtype=r.dtype, device=r.device)
    high_t = torch.as_tensor(high, dtype=r.dtype, device=r.device)
    return torch.minimum(torch.maximum(r, low_t), high_t)


def _importance_sampling(p: torch.Tensor, x: Tensors, cfg: Mapping[str, float]) -> torch.Tensor:
    return -(_ratio(p, x) * x["advantages"]).sum()


def _ppo(p: torch.Tensor, x: Tensors, cfg: Mapping[str, float]) -> torch.Tensor:
    r, a = _ratio(p, x), x["advantages"]
    clipped = _clip(r, *_bounds(x, cfg))
    return -torch.minimum(r * a, clipped * a).sum()


def _cispo(p: torch.Tensor, x: Tensors, cfg: Mapping[str, float]) -> torch.Tensor:
    weight = _clip(_ratio(p, x), *_bounds(x, cfg)).detach()
    return -(weight * p * x["advantages"]).sum()


def _dro(p: torch.Tensor, x: Tensors, cfg: Mapping[str, float]) -> torch.Tensor:
    q, a = x["logprobs"], x["advantages"]
    return -(p * a - 0.5 * cfg["beta"] * (p - q) ** 2).sum()


@dataclass(frozen=True)
class LossSpec:
    """What a loss needs: required and optional per-token inputs, config keys with defaults
    (None means the key is required)."""

    fn: Callable[[torch.Tensor, Tensors, Mapping[str, float]], torch.Tensor]
    required: frozenset[str]
    optional: frozenset[str] = frozenset()
    config: Mapping[str, float | None] = field(default_factory=dict)


_RL = frozenset({"target_tokens", "logprobs", "advantages"})
_CLIP_INPUTS = frozenset({"clip_low_threshold", "clip_high_threshold"})
_CLIP_CONFIG = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}

LOSSES: dict[str, LossSpec] = {
    "cross_entropy": LossSpec(_cross_entropy, frozenset({"target_tokens"}), frozenset({"weights"})),
    "importance_sampling": LossSpec(_importance_sampling, _RL),
    "ppo": LossSpec(_ppo, _RL, _CLIP_INPUTS, _CLIP_CONFIG),
    "cispo": LossSpec(_cispo, _RL, _CLIP_INPUTS, _CLIP_CONFIG),
    "dro": LossSpec(_dro, _RL, config={"beta": None}),
}


def check_loss(loss_fn: str, input_names: set[str], config: Mapping[str, float]) -> dict[str, float]:
    """Validate a request's loss, inputs and config; return the config with defaults filled in."""
    spec = LOSSES.get(loss_fn)
    if spec is None:
        raise LossError(f"unsupported loss_fn {loss_fn!r}; this server supports {', '.join(LOSSES)}")
    missing = spec.required - input_names
    if missing:
        raise LossError(f"loss {loss_fn!r} needs loss_fn_inputs {sorted(missing)}")
    extra = input_names - spec.required - spec.optional
    if extra:
        raise LossError(f"loss {loss_fn!r} does not take loss_fn_inputs {sorted(extra)}")
    unknown = set(config) - set(spec.config)
    if unknown:
        allowed = ", ".join(spec.config) or "none"
        raise LossError(
            f"loss {loss_fn!r} does not take loss_fn_config {sorted(unknown)} (allowed: {allowed})"
        )
    resolved: dict[str, float] = {}
    for key, default in spec.config.items():
        value = config.get(key, default)
        if value is None:
            raise LossError(f"loss {loss_fn!r} needs loss_fn_config {key!r}")
        resolved[key] = float(value)
    return resolved


def compute_loss(
    loss_fn: str, logprobs: torch.Tensor, inputs: Tensors, config: Mapping[str, float]
) -> torch.Tensor:
    """The summed loss of `loss_fn` (already checked with `check_loss`)."""
    return LOSSES[loss_fn].fn(logprobs, inputs, config)

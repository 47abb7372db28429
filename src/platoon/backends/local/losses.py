"""The Tinker loss functions as pure tensor math.

Every loss is a sum over tokens (and datums), never a mean: a caller who wants a mean folds
it into the weights or advantages. Inputs arrive flattened: one 1-D tensor per input name,
aligned with `logprobs`, the learner's log-probabilities of the target tokens, with `lengths`
saying where each datum ends (GSPO's ratio is one per datum).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from platoon.backends.local.specs import not_offered

__all__ = ["DERIVED_INPUTS", "LOSSES", "LossError", "LossSpec", "check_loss", "compute_loss"]


class LossError(ValueError):
    """A loss request the server refuses: unknown loss, missing input, unknown option."""


Tensors = Mapping[str, torch.Tensor]
Config = Mapping[str, float]


def _cross_entropy(p: torch.Tensor, x: Tensors, cfg: Config, lengths: Sequence[int]) -> torch.Tensor:
    weights = x.get("weights")
    return -(p if weights is None else p * weights).sum()


def _ratio(p: torch.Tensor, x: Tensors) -> torch.Tensor:
    return torch.exp(p - x["logprobs"])


def _bounds(x: Tensors, cfg: Config) -> tuple[torch.Tensor | float, torch.Tensor | float]:
    # Per-token thresholds in loss_fn_inputs win over the request-wide config.
    low = x.get("clip_low_threshold", cfg["clip_low_threshold"])
    high = x.get("clip_high_threshold", cfg["clip_high_threshold"])
    return low, high


def _clip(r: torch.Tensor, low: torch.Tensor | float, high: torch.Tensor | float) -> torch.Tensor:
    low_t = torch.as_tensor(low, dtype=r.dtype, device=r.device)
    high_t = torch.as_tensor(high, dtype=r.dtype, device=r.device)
    return torch.minimum(torch.maximum(r, low_t), high_t)


def _importance_sampling(p: torch.Tensor, x: Tensors, cfg: Config, lengths: Sequence[int]) -> torch.Tensor:
    return -(_ratio(p, x) * x["advantages"]).sum()


def _ppo(p: torch.Tensor, x: Tensors, cfg: Config, lengths: Sequence[int]) -> torch.Tensor:
    r, a = _ratio(p, x), x["advantages"]
    clipped = _clip(r, *_bounds(x, cfg))
    return -torch.minimum(r * a, clipped * a).sum()


def _cispo(p: torch.Tensor, x: Tensors, cfg: Config, lengths: Sequence[int]) -> torch.Tensor:
    weight = _clip(_ratio(p, x), *_bounds(x, cfg)).detach()
    return -(weight * p * x["advantages"]).sum()


def _dro(p: torch.Tensor, x: Tensors, cfg: Config, lengths: Sequence[int]) -> torch.Tensor:
    q, a = x["logprobs"], x["advantages"]
    return -(p * a - 0.5 * cfg["beta"] * (p - q) ** 2).sum()


def _gspo(p: torch.Tensor, x: Tensors, cfg: Config, lengths: Sequence[int]) -> torch.Tensor:
    """GSPO-token: each datum's sequence ratio s = exp(mean over its masked tokens of sg(p) - q);
    every token carries s's value with its own logprob's gradient, clipped as PPO clips.

    The mask is `sequence_ratio_mask`; without one, the tokens with a nonzero advantage (the
    sampled ones, as RL datums are built). A datum with no masked token has s = 1.
    """
    q, a = x["logprobs"], x["advantages"]
    mask = (x["sequence_ratio_mask"] if "sequence_ratio_mask" in x else a) != 0
    datum = torch.repeat_interleave(
        torch.arange(len(lengths), device=p.device), torch.as_tensor(list(lengths), device=p.device)
    )
    zeros = torch.zeros(len(lengths), dtype=p.dtype, device=p.device)
    delta = torch.where(mask, p.detach() - q, torch.zeros_like(p))
    count = zeros.index_add(0, datum, mask.to(p.dtype))
    log_s = zeros.index_add(0, datum, delta) / count.clamp(min=1)
    ratio = torch.exp(log_s[datum] + p - p.detach())
    clipped = _clip(ratio, *_bounds(x, cfg))
    return -torch.minimum(ratio * a, clipped * a).sum()


def _stable_reinforce(p: torch.Tensor, x: Tensors, cfg: Config, lengths: Sequence[int]) -> torch.Tensor:
    """REINFORCE over the sampled tokens with a truncated importance weight against the logprobs
    the sampler recorded: -sum sg(min(exp(p - q_rec), c)) * p * A. On-policy it is plain
    REINFORCE; off-policy (async RL, sampler numerics) the weight corrects for the sampler and
    its cap bounds every token's step. `sampler_logprobs` and `sampled` are not sent by the
    client: the server derives them from the datum's provenance spans and its records
    (`stability`), so a client cannot claim a logprob the sampler did not give.
    """
    weight = torch.exp(p - x["sampler_logprobs"]).clamp(max=cfg["clip_high_threshold"]).detach()
    return -(x["sampled"] * weight * p * x["advantages"]).sum()


@dataclass(frozen=True)
class LossSpec:
    """What a loss needs: required and optional per-token inputs, config keys with defaults
    (None means the key is required)."""

    fn: Callable[[torch.Tensor, Tensors, Config, Sequence[int]], torch.Tensor]
    required: frozenset[str]
    optional: frozenset[str] = frozenset()
    config: Mapping[str, float | None] = field(default_factory=dict)


_RL = frozenset({"target_tokens", "logprobs", "advantages"})
DERIVED_INPUTS = frozenset({"sampler_logprobs", "sampled"})  # stable_reinforce's, from provenance
_CLIP_INPUTS = frozenset({"clip_low_threshold", "clip_high_threshold"})
_CLIP_CONFIG = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}

LOSSES: dict[str, LossSpec] = {
    "cross_entropy": LossSpec(_cross_entropy, frozenset({"target_tokens"}), frozenset({"weights"})),
    "importance_sampling": LossSpec(_importance_sampling, _RL),
    "ppo": LossSpec(_ppo, _RL, _CLIP_INPUTS, _CLIP_CONFIG),
    "cispo": LossSpec(_cispo, _RL, _CLIP_INPUTS, _CLIP_CONFIG),
    "dro": LossSpec(_dro, _RL, config={"beta": None}),
    "gspo": LossSpec(_gspo, _RL, _CLIP_INPUTS | {"sequence_ratio_mask"}, _CLIP_CONFIG),
    "stable_reinforce": LossSpec(
        _stable_reinforce,
        frozenset({"target_tokens", "advantages", *DERIVED_INPUTS}),
        frozenset({"logprobs"}),
        {"clip_high_threshold": 2.0},
    ),
}


def check_loss(loss_fn: str, input_names: set[str], config: Config) -> dict[str, float]:
    """Validate a request's loss, inputs and config; return the config with defaults filled in."""
    spec = LOSSES.get(loss_fn)
    if spec is None and loss_fn == "custom":
        raise LossError(
            not_offered(
                "loss_fn 'custom' (server-side custom losses)",
                "TrainingClient.forward_backward_custom runs a custom loss on the client instead",
            )
        )
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
    loss_fn: str, logprobs: torch.Tensor, inputs: Tensors, config: Config, lengths: Sequence[int]
) -> torch.Tensor:
    """The summed loss of `loss_fn` (already checked with `check_loss`) over datums of `lengths`
    tokens laid end to end."""
    return LOSSES[loss_fn].fn(logprobs, inputs, config, lengths)

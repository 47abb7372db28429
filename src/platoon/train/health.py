"""Whether a step's learning signal is sound: the sampler against the trainer, token by token.

Every sampled token of a datum carries the sampler's logprob `q` (recorded when it was drawn);
the trainer's `forward_backward` returns its own logprob `p` of the same token, before the step
changes anything. From the two, over the step's sampled tokens:

- `mismatch/mean_abs`, `mismatch/max_abs`: |p - q| over the tokens of datums sampled by the
  weights the trainer holds (fresh datums; a stale one also differs by the updates since), and
  `mismatch/kl`, the k3 estimate `E_q[r - 1 - log r]` of KL(sampler || trainer), with
  `mismatch/tokens` the tokens it is over. 0 where the two compute alike, bit for bit.
- `ratio/mean|min|max`: the importance ratio `r = exp(p - q)` over every sampled token, and
  `ratio/clipped_fraction`, the share of them whose gradient the loss clips (ppo: r past its
  bound on the side the advantage pushes; cispo: r outside the bounds; gspo: the datum's
  sequence ratio, as ppo; 0 for the losses that do not clip).
- `entropy/mean`: the mean of `-q`, a one-sample estimate of the sampler's per-token entropy
  (exact in expectation at temperature 1; at another temperature, of the model's own
  distribution on tokens drawn from the tempered one).
- `train/tokens_per_datum`, `train/trained_tokens_per_datum`: the mean sequence length a datum
  makes the trainer process, and how many of its tokens train.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from platoon.bus.events import Datum
from platoon.credit.importance import log_ratio

__all__ = ["clipped", "health_metrics"]

_CLIP_DEFAULTS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}


def health_metrics(
    datums: Sequence[Datum],
    trainer: Sequence[Sequence[float]] | None,
    *,
    version: int,
    loss_fn: str,
    loss_fn_config: Mapping[str, object] | None = None,
    sent: Sequence[Datum] | None = None,
) -> dict[str, float]:
    """The step's health metrics (module docstring) for `datums` as the sampler recorded them and
    `trainer`, the trainer's logprob of each of their targets (None when the training service
    gave none: then only what the sampler's side tells). `sent`: the datums as the loss got them,
    when a correction (`platoon.credit.importance`) changed their logprobs and advantages; what
    the loss clipped is measured on those."""
    out: dict[str, float] = {}
    sampled = [(d, i) for d in datums for i, w in enumerate(d.weights) if w]
    if not datums:
        return out
    out["train/tokens_per_datum"] = sum(len(d.model_input) for d in datums) / len(datums)
    out["train/trained_tokens_per_datum"] = len(sampled) / len(datums)
    if sampled:
        out["entropy/mean"] = -math.fsum(d.logprobs[i] for d, i in sampled) / len(sampled)
    if trainer is None or len(trainer) != len(datums) or not sampled:
        return out
    if any(len(row) != len(d.target_tokens) for d, row in zip(datums, trainer, strict=True)):
        return out  # a service that answered another shape: no figure rather than a wrong one
    fresh: list[float] = []
    ratios: list[float] = []
    clips = 0
    low, high = _bounds(loss_fn_config)
    for datum, loss_datum, row in zip(datums, sent or datums, trainer, strict=True):
        where = [i for i, w in enumerate(datum.weights) if w]
        if not where:
            continue
        deltas = [log_ratio(row[i], datum.logprobs[i]) for i in where]
        if datum.policy_version == version:
            fresh += deltas
        ratios += [math.exp(x) for x in deltas]
        seen = [log_ratio(row[i], loss_datum.logprobs[i]) for i in where]
        clips += clipped(loss_fn, seen, [loss_datum.advantages[i] for i in where], low, high)
    out |= {
        "ratio/mean": math.fsum(ratios) / len(ratios),
        "ratio/min": min(ratios),
        "ratio/max": max(ratios),
        "ratio/clipped_fraction": clips / len(ratios),
    }
    if fresh:
        out |= {
            "mismatch/mean_abs": math.fsum(abs(x) for x in fresh) / len(fresh),
            "mismatch/max_abs": max(abs(x) for x in fresh),
            "mismatch/kl": math.fsum(math.expm1(x) - x for x in fresh) / len(fresh),
            "mismatch/tokens": float(len(fresh)),
        }
    return out


def clipped(
    loss_fn: str, deltas: Sequence[float], advantages: Sequence[float], low: float, high: float
) -> int:
    """How many of one datum's sampled tokens (log ratios `deltas`, advantages `advantages`)
    `loss_fn` clips: their gradient is cut (ppo, gspo) or their weight bounded (cispo)."""
    if loss_fn == "gspo":  # one ratio for the datum: the exp of its tokens' mean log ratio
        ratio = math.exp(math.fsum(deltas) / len(deltas))
        return sum(_ppo_clips(ratio, a, low, high) for a in advantages)
    if loss_fn == "ppo":
        return sum(_ppo_clips(math.exp(d), a, low, high) for d, a in zip(deltas, advantages, strict=True))
    if loss_fn == "cispo":
        return sum(not low <= math.exp(d) <= high for d in deltas)
    return 0


def _ppo_clips(ratio: float, advantage: float, low: float, high: float) -> bool:
    """min(r A, clip(r) A) takes the clipped side, whose gradient is 0."""
    return (advantage > 0 and ratio > high) or (advantage < 0 and ratio < low)


def _bounds(config: Mapping[str, object] | None) -> tuple[float, float]:
    values = {**_CLIP_DEFAULTS, **(config or {})}
    low, high = values["clip_low_threshold"], values["clip_high_threshold"]
    return float(low), float(high)  # type: ignore[arg-type]

"""Token-level importance correction against the sampler: truncated (TIS) and masked (MIS).

The sampler that drew a token and the trainer that learns from it compute its probability with
different code (batched decoding, another attention kernel, another precision, older weights when
stale), so the trainer's `p` and the sampler's recorded `q` differ. The gradient of a sampled
token is then off by the ratio `r = exp(p - q)`, which is usually near 1 and sometimes huge. The
corrections weigh each sampled token by `r`, bounded:

- `truncate` (TIS): weight `min(r, high)`; every token trains, none by more than `high`;
- `mask` (MIS): weight `r` where `low <= r <= high`, else 0; the tokens where sampler and trainer
  disagree most do not train at all.

They are applied on the client, so they work the same on hosted Tinker as on the embedded
backend: a forward pass gives the trainer's logprobs `p_old` of the batch as it stands, then each
datum is sent with `logprobs = p_old` and `advantages = w * A`. Any of the ratio losses then
takes a gradient of `w * A * grad p` at the step's start (its own ratio `exp(p - p_old)` is 1
there), which is the corrected estimator; a clipped loss (ppo, cispo) clips against the trainer's
own numbers, as decoupled PPO does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import msgspec

from platoon.bus.events import Datum
from platoon.config.schema import CorrectionConfig
from platoon.credit.exceptions import CreditError

__all__ = ["CORRECTED_LOSSES", "correct", "correction_weight", "log_ratio"]

# The losses whose sampler logprobs are a ratio's denominator, so that a correction can stand in.
CORRECTED_LOSSES = ("importance_sampling", "ppo", "cispo", "gspo")
_MAX_LOG_RATIO = 50.0  # exp of more overflows nothing and says as much


def log_ratio(trainer: float, sampler: float) -> float:
    """log r = p - q, kept finite (a token the trainer finds impossible is r = e^-50, not NaN)."""
    delta = trainer - sampler
    if math.isnan(delta):
        return 0.0
    return max(-_MAX_LOG_RATIO, min(_MAX_LOG_RATIO, delta))


def correction_weight(ratio: float, cfg: CorrectionConfig) -> float:
    """A sampled token's weight for importance ratio `ratio`."""
    if cfg.mode == "truncate":
        return min(ratio, cfg.high)
    return ratio if cfg.low <= ratio <= cfg.high else 0.0


def correct(
    datums: Sequence[Datum], trainer: Sequence[Sequence[float]], cfg: CorrectionConfig
) -> tuple[list[Datum], dict[str, float]]:
    """The datums with the correction in their advantages and the trainer's logprobs as theirs,
    and `correction/weight_mean` with the share of sampled tokens it bounded
    (`correction/truncated_fraction` or `correction/masked_fraction`).

    `trainer[i]` holds the trainer's logprob of each target of `datums[i]` (a forward pass's
    output); positions that were not sampled keep their advantage (0) and logprob.
    """
    if len(trainer) != len(datums):
        raise CreditError(f"{len(trainer)} trainer logprob rows for {len(datums)} datums")
    out: list[Datum] = []
    weights: list[float] = []
    bounded = 0
    for datum, row in zip(datums, trainer, strict=True):
        if len(row) != len(datum.target_tokens):
            raise CreditError(f"{len(row)} trainer logprobs for {len(datum.target_tokens)} targets")
        advantages = list(datum.advantages)
        logprobs = list(datum.logprobs)
        for i, w in enumerate(datum.weights):
            if not w:
                continue
            ratio = math.exp(log_ratio(row[i], datum.logprobs[i]))
            weight = correction_weight(ratio, cfg)
            bounded += weight != ratio
            weights.append(weight)
            advantages[i] *= weight
            logprobs[i] = float(row[i])
        out.append(msgspec.structs.replace(datum, advantages=advantages, logprobs=logprobs))
    n = len(weights)
    stats = {"correction/weight_mean": math.fsum(weights) / n if n else 0.0}
    stats[f"correction/{'truncated' if cfg.mode == 'truncate' else 'masked'}_fraction"] = (
        bounded / n if n else 0.0
    )
    return out, stats

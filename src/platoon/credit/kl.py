"""A KL penalty against a reference policy, folded into the advantages.

For each sampled target token t of a datum, `kl_t = logp_sampler(t) - logp_ref(t)`: a one-sample
estimate of KL(policy || reference) at that token. `kl/mean` is its mean over the batch's sampled
tokens. The penalty adds `coefficient * (kl/mean - kl_t)` to each sampled token's advantage (as the
Tinker cookbook does): tokens the policy likes more than the reference does are pushed down,
those it likes less are pushed up, and the batch's mean advantage is unchanged. `scale` is the
normalisation the advantages already carry (1 / trained tokens under `token_mean`).
"""

import math
from collections.abc import Sequence

import msgspec

from platoon.bus.events import Datum
from platoon.credit.exceptions import CreditError

__all__ = ["kl_penalty", "reference_targets", "token_divergences"]


def reference_targets(datum: Datum, prompt_logprobs: Sequence[float | None]) -> list[float | None]:
    """The reference's logprob of each target of `datum`, from `compute_logprobs` of the datum's
    whole sequence (`model_input + [last target]`, whose entry 0 is None)."""
    n = len(datum.target_tokens)
    if len(prompt_logprobs) != n + 1:
        raise CreditError(f"{len(prompt_logprobs)} reference logprobs for a sequence of {n + 1} tokens")
    return list(prompt_logprobs[1:])


def token_divergences(
    datums: Sequence[Datum], reference: Sequence[Sequence[float | None]], *, of: str = "reference"
) -> tuple[list[list[float]], list[float]]:
    """Per datum, `logp_sampler(t) - logp_ref(t)` at each target (0 where the token was not
    sampled or the reference has no finite logprob), and the sampled tokens' values in order.
    `of` names the reference in errors."""
    if len(reference) != len(datums):
        raise CreditError(f"{len(reference)} {of} rows for {len(datums)} datums")
    per_datum: list[list[float]] = []
    for datum, ref in zip(datums, reference, strict=True):
        if len(ref) != len(datum.target_tokens):
            raise CreditError(f"{len(ref)} {of} logprobs for {len(datum.target_tokens)} targets")
        per_datum.append(
            [
                (lp - r) if (w and r is not None and math.isfinite(r)) else 0.0
                for lp, r, w in zip(datum.logprobs, ref, datum.weights, strict=True)
            ]
        )
    sampled = [
        kl
        for datum, kls in zip(datums, per_datum, strict=True)
        for kl, w in zip(kls, datum.weights, strict=True)
        if w
    ]
    return per_datum, sampled


def kl_penalty(
    datums: Sequence[Datum],
    reference: Sequence[Sequence[float | None]],
    coefficient: float,
    *,
    scale: float = 1.0,
) -> tuple[list[Datum], dict[str, float]]:
    """Datums with the KL penalty in their advantages, and `kl/mean`, `kl/max`, `kl/tokens`.

    `reference[i]` holds the reference's logprob of each target of `datums[i]`; a missing one
    (None) counts as no divergence at that token.
    """
    per_datum, sampled = token_divergences(datums, reference)
    mean = math.fsum(sampled) / len(sampled) if sampled else 0.0
    out = []
    for datum, kls in zip(datums, per_datum, strict=True):
        if coefficient:
            advantages = [
                a + scale * coefficient * (mean - kl) if w else a
                for a, kl, w in zip(datum.advantages, kls, datum.weights, strict=True)
            ]
            datum = msgspec.structs.replace(datum, advantages=advantages)
        out.append(datum)
    stats = {
        "kl/mean": mean,
        "kl/max": max(sampled, default=0.0),
        "kl/tokens": float(len(sampled)),
        "kl/coefficient": coefficient,
    }
    return out, stats

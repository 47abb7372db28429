"""On-policy distillation: a teacher's logprobs of the policy's own sampled tokens as advantages.

The policy samples; the teacher scores the same tokens. For each sampled target token t,
`reverse_kl_t = logp_policy(t) - logp_teacher(t)`, a one-sample estimate of the reverse KL
KL(policy || teacher) at that token, and `-reverse_kl_t` is its advantage: tokens the teacher
finds likelier than the policy does are pushed up, the others down, so the policy moves to where
the teacher puts its mass on the states the policy itself reaches (the Tinker cookbook's on-policy
distillation, here over whole agent episodes). The advantage is centred on the step's mean
reverse KL, as the KL penalty's is: a fresh student is some 20 nats from its teacher at every
token, and an uncentred advantage pushes every sample down alike (measured: 0.44 reward after
6 steps uncentred, 0.78 centred). `weight` w mixes it with the task:
`(1 - w) * task advantage + w * scale * (mean - reverse_kl_t)`; w = 1 trains on the teacher alone.

Only tokens the policy sampled count (weight nonzero): prompts, tool results and other agents'
tokens keep their advantage (0) and are left out of the metrics. `scale` is the normalisation
the task's advantages already carry (1 / trained tokens under `token_mean`).
"""

import math
from collections.abc import Sequence

import msgspec

from platoon.bus.events import Datum
from platoon.credit.exceptions import CreditError
from platoon.credit.kl import token_divergences

__all__ = ["distill_advantages"]


def distill_advantages(
    datums: Sequence[Datum],
    teacher: Sequence[Sequence[float | None]],
    weight: float,
    *,
    scale: float = 1.0,
) -> tuple[list[Datum], dict[str, float]]:
    """Datums with the teacher's advantage mixed in, and `distill/reverse_kl` (the mean per
    sampled token), `distill/reverse_kl_max`, `distill/tokens`, `distill/weight`.

    `teacher[i]` holds the teacher's logprob of each target of `datums[i]` (`reference_targets`);
    a missing one (None, or not finite) counts as no divergence at that token.
    """
    if not 0.0 <= weight <= 1.0:
        raise CreditError(f"distill weight {weight} is outside 0..1")
    per_datum, sampled = token_divergences(datums, teacher, of="teacher")
    mean = math.fsum(sampled) / len(sampled) if sampled else 0.0
    out = [
        msgspec.structs.replace(
            datum,
            advantages=[
                (1.0 - weight) * a + weight * scale * (mean - k) if w else a
                for a, k, w in zip(datum.advantages, ks, datum.weights, strict=True)
            ],
        )
        for datum, ks in zip(datums, per_datum, strict=True)
    ]
    stats = {
        "distill/reverse_kl": mean,
        "distill/reverse_kl_max": max(sampled, default=0.0),
        "distill/tokens": float(len(sampled)),
        "distill/weight": weight,
    }
    return out, stats

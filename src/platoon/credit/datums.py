"""Prefix merging: an agent's model calls folded into as few training datums as possible.

A datum holds one token sequence `s` in the shape Tinker trains on: `model_input = s[:-1]`
and, aligned with `target_tokens = s[1:]`, the sampler's `logprobs`, the `advantages` and
the `weights` (1 on sampled tokens, 0 on prompt and tool-result tokens). Calls whose prompt
extends, token for token, the previous prompt plus completion share one sequence; a call
whose prompt does not (after context compaction, truncation or a re-rendered history)
starts a new one.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import msgspec

from platoon.bus.events import Datum
from platoon.credit.exceptions import CreditError
from platoon.credit.traces import Call

if TYPE_CHECKING:
    import tinker


class _Sequence:
    """A growing token sequence with per-token sampler logprob and a sampled flag."""

    def __init__(self, call: Call, advantage: float = 0.0) -> None:
        self.tokens: list[int] = []
        self.logprobs: list[float] = []
        self.sampled: list[float] = []
        self.advantages: list[float] = []
        self.policy_version = call.policy_version
        self.add(call, 0, advantage)

    def extended_by(self, call: Call) -> bool:
        n = len(self.tokens)
        return len(call.prompt_tokens) >= n and call.prompt_tokens[:n] == self.tokens

    def add(self, call: Call, start: int, advantage: float = 0.0) -> None:
        """Append the prompt from `start` on (not trained) and then the completion (trained)."""
        new_prompt = call.prompt_tokens[start:]
        self.tokens += new_prompt
        self.logprobs += [0.0] * len(new_prompt)
        self.sampled += [0.0] * len(new_prompt)
        self.advantages += [0.0] * len(new_prompt)
        self.tokens += call.completion_tokens
        self.logprobs += call.logprobs
        self.sampled += [1.0] * len(call.completion_tokens)
        self.advantages += [advantage] * len(call.completion_tokens)
        self.policy_version = min(self.policy_version, call.policy_version)


def merge_calls(
    calls: Sequence[Call],
    *,
    episode_id: str = "",
    group_id: str = "",
    agent_id: str = "",
    depth: int = 0,
    call_advantages: Sequence[float] | None = None,
) -> list[Datum]:
    """Fold one agent's calls, in order, into datums.

    Judge calls are skipped (they neither train nor break a chain). A sequence with no
    trainable target (no completion tokens past its first token) yields no datum.
    Advantages are zero, or with `call_advantages` (one per trainable call, in order) each
    call's sampled tokens carry its own; fill in one advantage for all with `with_advantage`.
    """
    trainable = [call for call in calls if call.kind != "judge"]
    if call_advantages is not None and len(call_advantages) != len(trainable):
        raise CreditError(f"{len(call_advantages)} call advantages for {len(trainable)} trainable calls")
    sequences: list[_Sequence] = []
    for index, call in enumerate(trainable):
        advantage = call_advantages[index] if call_advantages is not None else 0.0
        if sequences and sequences[-1].extended_by(call):
            sequences[-1].add(call, len(sequences[-1].tokens), advantage)
        else:
            sequences.append(_Sequence(call, advantage))
    datums = []
    for seq in sequences:
        weights = seq.sampled[1:]
        trained = int(sum(weights))
        if trained == 0:
            continue
        datums.append(
            Datum(
                model_input=seq.tokens[:-1],
                target_tokens=seq.tokens[1:],
                logprobs=seq.logprobs[1:],
                advantages=seq.advantages[1:],
                weights=weights,
                episode_id=episode_id,
                group_id=group_id,
                agent_id=agent_id,
                depth=depth,
                policy_version=seq.policy_version,
                num_trained_tokens=trained,
            )
        )
    return datums


def with_advantage(datum: Datum, advantage: float) -> Datum:
    """A copy of `datum` whose sampled positions carry `advantage` (others stay 0)."""
    return msgspec.structs.replace(datum, advantages=[w * advantage for w in datum.weights])


def scaled(datum: Datum, factor: float) -> Datum:
    """A copy of `datum` with every advantage multiplied by `factor`."""
    return msgspec.structs.replace(datum, advantages=[a * factor for a in datum.advantages])


def filter_stale(
    datums: Sequence[Datum], current_version: int, max_staleness: int | None
) -> tuple[list[Datum], int]:
    """Keep datums at most `max_staleness` policy versions behind `current_version`.

    Returns the kept datums and how many were dropped. `None` keeps everything; 0 keeps
    only datums sampled from the current policy.
    """
    if max_staleness is None:
        return list(datums), 0
    if max_staleness < 0:
        raise CreditError(f"max_staleness must be >= 0 or None, got {max_staleness}")
    kept = [d for d in datums if current_version - d.policy_version <= max_staleness]
    return kept, len(datums) - len(kept)


_RL_KEYS = ("target_tokens", "logprobs", "advantages")
_LOSS_KEYS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": _RL_KEYS,
    "ppo": _RL_KEYS,
    "cispo": _RL_KEYS,
    "dro": _RL_KEYS,
    "gspo": (*_RL_KEYS, "sequence_ratio_mask"),
    # A client-side custom loss sees every input key, so it gets them all.
    "custom": (*_RL_KEYS, "weights"),
}


def to_tinker(datum: Datum, loss_fn: str) -> "tinker.Datum":
    """The `tinker.Datum` for `loss_fn`, carrying only the inputs that loss reads.

    The hosted service rejects unexpected input keys, so provenance and the other losses'
    inputs stay behind. `stable_reinforce` needs provenance spans and is not supported.
    """
    keys = _LOSS_KEYS.get(loss_fn)
    if keys is None:
        raise CreditError(f"unsupported loss_fn {loss_fn!r} (expected one of {', '.join(_LOSS_KEYS)})")
    import tinker

    values: dict[str, list[int] | list[float]] = {
        "target_tokens": datum.target_tokens,
        "logprobs": datum.logprobs,
        "advantages": datum.advantages,
        "weights": datum.weights,
        "sequence_ratio_mask": datum.weights,
    }
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(datum.model_input),
        # The Datum's validator turns each list into the TensorData its type names.
        loss_fn_inputs=cast("tinker.types.LossFnInputs", {key: values[key] for key in keys}),
    )

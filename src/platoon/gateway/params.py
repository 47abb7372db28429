"""The sampling parameters of one call: the request's values first, then the agent's, then the
gateway's defaults, each checked (a finite number in range, or a 400 naming it), `max_tokens`
clamped to the context left; and the cheap bounds that refuse a prompt before tokenizing it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import msgspec

from platoon.bus.events import derive_seed
from platoon.gateway.errors import GatewayError
from platoon.gateway.sessions import AgentSession
from platoon.gateway.shapes import Params, Tokenizer
from platoon.policy.base import SampleParams

__all__ = ["as_dict", "call_params", "checked_params", "longest_token", "size_bound", "text_size"]

_PARAM_ALIASES = {"max_completion_tokens": "max_tokens"}
_MAX_TOKENS = 10_000_000  # no model samples more; a larger max_tokens is a mistake
# What each sampling parameter may be: (type, lowest, highest).
_PARAM_RANGES: dict[str, tuple[type, float, float]] = {
    "max_tokens": (int, 1, _MAX_TOKENS),
    "temperature": (float, 0.0, 100.0),
    "top_p": (float, 0.0, 1.0),
    "top_k": (int, -1, 2**31 - 1),
    "seed": (int, -(2**63), 2**63 - 1),
    "top_logprobs": (int, 0, 20),
}


def call_params(
    defaults: SampleParams,
    session: AgentSession,
    request: Params,
    prompt_len: int,
    context_window: int | None,
) -> SampleParams:
    """Request values first, then the agent's defaults, then the gateway's."""
    merged: dict[str, object] = {}
    for source in (as_dict(defaults), session.params, request):
        for key, value in source.items():
            if value is not None:
                merged[_PARAM_ALIASES.get(key, key)] = value
    unknown = set(merged) - _PARAM_FIELDS
    for key in unknown:
        merged.pop(key)
    if "seed" not in merged and session.seed is not None:
        merged["seed"] = derive_seed(session.seed, session.draws)
        session.draws += 1
    params = checked_params(merged)
    if context_window is not None:
        room = context_window - prompt_len
        if room <= 0:
            raise GatewayError(
                "context_length",
                f"This model's maximum context length is {context_window} tokens; the prompt "
                f"has {prompt_len} tokens",
                param="messages",
            )
        if params.max_tokens is None or params.max_tokens > room:
            params = msgspec.structs.replace(params, max_tokens=room)
    return params


def checked_params(values: Mapping[str, object]) -> SampleParams:
    """SampleParams from request values, each a finite number in range, or a 400 naming it."""
    max_tokens = _checked(values, "max_tokens")
    temperature = _checked(values, "temperature")
    top_p = _checked(values, "top_p")
    top_k = _checked(values, "top_k")
    seed = _checked(values, "seed")
    top_logprobs = _checked(values, "top_logprobs")
    stop = values.get("stop")
    stops: list[str] | list[int] | None
    if stop is None or isinstance(stop, str):
        stops = None if stop is None else [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = [s for s in stop if isinstance(s, str)]
    elif isinstance(stop, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
        stops = [s for s in stop if isinstance(s, int)]
    else:  # a list of strings or of token ids, not both
        raise GatewayError("bad_request", "stop must be a string or a list of strings", param="stop")
    return SampleParams(
        max_tokens=None if max_tokens is None else int(max_tokens),
        temperature=_DEFAULTS.temperature if temperature is None else temperature,
        top_p=_DEFAULTS.top_p if top_p is None else top_p,
        top_k=_DEFAULTS.top_k if top_k is None else int(top_k),
        stop=stops,
        seed=None if seed is None else int(seed),
        top_logprobs=0 if top_logprobs is None else int(top_logprobs),
    )


def _checked(values: Mapping[str, object], name: str) -> int | float | None:
    """The named parameter, a finite number in its range (an integral float made an int where an
    integer is asked for), None when absent; or a 400 naming it."""
    kind, low, high = _PARAM_RANGES[name]
    value = values.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        ok: int | float | None = None
    elif kind is int and isinstance(value, float):
        ok = int(value) if value.is_integer() else None
    else:
        ok = value
    if ok is None or not math.isfinite(ok) or not low <= ok <= high:
        raise GatewayError(
            "bad_request",
            f"{name} must be {'an integer' if kind is int else 'a number'} from {low} to {high}, "
            f"got {value if ok is None else ok!r}",
            param=name,
        )
    return ok


def text_size(value: object) -> int:
    """Characters of all the strings in a JSON-like value (a cheap bound on its tokens)."""
    total = 0
    pending = [value]
    while pending:  # a loop, not recursion: it runs on every call's whole history
        item = pending.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):  # JSON is dicts and lists; an ABC check costs 10x more
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
        elif isinstance(item, Mapping):
            pending.extend(item.values())
    return total


def size_bound(value: object) -> int:
    """At least the characters of all the strings in a JSON-like value: its size as msgpack in
    bytes (each string's UTF-8 and more).

    Encoded in C, 10-50x faster than counting (`text_size`) on every call's whole history (and
    twice as fast as JSON, which checks each character for escapes); a value msgspec cannot encode
    is counted."""
    try:
        return len(_ENCODER.encode(value))
    except (TypeError, ValueError, OverflowError):  # not plain data (an object of the caller's)
        return text_size(value)


_ENCODER = msgspec.msgpack.Encoder()


def longest_token(tokenizer: Tokenizer) -> int:
    """The most characters one token can stand for (vocabulary strings are at least as long)."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # a tokenizer without a vocabulary table: no bound known
        return 1 << 30
    return max((len(token) for token in vocab), default=1 << 30) or 1


_PARAM_FIELDS = set(SampleParams.__struct_fields__)
_DEFAULTS = SampleParams()


def as_dict(params: SampleParams) -> dict[str, object]:
    return {f: getattr(params, f) for f in SampleParams.__struct_fields__}

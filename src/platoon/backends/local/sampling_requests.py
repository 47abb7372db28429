"""An `asample` body read into what the sampler runs: the prompt's tokens, the sampling
parameters with their stops resolved, and a refusal by name for what this server does not offer."""

from __future__ import annotations

from platoon.backends.local.bodies import Asample, SamplingParams
from platoon.backends.local.sampler import SampleParams, SampleRequest
from platoon.backends.local.specs import EngineError, WeightsRef, not_offered

__all__ = ["read_sample_request"]


def read_sample_request(
    req: Asample, weights: WeightsRef, eos_ids: frozenset[int], max_context: int
) -> SampleRequest:
    """The sampler's request for `req` on `weights`; `eos_ids` are the stops when it names none.
    A prompt longer than `max_context` is refused before its tokens are gathered."""
    unsupported = [
        name
        for name, value in (
            ("target_prompt_logprobs", req.target_prompt_logprobs),
            ("prompt_alt_tokens_k", req.prompt_alt_tokens_k),
            ("prompt_logprobs_last_n", req.prompt_logprobs_last_n),
        )
        if value
    ]
    if unsupported:
        raise EngineError(
            not_offered(
                f"sampling with {', '.join(unsupported)}",
                "leave it out; prompt_logprobs scores every position",
            )
        )
    prompt: list[int] = []
    length = sum(len(t) for c in req.prompt.chunks if isinstance(t := c.get("tokens"), list))
    if length >= max_context:
        raise EngineError(f"prompt of {length} tokens fills the context length {max_context}")
    for chunk in req.prompt.chunks:
        kind = chunk.get("type", "encoded_text")
        if kind != "encoded_text":
            raise EngineError(not_offered(f"prompt chunk type {kind!r}", "prompts are text tokens only"))
        tokens = chunk.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise EngineError("prompt chunk tokens must be a list of integers")
        prompt.extend(tokens)
    return SampleRequest(
        prompt=prompt,
        num_samples=req.num_samples,
        params=_params(req.sampling_params, eos_ids),
        prompt_logprobs=bool(req.prompt_logprobs),
        weights=weights,
        topk_prompt=req.topk_prompt_logprobs,
        topk_sample=req.topk_sample_logprobs,
    )


def _params(p: SamplingParams, eos_ids: frozenset[int]) -> SampleParams:
    """`stop=None` keeps the implicit EOS stop; a string, strings or token ids replace it."""
    stop = p.stop
    tokens: frozenset[int]
    strings: tuple[str, ...]
    if stop is None:
        tokens, strings = eos_ids, ()
    elif isinstance(stop, str):
        tokens, strings = frozenset(), (stop,) if stop else ()
    elif all(isinstance(s, int) for s in stop):
        tokens, strings = frozenset(int(s) for s in stop), ()
    else:
        tokens, strings = frozenset(), tuple(str(s) for s in stop if s)
    return SampleParams(
        max_tokens=p.max_tokens,
        seed=p.seed,
        temperature=p.temperature,
        top_k=p.top_k,
        top_p=p.top_p,
        stop_tokens=tokens,
        stop_strings=strings,
    )

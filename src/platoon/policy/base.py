"""The sampler protocol and the types it speaks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

from platoon.bus.events import PolicyUpdated
from platoon.policy.constraints import DecodingConstraint

__all__ = [
    "SampleParams",
    "SampledChunk",
    "SampledCompletion",
    "Sampler",
    "SamplerFactory",
    "StopReason",
    "StreamingSampler",
    "Tokenizer",
    "TopLogprobs",
]

StopReason = Literal["stop", "length"]


class SampleParams(msgspec.Struct, frozen=True, kw_only=True):
    """Sampling parameters, as Tinker's `SamplingParams` names them.

    `stop=None` keeps the renderer's stop tokens; a list of strings or of token ids replaces them.
    """

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] | list[int] | None = None
    seed: int | None = None
    # The most likely alternatives to return at each sampled token (Tinker's
    # `topk_sample_logprobs`); a sampler gives at most its `max_top_logprobs` (0 when it has none).
    top_logprobs: int = 0
    # What the reply must be (a tool call, a JSON value); given only to a sampler whose
    # `constrains` is true, which then samples nothing else.
    constraint: DecodingConstraint | None = None


TopLogprobs = list[list[tuple[int, float]]]  # per sampled token, (token id, logprob) alternatives


class SampledCompletion(msgspec.Struct, frozen=True, kw_only=True):
    """What a sampler returned: the token ids (a matched stop token included) and logprobs, and
    the top alternatives at each token when `SampleParams.top_logprobs` asked for them."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: StopReason
    top_logprobs: TopLogprobs | None = None


class Tokenizer(Protocol):
    """What platoon asks of a tokenizer (a `transformers` one, or a test's toy): ids to text and back."""

    def encode(self, text: str, *, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = ...) -> str: ...


@runtime_checkable
class Sampler(Protocol):
    """One policy version that can sample completions.

    `messages` is the conversation the prompt was rendered from; real samplers ignore it,
    scripted test policies may answer from it. When the reply's opening was forced (a tool
    call `tool_choice` asks for), the prompt ends with its tokens and `messages` with it as
    `{"role": "assistant", "content": OPENING, "prefix": True}`.

    A sampler with `constrains = True` (an attribute; absent means false) decodes to
    `params.constraint`; the gateway checks every other sampler's reply and samples again.
    """

    version: int

    async def sample(
        self,
        prompt_tokens: Sequence[int],
        params: SampleParams,
        *,
        messages: list[dict[str, Any]] | None = None,
    ) -> SampledCompletion: ...


class SampledChunk(msgspec.Struct, frozen=True, kw_only=True):
    """Tokens as a streaming sampler produces them; the last chunk carries the stop reason."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: StopReason | None = None
    top_logprobs: TopLogprobs | None = None


@runtime_checkable
class StreamingSampler(Sampler, Protocol):
    """A sampler that can also hand out its tokens as they are sampled.

    The gateway streams them to HTTP clients that ask for a stream, and stops sampling early
    when a client's stop sequence appears. The chunks, joined, are exactly what `sample` would
    have returned.
    """

    def sample_stream(
        self,
        prompt_tokens: Sequence[int],
        params: SampleParams,
        *,
        messages: list[dict[str, Any]] | None = None,
    ) -> AsyncIterator[SampledChunk]: ...


@runtime_checkable
class SamplerFactory(Protocol):
    """Makes the sampler for a `PolicyUpdated` event (new weights, new version)."""

    async def initial(self) -> Sampler: ...

    async def updated(self, event: PolicyUpdated) -> Sampler: ...

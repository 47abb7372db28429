"""One model call's parts, as `Gateway.complete_stream` goes through them: the call prepared
(`PreparedCall`), the slot it is sampled in (`Slot`: the limiter and the agent's budget), its
sampling parameters fitted to the budget and the sampler (`in_budget`, `steered`, `resampled`),
and the refusal of a reply that never was what it had to be (`refused`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeGuard

import anyio
import msgspec

from platoon.bus.events import CallKind, derive_seed
from platoon.gateway.errors import GatewayError
from platoon.gateway.renderers import ParsedMessage, Renderer
from platoon.gateway.replies import Controls
from platoon.gateway.sessions import AgentSession, Budget
from platoon.gateway.shapes import Message, Messages, Tool
from platoon.policy.base import SampledCompletion, SampleParams, Sampler, StreamingSampler

__all__ = [
    "PreparedCall",
    "Reply",
    "Slot",
    "as_dicts",
    "in_budget",
    "refused",
    "resampled",
    "steered",
    "streams",
]


@dataclass(slots=True)
class PreparedCall:
    """One call, prepared (`Gateway._prepare`): what is sampled, with what, and how its reply is read."""

    renderer: Renderer
    tools: Sequence[Tool] | None
    controls: Controls
    prompt: list[int]
    prefill: list[int]  # the forced opening's tokens, at the prompt's end
    params: SampleParams
    sampler: Sampler
    constrained: bool  # the sampler decodes the reply to `controls.constraint`
    messages: Messages  # the conversation as the client sent it (recorded)
    conversation: list[dict[str, object]]  # as the sampler gets it: the forced opening added


Reply = tuple[SampledCompletion, ParsedMessage, str | None]  # sampled, parsed, the client's stop


class Slot:
    """The sample phase's hold: the limiter, on behalf of one call, and the call reserved in its
    agent's `budget` (a policy call's; None for others), both given back on leaving (the
    reservation where the call failed). It times the phase (`started`, `duration`)."""

    __slots__ = ("_clock", "budget", "duration", "holder", "limiter", "reserved", "started", "wait")

    def __init__(self, limiter: anyio.CapacityLimiter, budget: Budget | None, wait: bool) -> None:
        self.limiter, self.budget, self.wait = limiter, budget, wait
        # The limiter is held on behalf of this call, not of a task: a stream is answered by
        # the task that started it and then by the one that sends the response.
        self.holder = object()
        self.reserved = False
        self.started = self.duration = self._clock = 0.0

    async def __aenter__(self) -> Slot:
        if self.wait:
            await self.limiter.acquire_on_behalf_of(self.holder)
        else:
            try:
                self.limiter.acquire_on_behalf_of_nowait(self.holder)
            except anyio.WouldBlock:
                raise GatewayError("overloaded", "the sampler is saturated; retry later") from None
        self.started, self._clock = time.time(), time.perf_counter()
        if self.budget is not None:
            # Checked again and reserved now: concurrent calls of one budget may have waited
            # for capacity since the first check.
            try:
                self.budget.check()
            except BaseException:
                self.limiter.release_on_behalf_of(self.holder)
                raise
            self.budget.calls += 1
            self.reserved = True
        return self

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is not None and self.reserved:
            assert self.budget is not None
            self.budget.calls -= 1
        self.limiter.release_on_behalf_of(self.holder)
        self.duration = time.perf_counter() - self._clock


def in_budget(params: SampleParams, session: AgentSession, kind: CallKind) -> SampleParams:
    """`params`, whose max_tokens a policy call may not take past the episode's token budget."""
    budget = session.budget
    if kind != "policy" or budget.max_tokens is None:
        return params
    room = max(budget.max_tokens - budget.tokens, 1)
    if params.max_tokens is None or params.max_tokens > room:
        return msgspec.structs.replace(params, max_tokens=room)
    return params


def steered(params: SampleParams, sampler: Sampler, controls: Controls) -> tuple[SampleParams, bool]:
    """`params` as `sampler` can sample them, and whether it constrains the reply's decoding.

    A sampler that constrains its decoding samples only what the reply must be (through its
    stream); any other's reply is checked, and sampled again when it is not (a JSON reply then
    streams nothing before it is checked)."""
    most = getattr(sampler, "max_top_logprobs", 0)  # a sampler that has none has no attribute
    if params.top_logprobs > most:
        raise GatewayError(
            "bad_request",
            f"top_logprobs: this policy's sampler gives {most or 'no'} top alternatives per token, "
            f"{params.top_logprobs} were asked for (the embedded and Tinker samplers give up to 20)",
            param="top_logprobs",
        )
    constrained = (
        controls.constraint is not None and streams(sampler) and getattr(sampler, "constrains", False)
    )
    if constrained:
        return msgspec.structs.replace(params, constraint=controls.constraint), True
    if controls.json_format is not None:
        controls.plain = False  # nothing of it streams before it is checked
    return params, False


def resampled(params: SampleParams, attempt: int) -> SampleParams:
    """The parameters of sample `attempt` of one call: a seeded call's later samples get seeds of
    their own (the same seed would sample the same reply again)."""
    if attempt == 0 or params.seed is None:
        return params
    return msgspec.structs.replace(params, seed=derive_seed(params.seed, "resample", attempt))


def refused(controls: Controls, tries: int, why: str) -> GatewayError:
    """The refusal of a reply that had to be a tool call or JSON and never was."""
    samples = f"{tries} sample{'s' if tries > 1 else ''}"
    if controls.prefill:
        return GatewayError(
            "sampler",
            f"tool_choice asks for a tool call, and the policy wrote none in {samples} (last: {why}); "
            "ask again, or without tool_choice",
        )
    schema = controls.json_format.get("schema") if controls.json_format is not None else None
    wanted = "JSON of its schema" if schema is not None else "a JSON object"
    return GatewayError(
        "sampler",
        f"the output format asks for {wanted}, and the policy wrote none in {samples} (last: {why}); "
        "ask again, or without the output format",
    )


def streams(sampler: Sampler) -> TypeGuard[StreamingSampler]:
    """Whether a sampler streams (`StreamingSampler`; an isinstance check of a protocol costs
    more than the rest of a call's bookkeeping)."""
    return callable(getattr(sampler, "sample_stream", None))


def as_dicts(messages: Sequence[Message]) -> list[dict[str, object]]:
    """The conversation as the sampler protocol takes it (the client's JSON objects, as they are)."""
    return [m if isinstance(m, dict) else dict(m) for m in messages]

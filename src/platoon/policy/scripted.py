"""Scripted policies: samplers that answer from a script, for tests and demos on CPU.

They return real token ids from the run's tokenizer, so the whole token path (render,
sample, parse, record, merge into datums) runs exactly as it does with a model.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any

from platoon import plugins
from platoon.bus.events import PolicyUpdated
from platoon.config import AssemblyError
from platoon.policy.base import SampledChunk, SampledCompletion, SampleParams, SamplerFactory

__all__ = ["Script", "ScriptedSampler", "ScriptedSamplerFactory", "policy_from_ref"]

Script = Iterable[str] | Callable[[list[dict[str, Any]]], str | Awaitable[str]]


class ScriptedSampler:
    """Answers each call with the next text of a script, or with `script(messages)`.

    The text is tokenized with the run's tokenizer and ends with the renderer's stop token
    (`stop_token`, Qwen3's `<|im_end|>` by default), as a model's completion would. Every token
    gets the same `logprob`, so tests can check that logprobs travel with the tokens.

    When the gateway forced the reply's opening (`tool_choice`), the messages end with it as
    `{"role": "assistant", "content": OPENING, "prefix": True}`; a text that starts with the
    opening is answered from after it, so a script may write the whole reply or the rest.
    """

    def __init__(
        self,
        tokenizer: Any,
        script: Script,
        *,
        stop_token: str | None = "<|im_end|>",
        logprob: float = -0.25,
        version: int = 0,
        pace: Callable[[int], Awaitable[None]] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.pace = pace
        self._encoded: dict[str, list[int]] = {}
        self.version = version
        self.logprob = logprob
        self.calls = 0
        if callable(script):
            # A copy: the gateway records these very messages (ModelCallFinished), and a
            # script that edits what it is handed must not rewrite the record.
            self._respond: Callable[[list[dict[str, Any]]], Any] = lambda m: script(copy.deepcopy(m))
        else:
            texts = iter(list(script))

            def respond(_messages: list[dict[str, Any]]) -> str:
                try:
                    return next(texts)
                except StopIteration:
                    raise RuntimeError(f"the script ran out after {self.calls} completions") from None

            self._respond = respond
        self.stop_ids: list[int] = []
        if stop_token is not None:
            stop_id = tokenizer.convert_tokens_to_ids(stop_token)
            if stop_id is None or stop_id == tokenizer.unk_token_id:
                raise ValueError(f"the tokenizer has no stop token {stop_token!r}")
            self.stop_ids = [stop_id]

    async def sample(
        self,
        prompt_tokens: Sequence[int],
        params: SampleParams,
        *,
        messages: list[dict[str, Any]] | None = None,
    ) -> SampledCompletion:
        tokens, stop_reason = await self._complete(params, messages)
        return SampledCompletion(
            tokens=tokens, logprobs=[self.logprob] * len(tokens), stop_reason=stop_reason
        )

    async def sample_stream(
        self,
        prompt_tokens: Sequence[int],
        params: SampleParams,
        *,
        messages: list[dict[str, Any]] | None = None,
    ) -> AsyncIterator[SampledChunk]:
        tokens, stop_reason = await self._complete(params, messages)
        for i, token in enumerate(tokens):
            if self.pace is not None:
                await self.pace(i)
            last = i == len(tokens) - 1
            yield SampledChunk(
                tokens=[token], logprobs=[self.logprob], stop_reason=stop_reason if last else None
            )

    async def _complete(
        self, params: SampleParams, messages: list[dict[str, Any]] | None
    ) -> tuple[list[int], Any]:
        messages = messages or []
        text = self._respond(messages)
        if inspect.isawaitable(text):
            text = await text
        self.calls += 1
        opening = messages[-1] if messages and messages[-1].get("prefix") is True else None
        if opening is not None and isinstance(opening.get("content"), str):
            text = text.removeprefix(opening["content"])
        encoded = self._encoded.get(text)
        if encoded is None:
            # A model's sampler costs no tokenizing; scripts repeat their texts, so cache them.
            encoded = self.tokenizer.encode(text, add_special_tokens=False)
            if len(self._encoded) < 4096:
                self._encoded[text] = encoded
        tokens = list(encoded) + self.stop_ids
        stop_reason = "stop"
        if params.max_tokens is not None and len(tokens) > params.max_tokens:
            tokens = tokens[: params.max_tokens]
            stop_reason = "length"
        return tokens, stop_reason


class ScriptedSamplerFactory:
    """A `SamplerFactory` whose every version answers from the same script."""

    def __init__(self, tokenizer: Any, script: Script, **options: Any) -> None:
        self.sampler = ScriptedSampler(tokenizer, script, **options)

    async def initial(self) -> ScriptedSampler:
        return self.sampler

    async def updated(self, event: PolicyUpdated) -> ScriptedSampler:
        self.sampler.version = event.version
        return self.sampler


def policy_from_ref(ref: str, tokenizer: Any) -> SamplerFactory:
    """`scripted:MODULE:ATTR`: a scripted policy (a list of texts or a function of the messages)."""
    kind, _, target = ref.partition(":")
    if kind != "scripted" or ":" not in target:
        raise AssemblyError(f"--policy {ref!r}: expected scripted:MODULE:ATTR")
    return ScriptedSamplerFactory(tokenizer, plugins.import_ref(target))

"""Continuous batching: concurrent sample requests share one forward pass per decoding step.

A scheduler loop keeps one running batch per set of weights. Between steps it admits new
requests (their prompts are prefilled and their KV caches merged into the batch, left-padded)
and drops finished rows, so a request never waits for another to finish. Each step samples
one token for every row, checks stop conditions, and runs one batched forward with the KV
cache. The torch work runs in the engine's worker thread via `run_sync`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec
import torch
import torch.nn.functional as F

from platoon.backends.local.engine import Engine, EngineError, WeightsRef
from platoon.backends.local.proto import SampledSequence

__all__ = ["SampleParams", "SampleRequest", "SampleResult", "Sampler"]


class SampleParams(msgspec.Struct, frozen=True):
    max_tokens: int | None = None
    seed: int | None = None
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    stop_tokens: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()


class SampleRequest(msgspec.Struct):
    prompt: list[int]
    num_samples: int
    params: SampleParams
    prompt_logprobs: bool
    weights: WeightsRef


class SampleResult(msgspec.Struct):
    sequences: list[SampledSequence]
    prompt_logprobs: list[float | None] | None


class _Job:
    def __init__(self, request: SampleRequest, limit: int, device: torch.device) -> None:
        self.request = request
        self.limit = limit  # tokens this job may generate
        self.done = anyio.Event()
        self.result: SampleResult | None = None
        self.error: Exception | None = None
        self.sequences: list[SampledSequence | None] = [None] * request.num_samples
        self.prompt_logprobs: list[float | None] | None = None
        self.generator: torch.Generator | None = None
        if request.params.seed is not None:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(request.params.seed % (2**63))


class _Row:
    def __init__(self, job: _Job, index: int, position: int) -> None:
        self.job = job
        self.index = index
        self.position = position  # position id of the next token fed to the model
        self.tokens: list[int] = []
        self.logprobs: list[float] = []


class _Batch:
    """The running rows for one set of weights, with their KV cache and attention mask."""

    def __init__(self) -> None:
        self.rows: list[_Row] = []
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # [rows, cache length], 0 on left padding
        self.logits: torch.Tensor | None = None  # [rows, vocab], next-token logits
        self.next_tokens: list[int] = []  # the tokens just sampled, fed to the next decode


class Sampler:
    """Schedules sample requests onto batched decoding steps."""

    def __init__(
        self,
        engine: Engine,
        run_sync: Callable[[Callable[[], Any]], Awaitable[Any]],
        *,
        max_batch: int = 64,
    ) -> None:
        self.engine = engine
        self._run_sync = run_sync
        self._max_batch = max_batch
        self._pending: dict[WeightsRef, list[_Job]] = {}
        self._batches: dict[WeightsRef, _Batch] = {}
        self._wakeup = anyio.Event()
        self.steps = 0
        # transformers 5.x names the KV cache argument `cache`; 4.x calls it `past_key_values`.
        forward = inspect.signature(engine.base.forward).parameters
        self._cache_arg = "cache" if "cache" in forward else "past_key_values"

    def check(self, request: SampleRequest) -> int:
        """Validate a request; return how many tokens it may generate."""
        engine = self.engine
        prompt, params = request.prompt, request.params
        if not prompt:
            raise EngineError("prompt is empty")
        bad = [t for t in prompt if not 0 <= t < engine.vocab_size]
        if bad:
            raise EngineError(
                f"prompt holds token id {bad[0]}, outside the vocabulary [0, {engine.vocab_size})"
            )
        if not 1 <= request.num_samples <= 1024:
            raise EngineError(f"num_samples must be between 1 and 1024, got {request.num_samples}")
        room = engine.max_context - len(prompt)
        if room < 1:
            raise EngineError(f"prompt of {len(prompt)} tokens fills the context length {engine.max_context}")
        if params.max_tokens is not None and params.max_tokens < 1:
            raise EngineError(f"max_tokens must be >= 1, got {params.max_tokens}")
        if not params.temperature >= 0 or not math.isfinite(params.temperature):
            raise EngineError(f"temperature must be >= 0, got {params.temperature}")
        if not 0 < params.top_p <= 1:
            raise EngineError(f"top_p must be in (0, 1], got {params.top_p}")
        if params.top_k == 0 or params.top_k < -1:
            raise EngineError(f"top_k must be -1 (off) or >= 1, got {params.top_k}")
        bad = [t for t in params.stop_tokens if not 0 <= t < engine.vocab_size]
        if bad:
            raise EngineError(f"stop token {bad[0]} is outside the vocabulary")
        return min(room, params.max_tokens or room)

    async def sample(self, request: SampleRequest) -> SampleResult:
        """Queue a request and wait for all its sequences."""
        job = _Job(request, self.check(request), self.engine.device)
        self._pending.setdefault(request.weights, []).append(job)
        self._wakeup.set()
        await job.done.wait()
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    async def run(self) -> None:
        """The scheduler loop: one decoding step per set of weights in turn, forever."""
        while True:
            keys = [k for k in {*self._batches, *self._pending} if self._has_work(k)]
            if not keys:
                self._wakeup = anyio.Event()
                await self._wakeup.wait()
                continue
            for key in keys:
                batch = self._batches.setdefault(key, _Batch())
                room = self._max_batch - len(batch.rows)
                admitted: list[_Job] = []
                queue = self._pending.get(key, [])
                while queue and (room >= queue[0].request.num_samples or (not batch.rows and not admitted)):
                    job = queue.pop(0)
                    room -= job.request.num_samples
                    admitted.append(job)
                try:
                    finished = await self._run_sync(lambda b=batch, a=admitted, k=key: self._step(k, b, a))
                except Exception as exc:
                    self._fail(key, batch, admitted, exc)
                    continue
                for job in finished:
                    job.done.set()
                if not batch.rows:
                    del self._batches[key]
                    if not self._pending.get(key):
                        self._pending.pop(key, None)

    def _has_work(self, key: WeightsRef) -> bool:
        batch = self._batches.get(key)
        return bool(self._pending.get(key)) or (batch is not None and bool(batch.rows))

    def _fail(self, key: WeightsRef, batch: _Batch, admitted: list[_Job], exc: Exception) -> None:
        error = exc if isinstance(exc, EngineError) else RuntimeError(f"sampling failed: {exc!r}")
        jobs = {id(r.job): r.job for r in batch.rows} | {id(j): j for j in admitted}
        for job in jobs.values():
            job.error = error
            job.done.set()
        self._batches.pop(key, None)

    # ---- the worker-thread part ------------------------------------------------------

    @torch.no_grad()
    def _step(self, key: WeightsRef, batch: _Batch, admitted: list[_Job]) -> list[_Job]:
        with self.engine.weights(key) as model:
            for group in _same_length(admitted):
                self._prefill(model, batch, group)
            finished = self._sample(batch)
            if batch.rows:
                self._decode(model, batch)
        self.steps += 1
        return finished

    def _prefill(self, model: Any, batch: _Batch, jobs: list[_Job]) -> None:
        from transformers import DynamicCache

        device = self.engine.device
        length = len(jobs[0].request.prompt)
        want_prompt_logprobs = any(j.request.prompt_logprobs for j in jobs)
        ids = torch.tensor([j.request.prompt for j in jobs], dtype=torch.long, device=device)
        out = model(
            input_ids=ids,
            use_cache=True,
            logits_to_keep=0 if want_prompt_logprobs else 1,
            **{self._cache_arg: DynamicCache()},
        )
        logits = out.logits.float()
        repeats = torch.tensor([j.request.num_samples for j in jobs], device=device)
        for i, job in enumerate(jobs):
            if job.request.prompt_logprobs:
                scored = torch.log_softmax(logits[i, :-1], dim=-1).gather(-1, ids[i, 1:, None])[:, 0]
                job.prompt_logprobs = [None, *scored.tolist()]
        cache = _cache_of(out)
        for layer in cache.layers:
            layer.keys = layer.keys.repeat_interleave(repeats, dim=0)
            layer.values = layer.values.repeat_interleave(repeats, dim=0)
        new_logits = logits[:, -1].repeat_interleave(repeats, dim=0)
        new_mask = torch.ones(int(repeats.sum()), length, dtype=torch.long, device=device)
        new_rows = [_Row(job, k, length) for job in jobs for k in range(job.request.num_samples)]
        if not batch.rows:
            batch.cache, batch.mask, batch.logits = cache, new_mask, new_logits
        else:
            assert batch.mask is not None and batch.logits is not None
            width = max(batch.mask.shape[1], length)
            for old, new in zip(batch.cache.layers, cache.layers, strict=True):
                old.keys = torch.cat([_left_pad(old.keys, width), _left_pad(new.keys, width)])
                old.values = torch.cat([_left_pad(old.values, width), _left_pad(new.values, width)])
            batch.mask = torch.cat([_left_pad(batch.mask, width, dim=1), _left_pad(new_mask, width, dim=1)])
            batch.logits = torch.cat([batch.logits, new_logits])
        batch.rows.extend(new_rows)

    def _sample(self, batch: _Batch) -> list[_Job]:
        assert batch.logits is not None
        logprobs = torch.log_softmax(batch.logits, dim=-1)
        tokens = self._choose(batch)
        keep: list[int] = []
        finished: list[_Job] = []
        for i, row in enumerate(batch.rows):
            token = tokens[i]
            row.tokens.append(token)
            row.logprobs.append(float(logprobs[i, token]))
            reason = self._stop_reason(row, token)
            if reason is None:
                keep.append(i)
                continue
            job = row.job
            job.sequences[row.index] = SampledSequence(
                tokens=row.tokens, logprobs=row.logprobs, stop_reason=reason
            )
            if all(s is not None for s in job.sequences):
                job.result = SampleResult(sequences=list(job.sequences), prompt_logprobs=job.prompt_logprobs)  # type: ignore[arg-type]
                finished.append(job)
        if len(keep) < len(batch.rows):
            index = torch.tensor(keep, dtype=torch.long, device=batch.logits.device)
            batch.rows = [batch.rows[i] for i in keep]
            if batch.rows:
                for layer in batch.cache.layers:
                    layer.keys, layer.values = layer.keys[index], layer.values[index]
                assert batch.mask is not None
                batch.mask = batch.mask[index]
            else:
                batch.cache = batch.mask = batch.logits = None
        batch.next_tokens = [tokens[i] for i in keep]
        return finished

    def _choose(self, batch: _Batch) -> list[int]:
        assert batch.logits is not None
        logits = batch.logits
        plain = [
            i
            for i, r in enumerate(batch.rows)
            if r.job.generator is None and r.job.request.params == _DEFAULT_DRAW
        ]
        chosen = [0] * len(batch.rows)
        if plain:
            draws = torch.multinomial(torch.softmax(logits[plain], dim=-1), 1)[:, 0].tolist()
            for i, token in zip(plain, draws, strict=True):
                chosen[i] = token
        plain_set = set(plain)
        for i, row in enumerate(batch.rows):
            if i not in plain_set:
                chosen[i] = _draw(logits[i], row.job.request.params, row.job.generator)
        return chosen

    def _stop_reason(self, row: _Row, token: int) -> str | None:
        params = row.job.request.params
        if token in params.stop_tokens:
            return "stop"
        if params.stop_strings:
            text = self.engine.tokenizer.decode(row.tokens[-64:], skip_special_tokens=False)
            if any(s in text for s in params.stop_strings):
                return "stop"
        if len(row.tokens) >= row.job.limit:
            return "length"
        return None

    def _decode(self, model: Any, batch: _Batch) -> None:
        assert batch.mask is not None
        device = self.engine.device
        ids = torch.tensor(batch.next_tokens, dtype=torch.long, device=device)[:, None]
        positions = torch.tensor([r.position for r in batch.rows], dtype=torch.long, device=device)[:, None]
        batch.mask = torch.cat([batch.mask, torch.ones_like(batch.mask[:, :1])], dim=1)
        out = model(
            input_ids=ids,
            attention_mask=batch.mask,
            position_ids=positions,
            use_cache=True,
            **{self._cache_arg: batch.cache},
        )
        batch.cache = _cache_of(out)
        batch.logits = out.logits[:, -1].float()
        for row in batch.rows:
            row.position += 1


_DEFAULT_DRAW = SampleParams()


def _draw(logits: torch.Tensor, params: SampleParams, generator: torch.Generator | None) -> int:
    if params.temperature == 0:
        return int(torch.argmax(logits))
    scaled = logits / params.temperature
    if params.top_k > 0 and params.top_k < scaled.numel():
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    if params.top_p < 1:
        order = torch.argsort(scaled, descending=True)
        probs = torch.softmax(scaled[order], dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = torch.cumsum(probs, dim=-1) - probs >= params.top_p
        scaled = scaled.clone()
        scaled[order[drop]] = -math.inf
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _left_pad(t: torch.Tensor, width: int, dim: int = 2) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim) + [missing, 0]
    return F.pad(t, pad)


def _same_length(jobs: list[_Job]) -> list[list[_Job]]:
    groups: dict[int, list[_Job]] = {}
    for job in jobs:
        groups.setdefault(len(job.request.prompt), []).append(job)
    return list(groups.values())

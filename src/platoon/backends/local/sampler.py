"""Continuous batching: concurrent sample requests share one forward pass per decoding step.

A scheduler loop keeps one running batch per set of weights. Between steps it admits new
requests (their prompts are prefilled and their KV caches merged into the batch, left-padded)
and drops finished rows, so a request never waits for another to finish. Each step samples
one token for every row (one batched draw per kind of sampling parameters, not one per row),
checks stop conditions, and runs one batched forward with the KV cache. The torch work runs in
the engine's worker thread via `run_sync`; while no request finishes and none arrives, that
thread goes on decoding for a few milliseconds instead of handing back after every token.

A streamed request (`Sampler.stream`, one sequence) joins the same batches; while one runs, the
worker thread hands back after every token, so its reader gets each token as it is drawn.

Prompts are prefilled once: requests in one admission that share a prompt share its prefill,
and the KV cache of recent prompts is kept (per set of fixed weights), so the `group_size`
requests of one task, arriving one after another, prefill their common prompt once.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import time
from collections.abc import AsyncGenerator, Iterator
from typing import TYPE_CHECKING

import anyio
import msgspec
import numpy as np
import structlog
import torch

from platoon.backends.local.bodies import MAX_NUM_SAMPLES, MAX_TOPK
from platoon.backends.local.constraints import Grammar, Guide, Vocabulary, masked
from platoon.backends.local.engine import Engine
from platoon.backends.local.futures import RunSync
from platoon.backends.local.invariant import (
    MIN_ROWS,
    holds,
    left_padded,
    per_row_attention,
    prefill_groups,
    topped_up,
)
from platoon.backends.local.kvcache import cache_of, kv, left_pad, set_kv, stacked
from platoon.backends.local.prefixes import Prefix, PrefixCache, Space
from platoon.backends.local.proto import MASKED, SampledSequence, Topk
from platoon.backends.local.specs import EngineError, WeightsRef

if TYPE_CHECKING:
    from transformers import DynamicCache

__all__ = ["Drawn", "SampleParams", "SampleRequest", "SampleResult", "Sampler"]

log = structlog.get_logger(__name__)


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
    topk_prompt: int = 0  # top-k alternatives at each prompt position
    topk_sample: int = 0  # top-k alternatives at each sampled position
    grammar: Grammar | None = None  # a decoding constraint: each row draws only what it allows


class SampleResult(msgspec.Struct):
    sequences: list[SampledSequence]
    prompt_logprobs: list[float | None] | None
    topk_prompt: Topk | None = None
    cache_hit_tokens: int = 0


class Drawn(msgspec.Struct):
    """A streamed sequence's tokens drawn since the last `Drawn` (with their top-k alternatives
    when asked); the last one carries the whole result."""

    tokens: list[int]
    logprobs: list[float]
    topk_ids: list[list[int]]
    topk_logprobs: list[list[float]]
    result: SampleResult | None = None


class _Job:
    def __init__(self, request: SampleRequest, limit: int, device: torch.device) -> None:
        self.request = request
        self.limit = limit  # tokens this job may generate
        self.done = anyio.Event()
        self.result: SampleResult | None = None
        self.error: Exception | None = None
        self.sequences: list[SampledSequence | None] = [None] * request.num_samples
        self.prompt_logprobs: list[float | None] | None = None
        self.topk_prompt: Topk | None = None
        self.cache_hit_tokens = 0
        self.cancelled = False  # its caller gave up: its rows leave the batch at the next step
        self.rows: list[_Row] = []  # a streamed job's row, once admitted
        self.progress: anyio.Event | None = None  # a streamed job's: set after each stint of decoding
        self.drawn = 0  # a streamed job's tokens drawn by the last finished stint
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
        self.topk_ids: list[list[int]] = []
        self.topk_logprobs: list[list[float]] = []
        self.guide: Guide | None = None  # the constraint's state, when the request has one
        if job.progress is not None:  # streamed: its reader follows the row
            job.rows.append(self)


class _Batch:
    """The running rows for one set of weights, with their KV cache and attention mask."""

    def __init__(self) -> None:
        self.rows: list[_Row] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # [rows, cache length], 0 on left padding
        self.logits: torch.Tensor | None = None  # [rows, vocab], next-token logits
        self.next_tokens: list[int] = []  # the tokens just sampled, fed to the next decode
        self.space: Space | None = None  # where finished sequences are cached (None: not cached)


class Sampler:
    """Schedules sample requests onto batched decoding steps."""

    def __init__(
        self,
        engine: Engine,
        run_sync: RunSync,
        *,
        max_batch: int = 64,
        prefix_cache_bytes: int = 2**30,
        slice_seconds: float = 0.02,
        batch_invariant: bool = False,
    ) -> None:
        self.engine = engine
        # A row's numbers never depend on the rows that share its batch (`invariant`): a
        # batched forward's kernels change with the batch's size and padding (this CPU's
        # decode logits differ by ~1e-7 between 2 rows and 3), and so do the logprobs a
        # trainer's loss reads; Adam turns that into another run within a few steps. The prefix
        # cache then only where rows attend alone (`invariant.blocked_attention`: a hit's
        # numbers are a prefill's).
        self.batch_invariant = batch_invariant
        # Whether such rows still decode in one forward, not one each: probed once for each kind
        # of adapter (its products have other shapes), unless `batch_rows` is turned off.
        self.batch_rows = True
        self.batched_for: dict[object, bool] = {}
        self.rows_batched = False  # for the weights of the current step
        self._run_sync = run_sync
        self._max_batch = max_batch
        self._pending: dict[WeightsRef, list[_Job]] = {}
        self._batches: dict[WeightsRef, _Batch] = {}
        self._wakeup = anyio.Event()
        self._arrived = False  # set by the event loop, read by the worker thread between steps
        self._slice = slice_seconds
        self.prefixes = PrefixCache(prefix_cache_bytes)
        self.steps = 0
        self._streamed: set[_Job] = set()
        self._vocabulary: Vocabulary | None = None  # the token texts, read when a constraint first needs them
        # transformers 5.x names the KV cache argument `cache`; 4.x calls it `past_key_values`.
        forward = inspect.signature(engine.base.forward).parameters
        self._cache_arg = "cache" if "cache" in forward else "past_key_values"

    def check(self, request: SampleRequest) -> int:
        """Validate a request (the cheap bounds first, the prompt's ids last); return how many
        tokens it may generate. The service calls it before it answers, so a request it refuses
        is a 400 and never a failed future."""
        engine = self.engine
        prompt, params = request.prompt, request.params
        if not 1 <= request.num_samples <= MAX_NUM_SAMPLES:
            raise EngineError(
                f"num_samples must be between 1 and {MAX_NUM_SAMPLES}, got {request.num_samples}"
            )
        if not prompt:
            raise EngineError("prompt is empty")
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
        limit = min(MAX_TOPK, engine.vocab_size)
        for name, k in (
            ("topk_prompt_logprobs", request.topk_prompt),
            ("topk_sample_logprobs", request.topk_sample),
        ):
            if not 0 <= k <= limit:
                raise EngineError(f"{name} must be between 0 and {limit}, got {k}")
        bad = [t for t in params.stop_tokens if not 0 <= t < engine.vocab_size]
        if bad:
            raise EngineError(f"stop token {bad[0]} is outside the vocabulary")
        bad = [t for t in prompt if not 0 <= t < engine.vocab_size]
        if bad:
            raise EngineError(
                f"prompt holds token id {bad[0]}, outside the vocabulary [0, {engine.vocab_size})"
            )
        return min(room, params.max_tokens or room)

    @property
    def rows(self) -> int:
        """The rows being decoded now, all weights together."""
        return sum(len(batch.rows) for batch in self._batches.values())

    async def sample(self, request: SampleRequest) -> SampleResult:
        """Queue a request and wait for all its sequences."""
        job = self._queue(request)
        with self._given_up(job):
            await job.done.wait()
        return _result(job)

    async def stream(self, request: SampleRequest) -> AsyncGenerator[Drawn]:
        """Queue a request for one sequence and hand out its tokens as the batch draws them; the
        last `Drawn` carries the result `sample` would have returned. Closing the iterator early
        (its reader is gone) drops the row."""
        if request.num_samples != 1:
            raise EngineError(f"a streamed sample draws one sequence, not num_samples={request.num_samples}")
        job = self._queue(request)
        progress = job.progress = anyio.Event()
        self._streamed.add(job)
        sent = 0
        try:
            with self._given_up(job):
                while not job.done.is_set():
                    await progress.wait()
                    progress = job.progress = anyio.Event()
                    # Up to `drawn` (counted while the worker thread was idle) the row's lists
                    # are complete; the thread appends past it meanwhile.
                    if job.drawn > sent and not job.done.is_set():
                        yield _drawn(job.rows[0], sent, job.drawn)
                        sent = job.drawn
        finally:
            self._streamed.discard(job)
        result = _result(job)
        row = job.rows[0]
        yield msgspec.structs.replace(_drawn(row, sent, len(row.tokens)), result=result)

    def _queue(self, request: SampleRequest) -> _Job:
        job = _Job(request, self.check(request), self.engine.device)
        self._pending.setdefault(request.weights, []).append(job)
        self._arrived = True
        self._wakeup.set()
        return job

    @contextlib.contextmanager
    def _given_up(self, job: _Job) -> Iterator[None]:
        """Its caller gave up (cancelled: the client's cancel_future; a stream's reader gone): a
        queued job leaves the queue, a running one is marked, and the worker thread drops its
        rows when it next samples."""
        try:
            yield
        except BaseException:
            job.cancelled = True
            queue = self._pending.get(job.request.weights, [])
            if job in queue:
                queue.remove(job)
            raise

    def _stint_done(self) -> None:
        """Tell the streamed jobs what the worker thread drew (it is idle now)."""
        for job in self._streamed:
            if job.rows:
                job.drawn = len(job.rows[0].tokens)
            assert job.progress is not None
            job.progress.set()

    async def run(self) -> None:
        """The scheduler loop: decoding steps for each set of weights in turn, forever."""
        while True:
            keys = [k for k in {*self._batches, *self._pending} if self._has_work(k)]
            if not keys:
                self._wakeup = anyio.Event()
                await self._wakeup.wait()
                continue
            alone = len(keys) == 1
            for key in keys:
                batch = self._batches.setdefault(key, _Batch())
                room = self._max_batch - len(batch.rows)
                admitted: list[_Job] = []
                queue = self._pending.get(key, [])
                while queue and (room >= queue[0].request.num_samples or (not batch.rows and not admitted)):
                    job = queue.pop(0)
                    room -= job.request.num_samples
                    admitted.append(job)
                self._arrived = False
                try:
                    finished = await self._run_sync(
                        functools.partial(self._step, key, batch, admitted, alone)
                    )
                except Exception as exc:
                    self._fail(key, batch, admitted, exc)
                    self._stint_done()
                    continue
                for job in finished:
                    job.done.set()
                self._stint_done()
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
    def _step(
        self, key: WeightsRef, batch: _Batch, admitted: list[_Job], keep_going: bool = False
    ) -> list[_Job]:
        """Admit jobs and decode one token for every row; with `keep_going`, go on decoding
        until a job finishes, a request arrives, a job streams or the time slice is used up."""
        deadline = time.monotonic() + self._slice
        with self.engine.weights(key) as model, self._attending(model):
            batch.space = self._space(key)
            if admitted:
                self._prefill(model, batch, key, admitted)
            while True:
                finished = self._sample(batch)
                if batch.rows:
                    self._decode(model, batch)
                self.steps += 1
                if (
                    finished
                    or not batch.rows
                    or not keep_going
                    or self._arrived
                    or self._streamed  # a streamed job's reader gets each token as it is drawn
                    or time.monotonic() > deadline
                ):
                    return finished

    def _attending(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Row-by-row attention, for batch-invariant rows decoded in one forward."""
        if not (self.batch_invariant and self.batch_rows):
            return contextlib.nullcontext()
        kind = self.engine.adapter_kind()
        if kind not in self.batched_for:
            self.batched_for[kind] = self.engine.attention == "sdpa" and holds(model, self._cache_arg)
            log.info("reproducible sampling", batched=self.batched_for[kind], adapter=kind)
        self.rows_batched = self.batched_for[kind]
        return per_row_attention(model) if self.rows_batched else contextlib.nullcontext()

    def _space(self, ref: WeightsRef) -> Space | None:
        if ref.model_id is not None:
            return None  # live training weights change under the cache
        if self.batch_invariant and not self.rows_batched:
            return None  # a row decoded alone has other numbers than in a prefill
        return (ref.key, self.engine.generations.get(ref.key or "", 0))

    def _prefill(self, model: torch.nn.Module, batch: _Batch, ref: WeightsRef, jobs: list[_Job]) -> None:
        """Each distinct prompt once (from the prefix cache when it holds it), then every job's
        rows merged into the running batch."""
        device = self.engine.device
        prompts: dict[tuple[int, ...], list[_Job]] = {}
        for job in jobs:
            prompts.setdefault(tuple(job.request.prompt), []).append(job)
        ready: dict[tuple[int, ...], Prefix] = {}
        cached: dict[tuple[int, ...], tuple[Prefix, int]] = {}  # a prompt's cached start, its tokens reused
        space = batch.space
        for prompt, group in prompts.items():
            wants_all = any(j.request.prompt_logprobs or j.request.topk_prompt for j in group)
            entry = self.prefixes.longest(space, prompt) if space is not None and not wants_all else None
            if entry is None:
                continue
            if entry.tokens == len(prompt) and entry.logits is not None:
                ready[prompt] = entry
                hit = len(prompt)
            else:
                hit = min(entry.tokens, len(prompt) - 1)
                cached[prompt] = (entry, hit)
            for job in group:
                job.cache_hit_tokens = hit
        missing = [prompt for prompt in prompts if prompt not in ready]
        hits = {prompt: hit for prompt, (_, hit) in cached.items()}
        for same in prefill_groups(missing, hits, self.batch_invariant, self.rows_batched):
            ready |= self._run_prompts(model, space, same, prompts, cached)
        new_rows: list[_Row] = []
        starts: list[list[tuple[torch.Tensor, torch.Tensor]]] = []  # each new row's prompt's KV cache
        logits: list[torch.Tensor] = []
        lengths: list[int] = []
        for prompt, group in prompts.items():
            entry = ready[prompt]
            assert entry.logits is not None
            count = sum(j.request.num_samples for j in group)
            starts += [entry.layers] * count
            logits.append(entry.logits.expand(count, -1))
            lengths.extend([len(prompt)] * count)
            new_rows.extend(
                _Row(job, k, len(prompt)) for job in group for k in range(job.request.num_samples)
            )
        width = max(lengths) if batch.mask is None else max(max(lengths), batch.mask.shape[1])
        mask = torch.cat(
            [left_pad(torch.ones(1, n, dtype=torch.long, device=device), width, dim=1) for n in lengths]
        )
        new = stacked(starts, lengths, width)
        new_logits = torch.cat(logits)
        if not batch.rows:
            from transformers import DynamicCache

            cache = DynamicCache()
            for i, (keys, values) in enumerate(new):
                cache.update(keys, values, i)
            batch.cache, batch.mask, batch.logits = cache, mask, new_logits
        else:
            assert batch.cache is not None and batch.mask is not None and batch.logits is not None
            for layer, (keys, values) in zip(batch.cache.layers, new, strict=True):
                held_keys, held_values = kv(layer)
                set_kv(
                    layer,
                    torch.cat([left_pad(held_keys, width), keys]),
                    torch.cat([left_pad(held_values, width), values]),
                )
            batch.mask = torch.cat([left_pad(batch.mask, width, dim=1), mask])
            batch.logits = torch.cat([batch.logits, new_logits])
        batch.rows.extend(new_rows)

    def _run_prompts(
        self,
        model: torch.nn.Module,
        space: Space | None,
        prompts: list[tuple[int, ...]],
        jobs: dict[tuple[int, ...], list[_Job]],
        cached: dict[tuple[int, ...], tuple[Prefix, int]],
    ) -> dict[tuple[int, ...], Prefix]:
        """Prefill prompts in one forward, each on top of its `cached` start when it has one,
        left-padded where rows attend alone (`prefill_groups`); fill in prompt logprobs and top-k."""
        from transformers import DynamicCache

        device = self.engine.device
        wanted = [any(j.request.prompt_logprobs or j.request.topk_prompt for j in jobs[p]) for p in prompts]
        # The forward's queries: the most tokens a row adds; a row that adds fewer reads some of
        # its cached tokens again (the same numbers, as `holds` checked).
        queries = max(len(p) - cached[p][1] if p in cached else len(p) for p in prompts)
        reused = [max(0, len(p) - queries) for p in prompts]
        ids, padding = left_padded([p[n:] for p, n in zip(prompts, reused, strict=True)], device, reused)
        held: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer: the rows' reused keys, values
        if any(reused):
            held = stacked(
                [cached[p][0].layers if n else None for p, n in zip(prompts, reused, strict=True)], reused
            )
        width = ids.shape[1]
        keep = 0 if any(wanted) else 1
        if self.rows_batched:  # every product at least MIN_ROWS rows: copies of short prompts
            keep = keep and min(width, MIN_ROWS)
            copies = -(-MIN_ROWS // ((keep or width) * len(prompts)))
            ids = ids.repeat(copies, 1)
            padding = {name: t.repeat(copies, 1) for name, t in padding.items()}
            held = [(k.repeat(copies, 1, 1, 1), v.repeat(copies, 1, 1, 1)) for k, v in held]
        cache = DynamicCache()
        for i, (keys, values) in enumerate(held):
            cache.update(keys, values, i)
        out = model(
            input_ids=ids,
            use_cache=True,
            logits_to_keep=keep,
            **padding,
            **{self._cache_arg: cache},
        )
        logits = out.logits.float()
        cache = cache_of(out)
        ready: dict[tuple[int, ...], Prefix] = {}
        for i, prompt in enumerate(prompts):
            entry = Prefix(
                layers=[
                    (keys[i : i + 1, :, -len(prompt) :], values[i : i + 1, :, -len(prompt) :])
                    for keys, values in map(kv, cache.layers)
                ],
                logits=logits[i, -1:],
                tokens=len(prompt),
            )
            ready[prompt] = entry
            if space is not None:
                layers = [(k.clone(), v.clone()) for k, v in entry.layers]
                assert entry.logits is not None
                self.prefixes.put(
                    space, prompt, Prefix(layers=layers, logits=entry.logits.clone(), tokens=entry.tokens)
                )
            if wanted[i]:  # such a prompt took nothing from the cache: all of it is in the ids
                start = width - len(prompt)
                self._score_prompt(logits[i, start:-1], ids[i, start:], jobs[prompt])
        return ready

    @staticmethod
    def _score_prompt(logits: torch.Tensor, ids: torch.Tensor, jobs: list[_Job]) -> None:
        logprobs = torch.log_softmax(logits, dim=-1)
        scored: list[float | None] = [None, *logprobs.gather(-1, ids[1:, None])[:, 0].tolist()]
        k = max(j.request.topk_prompt for j in jobs)
        topk = None
        if k:
            values, indices = torch.topk(logprobs, k, dim=-1)
            token_ids = np.zeros((len(ids), k), dtype=np.int32)
            top = np.full((len(ids), k), MASKED, dtype=np.float32)
            token_ids[1:], top[1:] = indices.cpu().numpy(), values.cpu().numpy()
            topk = (token_ids, top)
        for job in jobs:
            if job.request.prompt_logprobs:
                job.prompt_logprobs = scored
            n = job.request.topk_prompt
            if n and topk is not None:
                job.topk_prompt = Topk(token_ids=topk[0][:, :n].copy(), logprobs=topk[1][:, :n].copy())

    def _sample(self, batch: _Batch) -> list[_Job]:
        assert batch.logits is not None
        # The recorded logprobs are the model's own, unconstrained: those the trainer computes
        # again, so a constrained row's importance ratio is 1 on the weights that sampled it.
        logprobs = torch.log_softmax(batch.logits, dim=-1)
        tokens = self._choose(batch, self._constrained(batch))
        chosen = logprobs.gather(-1, tokens[:, None])[:, 0].tolist()
        token_list = tokens.tolist()
        k = max((r.job.request.topk_sample for r in batch.rows), default=0)
        top_ids: list[list[int]] = []
        top_values: list[list[float]] = []
        if k:
            values, indices = torch.topk(logprobs, k, dim=-1)
            top_ids, top_values = indices.tolist(), values.tolist()
        keep: list[int] = []
        finished: list[_Job] = []
        for i, row in enumerate(batch.rows):
            if row.job.cancelled:
                continue
            token = token_list[i]
            row.tokens.append(token)
            row.logprobs.append(chosen[i])
            if row.guide is not None:
                row.guide.advance(token)
            n = row.job.request.topk_sample
            if n:
                row.topk_ids.append(top_ids[i][:n])
                row.topk_logprobs.append(top_values[i][:n])
            reason = self._stop_reason(row, token)
            if reason is None:
                keep.append(i)
                continue
            job = row.job
            if batch.space is not None and row.position > len(job.request.prompt):
                self._keep_sequence(batch, i, row)
            topk = None
            if n:
                topk = Topk(
                    token_ids=np.asarray(row.topk_ids, dtype=np.int32).reshape(-1, n),
                    logprobs=np.asarray(row.topk_logprobs, dtype=np.float32).reshape(-1, n),
                )
            job.sequences[row.index] = SampledSequence(
                tokens=row.tokens, logprobs=row.logprobs, stop_reason=reason, topk=topk
            )
            if all(s is not None for s in job.sequences):
                job.result = SampleResult(
                    sequences=list(job.sequences),  # type: ignore[arg-type]
                    prompt_logprobs=job.prompt_logprobs,
                    topk_prompt=job.topk_prompt,
                    cache_hit_tokens=job.cache_hit_tokens,
                )
                finished.append(job)
        if len(keep) < len(batch.rows):
            index = torch.tensor(keep, dtype=torch.long, device=batch.logits.device)
            batch.rows = [batch.rows[i] for i in keep]
            if batch.rows:
                assert batch.cache is not None
                for layer in batch.cache.layers:
                    keys, values = kv(layer)
                    set_kv(layer, keys[index], values[index])
                assert batch.mask is not None
                batch.mask = batch.mask[index]
            else:
                batch.cache = batch.mask = batch.logits = None
        batch.next_tokens = [token_list[i] for i in keep]
        return finished

    def _keep_sequence(self, batch: _Batch, index: int, row: _Row) -> None:
        """Cache a finished sequence's KV (prompt and completion but its last, unfed token):
        the agent's next turn starts with it."""
        assert batch.space is not None
        assert batch.cache is not None
        n = row.position
        layers = [
            (keys[index : index + 1, :, -n:].clone(), values[index : index + 1, :, -n:].clone())
            for keys, values in map(kv, batch.cache.layers)
        ]
        tokens = (*row.job.request.prompt, *row.tokens[:-1])
        self.prefixes.put(batch.space, tokens, Prefix(layers=layers, logits=None, tokens=n))

    def vocabulary(self, size: int | None = None) -> Vocabulary:
        """The token texts the constraints decode with (read once, when first needed); `size`:
        the logits' width, where known."""
        if self._vocabulary is None:
            self._vocabulary = Vocabulary(self.engine.tokenizer, size or self.engine.vocab_size)
        return self._vocabulary

    def _constrained(self, batch: _Batch) -> torch.Tensor:
        """The logits to draw from: a constrained row's with what its constraint does not allow
        next at -inf (a vocabulary-sized mask for those rows only)."""
        assert batch.logits is not None
        guides: dict[int, Guide] = {}
        for i, row in enumerate(batch.rows):
            grammar = row.job.request.grammar
            if grammar is not None:
                if row.guide is None:
                    stops = sorted(row.job.request.params.stop_tokens)
                    row.guide = Guide(grammar, self.vocabulary(batch.logits.shape[-1]), stops)
                guides[i] = row.guide
        if not guides:
            return batch.logits
        rooms = {i: batch.rows[i].job.limit - len(batch.rows[i].tokens) - 1 for i in guides}
        return masked(batch.logits, guides, rooms)

    def _choose(self, batch: _Batch, logits: torch.Tensor) -> torch.Tensor:
        """One token per row: one batched draw per kind of parameters. A seeded request's row
        draws from its own generator, so its token does not depend on the other rows."""
        groups: dict[tuple[float, int, float], list[int]] = {}
        for i, row in enumerate(batch.rows):
            params = row.job.request.params
            groups.setdefault((params.temperature, params.top_k, params.top_p), []).append(i)
        if len(groups) == 1:
            rows = batch.rows
            return _draw(logits, rows[0].job.request.params, [r.job.generator for r in rows])
        chosen = torch.zeros(len(batch.rows), dtype=torch.long, device=logits.device)
        for indices in groups.values():
            rows = [batch.rows[i] for i in indices]
            index = torch.tensor(indices, dtype=torch.long, device=logits.device)
            chosen[index] = _draw(logits[index], rows[0].job.request.params, [r.job.generator for r in rows])
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

    def _decode(self, model: torch.nn.Module, batch: _Batch) -> None:
        assert batch.mask is not None
        if self.batch_invariant and not self.rows_batched:
            self._decode_each(model, batch)
            return
        assert batch.cache is not None
        device = self.engine.device
        ids = torch.tensor(batch.next_tokens, dtype=torch.long, device=device)[:, None]
        positions = torch.tensor([r.position for r in batch.rows], dtype=torch.long, device=device)[:, None]
        batch.mask = mask = torch.cat([batch.mask, torch.ones_like(batch.mask[:, :1])], dim=1)
        rows = len(batch.rows)
        extra = topped_up(rows) if self.rows_batched else None
        if extra is not None:  # a short batch-invariant batch: copies of its first row, then dropped
            index = extra.to(device)
            ids, positions, mask = ids[index], positions[index], mask[index]
            for layer in batch.cache.layers:
                set_kv(layer, *(t[index] for t in kv(layer)))
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **{self._cache_arg: batch.cache},
        )
        batch.cache = cache_of(out)
        if extra is not None:
            for layer in batch.cache.layers:
                set_kv(layer, *(t[:rows] for t in kv(layer)))
        batch.logits = out.logits[:rows, -1].float()
        for row in batch.rows:
            row.position += 1

    def _decode_each(self, model: torch.nn.Module, batch: _Batch) -> None:
        """`_decode`, one forward per row on the row's own cache without its padding (a row's
        tokens are the last `position` of its left-padded cache)."""
        from transformers import DynamicCache

        assert batch.cache is not None and batch.mask is not None
        device = self.engine.device
        held = [kv(layer) for layer in batch.cache.layers]
        added: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = [([], []) for _ in held]
        logits: list[torch.Tensor] = []
        for i, row in enumerate(batch.rows):
            cache = DynamicCache()
            for layer, (keys, values) in enumerate(held):
                cache.update(
                    keys[i : i + 1, :, -row.position :], values[i : i + 1, :, -row.position :], layer
                )
            out = model(
                input_ids=torch.tensor([[batch.next_tokens[i]]], dtype=torch.long, device=device),
                attention_mask=torch.ones(1, row.position + 1, dtype=torch.long, device=device),
                position_ids=torch.tensor([[row.position]], dtype=torch.long, device=device),
                use_cache=True,
                **{self._cache_arg: cache},
            )
            for layer, (keys, values) in enumerate(map(kv, cache_of(out).layers)):
                added[layer][0].append(keys[:, :, -1:])
                added[layer][1].append(values[:, :, -1:])
            logits.append(out.logits[:, -1].float())
        for layer, (keys, values), (new_keys, new_values) in zip(
            batch.cache.layers, held, added, strict=True
        ):
            set_kv(
                layer,
                torch.cat([keys, torch.cat(new_keys)], dim=2),
                torch.cat([values, torch.cat(new_values)], dim=2),
            )
        batch.mask = torch.cat([batch.mask, torch.ones_like(batch.mask[:, :1])], dim=1)
        batch.logits = torch.cat(logits)
        for row in batch.rows:
            row.position += 1


def _result(job: _Job) -> SampleResult:
    if job.error is not None:
        raise job.error
    assert job.result is not None
    return job.result


def _drawn(row: _Row, start: int, end: int) -> Drawn:
    return Drawn(
        tokens=row.tokens[start:end],
        logprobs=row.logprobs[start:end],
        topk_ids=row.topk_ids[start:end],
        topk_logprobs=row.topk_logprobs[start:end],
    )


def _draw(
    logits: torch.Tensor, params: SampleParams, generators: list[torch.Generator | None]
) -> torch.Tensor:
    """One token per row of `logits` [rows, vocab] under `params`; row i draws from
    `generators[i]` when it has one."""
    if params.temperature == 0:
        return torch.argmax(logits, dim=-1)
    scaled = logits / params.temperature
    if params.top_k > 0 and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    if params.top_p < 1:
        ordered, order = torch.sort(scaled, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = torch.cumsum(probs, dim=-1) - probs >= params.top_p
        scaled = scaled.scatter(-1, order, ordered.masked_fill(drop, -math.inf))
    probs = torch.softmax(scaled, dim=-1)
    if all(g is None for g in generators):
        return torch.multinomial(probs, 1)[:, 0]
    # Seeded rows: one uniform number from each row's own generator, then the inverse of the
    # rows' CDFs in one batched search (not one multinomial per row).
    device = logits.device
    uniform = torch.stack([torch.rand((), generator=g, device=device) for g in generators])
    cdf = torch.cumsum(probs.float(), dim=-1)
    total = cdf[:, -1:]
    # Strictly below the total, so that a token of probability 0 past the last kept one is never drawn.
    target = torch.minimum(uniform[:, None].to(cdf.dtype) * total, total * (1 - 1e-6))
    return torch.searchsorted(cdf, target, right=True)[:, 0].clamp_(max=probs.shape[-1] - 1)

"""What `stable_reinforce` trains on: the sequences a sampler recorded, and datums' provenance.

A sampling request with `record_stability_info` leaves, for each sampled sequence, its prompt,
its tokens and the logprobs the sampler gave them, under the sequence's `sequence_id`. Records
belong to the session that sampled them and last a day after their last use (sampling, or a
training request naming them), as hosted Tinker documents. A training datum claims, through
its provenance spans, which recorded positions its input and target tokens are; the claims
are checked token by token, and the targets' sampled positions get the recorded logprobs
(`sampler_logprobs`) and a 1 in `sampled`, the inputs the loss reads.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from platoon.backends.local.proto import Datum, SampledSequence, Span
from platoon.backends.local.specs import EngineError

__all__ = ["StabilityRecords"]

DAY = 86400.0


class _Record:
    __slots__ = ("logprobs", "prompt", "session_id", "tokens", "used_at")

    def __init__(self, session_id: str, prompt: np.ndarray, sequence: SampledSequence, now: float) -> None:
        self.session_id = session_id
        self.prompt = prompt  # shared by the sequences of one request
        self.tokens = np.asarray(sequence.tokens, dtype=np.int64)
        self.logprobs = np.asarray(sequence.logprobs, dtype=np.float32)
        self.used_at = now


class StabilityRecords:
    """Recorded sequences by `sequence_id`, oldest use first; at most `max_sequences` are kept."""

    def __init__(self, *, ttl: float = DAY, max_sequences: int = 1_000_000) -> None:
        self.ttl = ttl
        self.max_sequences = max_sequences
        self._records: OrderedDict[str, _Record] = OrderedDict()

    def __len__(self) -> int:
        return len(self._records)

    def record(
        self,
        session_id: str,
        sequence_ids: Sequence[str],
        prompt: Sequence[int],
        sequences: Sequence[SampledSequence],
    ) -> None:
        now = time.time()
        self._expire(now)
        shared = np.asarray(prompt, dtype=np.int64)
        for sequence_id, sequence in zip(sequence_ids, sequences, strict=True):
            self._records[sequence_id] = _Record(session_id, shared, sequence, now)
            self._records.move_to_end(sequence_id)
        while len(self._records) > self.max_sequences:
            self._records.popitem(last=False)

    def forget_session(self, session_id: str) -> None:
        for sequence_id in [k for k, r in self._records.items() if r.session_id == session_id]:
            del self._records[sequence_id]

    def _expire(self, now: float) -> None:
        while self._records:
            sequence_id, oldest = next(iter(self._records.items()))
            if now - oldest.used_at <= self.ttl:
                return
            del self._records[sequence_id]

    def _get(self, session_id: str, sequence_id: str, where: str) -> _Record:
        record = self._records.get(sequence_id)
        if record is None or record.session_id != session_id:
            raise EngineError(
                f"{where}: sequence {sequence_id!r} was not recorded in this session (sample with "
                "record_stability_info=True in the training client's session; records last a day)"
            )
        return record

    def resolve(self, session_id: str, index: int, datum: Datum) -> dict[str, np.ndarray]:
        """Check a datum's provenance against the records; return `sampler_logprobs` and
        `sampled` for its targets."""
        where = f"datum {index}"
        if datum.spans is None:
            raise EngineError(
                f"{where}: loss_fn 'stable_reinforce' needs provenance on every datum "
                "(Datum.with_provenance, naming the sequence_ids the sampler returned)"
            )
        targets = datum.inputs.get("target_tokens")
        if targets is None:
            raise EngineError(f"{where}: loss_fn 'stable_reinforce' needs loss_fn_inputs ['target_tokens']")
        input_spans, target_spans = datum.spans
        now = time.time()
        used: list[_Record] = []
        self._check(session_id, f"{where}: model_input", datum.tokens, input_spans, used, prompts=True)
        logprobs = np.zeros(targets.size, dtype=np.float32)
        sampled = np.zeros(targets.size, dtype=np.float32)
        for start, span, record in self._check(
            session_id, f"{where}: target_tokens", targets.astype(np.int64), target_spans, used, prompts=False
        ):
            if span.sampled:
                logprobs[start : start + span.length] = record.logprobs[
                    span.offset : span.offset + span.length
                ]
                sampled[start : start + span.length] = 1.0
        for record in used:
            record.used_at = now
        return {"sampler_logprobs": logprobs, "sampled": sampled}

    def _check(
        self,
        session_id: str,
        where: str,
        tokens: np.ndarray,
        spans: Sequence[Span],
        used: list[_Record],
        *,
        prompts: bool,
    ) -> list[tuple[int, Span, _Record]]:
        """Each span's positions against the record it names. Targets on prompt positions carry
        no loss and are placeholders in the cookbook's datums (0), so there only their place in
        the prompt is checked (`prompts=False`)."""
        covered = sum(span.length for span in spans)
        if covered != tokens.size:
            raise EngineError(f"{where}: provenance spans cover {covered} positions of {tokens.size}")
        runs = []
        start = 0
        for span in spans:
            record = self._get(session_id, span.sequence_id, where)
            source = record.tokens if span.sampled else record.prompt
            kind = "sampled tokens" if span.sampled else "prompt"
            end = span.offset + span.length
            compare = span.sampled or prompts
            if end > source.size or (
                compare and not np.array_equal(tokens[start : start + span.length], source[span.offset : end])
            ):
                raise EngineError(
                    f"{where}: positions {start}..{start + span.length} are not positions "
                    f"{span.offset}..{end} of sequence {span.sequence_id!r}'s {kind}"
                )
            used.append(record)
            runs.append((start, span, record))
            start += span.length
        return runs

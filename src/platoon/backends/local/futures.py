"""Futures as the Tinker API serves them, and per-model ordering of training requests.

Each training or sampling POST answers at once with a request id; the client then long-polls
`retrieve_future`. A retried POST carries the same (model, seq_id), so the store answers it
with the first request's id instead of running the work twice. Training requests of one
model run strictly in seq_id order, whatever order they arrive in.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Hashable
from typing import Protocol, TypeVar

import anyio
import msgspec

__all__ = [
    "CompletionLog",
    "FutureStore",
    "Outcome",
    "SeqError",
    "SeqQueue",
    "SyncJob",
    "failure",
    "json_outcome",
    "proto_outcome",
]

PROTO = "application/x-protobuf"


class Outcome(msgspec.Struct, frozen=True):
    """A finished future: the body `retrieve_future` answers with."""

    body: bytes
    content_type: str = "application/json"
    ok: bool = True  # False: a failure the SDK raises as RequestFailedError


def json_outcome(value: object) -> Outcome:
    return Outcome(msgspec.json.encode(value))


def proto_outcome(body: bytes) -> Outcome:
    return Outcome(body, PROTO)


def failure(message: str, category: str = "user") -> Outcome:
    """A failed request as the SDK reads it: it raises `RequestFailedError` with the message."""
    return Outcome(msgspec.json.encode({"error": message, "category": category}), ok=False)


class _Future:
    __slots__ = ("done", "finished_at", "outcome", "retrieved_at")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.outcome: Outcome | None = None
        self.finished_at: float | None = None
        self.retrieved_at: float | None = None


class FutureStore:
    """Request ids to results, deduplicated by an optional idempotency key.

    A result stays for `keep_retrieved` seconds after its first retrieval (a client may
    retry the poll) and `keep_unretrieved` seconds if nobody asks for it.
    """

    def __init__(self, *, keep_retrieved: float = 300.0, keep_unretrieved: float = 3600.0) -> None:
        self._futures: dict[str, _Future] = {}
        self._keys: dict[Hashable, str] = {}
        self._key_of: dict[str, Hashable] = {}
        self._keep_retrieved = keep_retrieved
        self._keep_unretrieved = keep_unretrieved

    def __len__(self) -> int:
        return len(self._futures)

    def create(self, key: Hashable | None = None) -> tuple[str, bool]:
        """A request id for new work, or `(existing id, False)` when `key` was seen before."""
        if key is not None and key in self._keys:
            return self._keys[key], False
        self._prune()
        request_id = uuid.uuid4().hex
        self._futures[request_id] = _Future()
        if key is not None:
            self._keys[key] = request_id
            self._key_of[request_id] = key
        return request_id, True

    def of_key(self, key: Hashable) -> str | None:
        """The request id already made for `key` (a retried request), if any."""
        return self._keys.get(key)

    def resolve(self, request_id: str, outcome: Outcome) -> None:
        future = self._futures.get(request_id)
        if future is None or future.outcome is not None:
            return
        future.outcome = outcome
        future.finished_at = time.monotonic()
        future.done.set()

    def known(self, request_id: str) -> bool:
        return request_id in self._futures

    def outcome(self, request_id: str) -> Outcome | None:
        future = self._futures.get(request_id)
        return future.outcome if future is not None else None

    def retrieved(self, request_id: str) -> None:
        """The client has the result: keep it only `keep_retrieved` seconds more."""
        future = self._futures.get(request_id)
        if future is not None and future.outcome is not None and future.retrieved_at is None:
            future.retrieved_at = time.monotonic()

    async def wait(self, request_id: str, timeout: float) -> Outcome | None:
        """The outcome, or None if it is still pending after `timeout` seconds."""
        future = self._futures.get(request_id)
        if future is None:
            raise KeyError(request_id)
        with anyio.move_on_after(timeout):
            await future.done.wait()
        if future.outcome is not None and future.retrieved_at is None:
            future.retrieved_at = time.monotonic()
        return future.outcome

    def _prune(self) -> None:
        now = time.monotonic()
        stale = [
            rid
            for rid, f in self._futures.items()
            if (f.retrieved_at is not None and now - f.retrieved_at > self._keep_retrieved)
            or (f.finished_at is not None and now - f.finished_at > self._keep_unretrieved)
        ]
        for rid in stale:
            del self._futures[rid]
            key = self._key_of.pop(rid, None)
            if key is not None:
                self._keys.pop(key, None)


class Completion(msgspec.Struct, frozen=True):
    cursor: int
    request_id: str
    ok: bool
    size: int


class CompletionLog:
    """Finished requests of each target (a sampling session and clone), numbered from 1: what
    `retrieve_futures` reports after the cursor a client has seen. A target keeps at most
    `keep` unacknowledged completions (a client that never polls costs no more)."""

    def __init__(self, keep: int = 10_000) -> None:
        self._keep = keep
        self._events: dict[Hashable, list[Completion]] = {}
        self._last: dict[Hashable, int] = {}
        self._changed: dict[Hashable, anyio.Event] = {}

    def add(self, target: Hashable, request_id: str, outcome: Outcome) -> None:
        cursor = self._last.get(target, 0) + 1
        self._last[target] = cursor
        events = self._events.setdefault(target, [])
        events.append(Completion(cursor, request_id, outcome.ok, len(outcome.body)))
        del events[: max(0, len(events) - self._keep)]
        changed = self._changed.pop(target, None)
        if changed is not None:
            changed.set()

    async def after(self, target: Hashable, cursor: int, timeout: float) -> tuple[list[Completion], int]:
        """The completions numbered above `cursor` (dropping those at or below it, which the
        client has seen), waiting up to `timeout` seconds for one; and the cursor to pass next."""
        events = self._events.get(target, [])
        events[:] = [e for e in events if e.cursor > cursor]
        if not events and timeout > 0:
            changed = self._changed.setdefault(target, anyio.Event())
            with anyio.move_on_after(timeout):
                await changed.wait()
            events = [e for e in self._events.get(target, []) if e.cursor > cursor]
        return events, max([cursor, *(e.cursor for e in events)])

    def forget(self, targets: Callable[[Hashable], bool]) -> None:
        for target in [t for t in self._events if targets(t)]:
            del self._events[target]
            self._last.pop(target, None)


class SeqError(ValueError):
    """A seq_id that can never run: already past, submitted twice, or too far ahead."""


class SyncJob:
    """A job whose work is synchronous (torch): `compute` runs in the worker thread, `finish`
    on the event loop with what it returned. Consecutive ready ones run in one hand-off to the
    thread, so a forward_backward and the optim_step queued behind it cost one round trip."""

    __slots__ = ("compute", "finish")

    def __init__(self, compute: Callable[[], Outcome], finish: Callable[[Outcome], None]) -> None:
        self.compute = compute
        self.finish = finish


Job = Callable[[], Awaitable[None]] | SyncJob
CHAIN_SECONDS = 1.0  # how long one hand-off may go on computing jobs that arrive behind it
T = TypeVar("T")


class RunSync(Protocol):
    """Runs a synchronous function somewhere (the server's worker thread) and awaits it."""

    def __call__(self, fn: Callable[[], T], /) -> Awaitable[T]: ...


async def _inline(fn: Callable[[], T]) -> T:
    return fn()


class SeqQueue:
    """Runs one model's jobs strictly in seq_id order, starting at `first`.

    `run_group` runs a function of a group of `SyncJob`s (in the worker thread, for the server);
    by default it runs inline.
    """

    def __init__(self, first: int = 1, run_group: RunSync = _inline, *, ahead: int | None = None) -> None:
        self.next = first
        self.ahead = ahead  # how far past `next` a seq_id may be (None: any)
        self._jobs: dict[int, tuple[str, Job]] = {}
        self._wakeup = anyio.Event()
        self._run_group = run_group
        self.closed = False

    def check(self, seq_id: int) -> None:
        """Refuse a seq_id that could never run, or that would wait for more than `ahead` others."""
        if seq_id < self.next or seq_id in self._jobs:
            raise SeqError(f"seq_id {seq_id} was already used (next expected: {self.next})")
        if self.ahead is not None and seq_id > self.next + self.ahead:
            raise SeqError(
                f"seq_id {seq_id} is more than {self.ahead} ahead of the next expected ({self.next}): "
                "it would wait, holding its body, for requests that may never come"
            )

    def submit(self, seq_id: int, request_id: str, job: Job) -> None:
        self.check(seq_id)
        self._jobs[seq_id] = (request_id, job)
        if seq_id == self.next:
            self._wakeup.set()

    async def run(self) -> list[str]:
        """Run jobs as their turn comes. Once closed, return the request ids left waiting
        for a seq_id that never came."""
        while True:
            entry = self._jobs.pop(self.next, None)
            if entry is None:
                if self.closed:
                    left = [rid for _, (rid, _) in sorted(self._jobs.items())]
                    self._jobs.clear()
                    return left
                self._wakeup = anyio.Event()
                await self._wakeup.wait()
                continue
            self.next += 1
            job = entry[1]
            if not isinstance(job, SyncJob):
                await job()
                continue
            results = await self._run_group(functools.partial(self._chain, job))
            for done, result in results:
                done.finish(result)

    def _chain(self, job: SyncJob) -> list[tuple[SyncJob, Outcome]]:
        """Compute `job`, then each `SyncJob` that has arrived for the next seq_id meanwhile
        (for up to `CHAIN_SECONDS`). Runs in the worker thread while `run` waits for it, so only
        `submit` (which adds, never removes) touches the jobs at the same time."""
        done: list[tuple[SyncJob, Outcome]] = []
        deadline = time.monotonic() + CHAIN_SECONDS
        while True:
            done.append((job, job.compute()))
            following = self._jobs.get(self.next, (None, None))[1]
            if not isinstance(following, SyncJob) or time.monotonic() > deadline:
                return done
            del self._jobs[self.next]
            self.next += 1
            job = following

    def close(self) -> None:
        self.closed = True
        self._wakeup.set()

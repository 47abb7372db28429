"""One trainer, rollout workers on many machines: what each side adds to its bus for NATS.

    trainer:  scheduler --EpisodeRequested (work, offered)-->  NATS queue group  --> one worker
              PolicyAnnouncer --PolicyAnnounced (mirror, every few s)--> every worker
              LeaseKeeper: a claimed episode with no sign of life for `lease` s is re-requested
    worker:   env services, gateway, runner, grader; ResultSeal
              --EpisodeStarted..EpisodeGraded, EpisodeSealed (JetStream)--> trainer

Why these choices:

* **The trainer plays no rollouts itself** when `nats:` is set. Its machine trains; one path
  for results (JetStream) keeps the event log the same whichever worker played an episode.
  It still runs the env services, to list tasks.
* **A late worker learns the policy from a periodic announcement**, not a request/reply: the
  trainer re-publishes the current policy (`PolicyAnnounced`) every `nats.announce_every`
  seconds and at once after each update. An announcement lost while NATS restarts is
  repaired by the next one, nothing on the trainer has to answer, and a worker needs no
  extra round trip. A worker takes no work until it knows a policy, and holds a request
  until it knows the version the request was made for (`policy_wait` s at most).
* **A seal makes results whole.** The bridge sends each event type on its own, so after a
  reconnect an episode's grade may arrive before one of its model calls. The worker follows
  each grade with `EpisodeSealed` (how many calls and agents it sent), and the credit
  assigner (`sealed=True`) counts an episode only once all of them are in.
* **Work is offered, not pushed** (see `platoon.bus.nats`): a worker plays a request only after
  claiming it, an unclaimed offer goes to another worker after `nats.offer_timeout`, and a
  worker's place in the queue group lasts a few offers, renewed only while it runs. So a hung
  worker (SIGSTOP: its connection stays up) drops out of the group by itself, and what it held
  goes to live workers; the lease keeper re-requests its episodes in flight.
* **Leases.** A lease starts when a worker claims the episode (the trainer's bridge publishes
  `WorkClaimed`); an episode nobody has claimed yet is the offer protocol's to place, so work
  queued behind busy workers never expires. The lease keeper re-requests a claimed episode
  whose worker went silent under a new id in the same group, with `attempt + 1`, and
  publishes `EpisodeAbandoned` so that the credit assigner drops whatever of the old one
  still arrives. After `max_attempts` it gives up and the episode counts as failed.
  Evaluation episodes are re-requested under a new id too (the evaluator follows
  `EpisodeAbandoned.replaced_by`), so no episode is played twice under one id when the silent
  worker comes back.
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import anyio
import msgspec
import structlog

from platoon.bus import Bus, ComponentBase, Stream
from platoon.bus.events import (
    AgentFinished,
    AgentSpawned,
    EpisodeAbandoned,
    EpisodeFinished,
    EpisodeGraded,
    EpisodeRequested,
    EpisodeSealed,
    EpisodeStarted,
    Event,
    ModelCallFinished,
    PolicyAnnounced,
    PolicyUpdated,
    RunFinished,
    WorkClaimed,
    WorkerStatus,
    new_id,
)

__all__ = [
    "FACTS",
    "RESULT_TYPES",
    "DistributedError",
    "EpisodeAbandoned",
    "EpisodeSealed",
    "LeaseKeeper",
    "PolicyAnnounced",
    "PolicyAnnouncer",
    "WorkerRegistry",
    "WorkerStatus",
    "identity_mismatch",
    "parsers_identity",
    "worker_name",
]

log = structlog.get_logger("platoon.distributed")


LEASE_GRACE = 30.0  # seconds a lease adds to the rollout timeout
LEASE_WITHOUT_TIMEOUT = 600.0
TRAINER_DURABLE = "trainer"


class DistributedError(RuntimeError):
    """The `nats:` section (or the worker's options) cannot work as written."""


# --- the events that only a distributed run has ---------------------------------------------


# What a worker must learn even if it was away when the trainer said it: kept in JetStream.
FACTS: tuple[type[Event], ...] = (PolicyAnnounced, RunFinished)
RESULT_TYPES: tuple[type[Event], ...] = (
    EpisodeStarted,
    AgentSpawned,
    ModelCallFinished,
    AgentFinished,
    EpisodeFinished,
    EpisodeGraded,
    EpisodeSealed,
)


# --- what the trainer and its workers must share ----------------------------------------------


def worker_name() -> str:
    """`host:pid`: unique among live workers, readable in metrics."""
    return f"{socket.gethostname()}:{os.getpid()}"


def parsers_identity(parsers: Mapping[str, str | None]) -> dict[str, str]:
    """The tool-call parser each policy's renderer reads replies with, as the identity states
    it: `auto` is resolved by a probe of the tokenizer on each machine, and a worker whose
    tokenizer chose another parser would record other tool calls than the trainer's."""
    return {"tool_call_parsers": ", ".join(f"{name}={parser}" for name, parser in parsers.items())}


def identity_mismatch(trainer: dict[str, str], worker: dict[str, str]) -> str | None:
    """What differs between the trainer's identity and ours, in words; None if nothing."""
    differ = [
        f"{key}: the trainer's {trainer.get(key)!r}, this worker's {worker.get(key)!r}"
        for key in sorted(set(trainer) | set(worker))
        if trainer.get(key) != worker.get(key)
    ]
    return "; ".join(differ) or None


# --- the trainer's side ---------------------------------------------------------------------


class WorkerRegistry(ComponentBase):
    """The workers the trainer hears from, logged as they join. (The scheduler learns that a
    first worker is there from `WorkerStatus` too, and says once that it waits for one.)"""

    name = "worker-registry"
    subscribes = (WorkerStatus,)

    def __init__(self, *, every: float = 5.0) -> None:
        self.every = every
        self.last_seen: dict[str, float] = {}
        self.refused: dict[str, str] = {}  # worker: why it takes no work from this trainer
        self._joined = anyio.Event()

    def on_attach(self, bus: Bus) -> None:
        bus.subscribe(WorkerStatus, self._on_status, name="worker-registry")

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        await anyio.sleep_forever()

    def _on_status(self, event: WorkerStatus) -> None:
        if event.refused is not None:
            # Said where the trainer's user looks: a worker that left is not a worker to wait for.
            log.error("a rollout worker refused this run", worker=event.worker, why=event.refused)
            self.refused[event.worker] = event.refused
            return
        if event.worker not in self.live():
            log.info("worker joined", worker=event.worker, workers=len(self.live()) + 1)
        self.last_seen[event.worker] = anyio.current_time()
        self._joined.set()

    def live(self) -> list[str]:
        """Workers heard from within three heartbeats."""
        horizon = anyio.current_time() - 3 * self.every
        return [name for name, seen in self.last_seen.items() if seen >= horizon]

    async def wait_for_workers(self) -> None:
        if not self._joined.is_set():
            log.info("waiting for a rollout worker (platoon worker CONFIG)")
        await self._joined.wait()


class PolicyAnnouncer(ComponentBase):
    """Announces the trainer's current policies at start, after each update and every `every` s.

    `policy`: the policy the run starts with, or with several (RFC 0001) each of them, the
    first one first; a frozen one is announced as it is all run long."""

    name = "policy-announcer"
    subscribes = (PolicyUpdated,)
    publishes = (PolicyAnnounced,)

    def __init__(
        self,
        policy: PolicyUpdated | Sequence[PolicyUpdated],
        *,
        every: float = 5.0,
        identity: dict[str, str] | None = None,
    ) -> None:
        policies = [policy] if isinstance(policy, PolicyUpdated) else list(policy)
        self.policies = {p.policy: p for p in policies}
        self.every = every
        self.identity = identity or {}
        self.trainer = new_id()
        self._bus: Bus | None = None

    @property
    def policy(self) -> PolicyUpdated:
        """The run's first policy, as last announced."""
        return next(iter(self.policies.values()))

    def on_attach(self, bus: Bus) -> None:
        self._bus = bus
        bus.subscribe(PolicyUpdated, self._on_update, name="policy-announcer:updates")

    async def _on_update(self, event: PolicyUpdated) -> None:
        known = self.policies.get(event.policy)
        if known is not None and event.version >= known.version:
            self.policies[event.policy] = event
            await self.announce()

    async def announce(self) -> None:
        assert self._bus is not None
        first, *others = self.policies.values()
        await self._bus.publish(
            PolicyAnnounced(
                trainer=self.trainer,
                version=first.version,
                sampler_path=first.sampler_path,
                base_model=first.base_model,
                base_url=first.base_url,
                identity=self.identity,
                name=first.policy,
                others=others,
            )
        )

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        while True:
            await self.announce()
            await anyio.sleep(self.every)


@dataclass
class _Lease:
    request: EpisodeRequested
    expires: float | None  # None: not claimed yet, so no worker can be late with it


class LeaseKeeper(ComponentBase):
    """Re-requests episodes whose worker shows no sign of life for `lease` seconds (see the
    module docstring).

    A lease starts when a worker claims the episode (`WorkClaimed`, from the trainer's own
    bridge), not when it is requested: until then the episode waits in the offer protocol,
    which offers it again while nobody takes it, and a queue of work behind busy workers is
    no fault of any worker. Signs of life renew it: the claim, `EpisodeStarted`,
    `AgentSpawned`, `ModelCallFinished` (results carry the episode's lease token, so only the
    claimer's count). `EpisodeSealed` (or, for episodes no worker seals, a failed
    `EpisodeGraded` of the keeper's own) ends it. Time the keeper itself was stalled (its
    event loop blocked) is not held against workers: it could not hear them meanwhile."""

    name = "lease-keeper"
    subscribes = (
        EpisodeRequested,
        WorkClaimed,
        EpisodeStarted,
        AgentSpawned,
        ModelCallFinished,
        EpisodeSealed,
    )
    publishes = (EpisodeAbandoned, EpisodeGraded, EpisodeRequested)

    def __init__(self, *, lease: float, max_attempts: int = 3, check_every: float | None = None) -> None:
        if lease <= 0:
            raise DistributedError("the lease must be positive")
        if max_attempts < 1:
            raise DistributedError("max_attempts must be at least 1")
        self.lease = lease
        self.max_attempts = max_attempts
        self.check_every = check_every or min(lease / 4, 1.0)
        self.leases: dict[str, _Lease] = {}
        self.stats: Counter[str] = Counter()
        self._events: Stream[Event] | None = None

    def on_attach(self, bus: Bus) -> None:
        self._events = bus.stream(self.subscribes, name=self.name).open()

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        assert self._events is not None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._expire_loop, bus)
            with self._events as events:
                async for event in events:
                    self._observe(event)

    def _observe(self, event: Event) -> None:
        now = anyio.current_time()
        match event:
            case EpisodeRequested():
                self.leases[event.episode_id] = _Lease(event, None)
            case WorkClaimed() | EpisodeStarted() | AgentSpawned() | ModelCallFinished() if (
                event.episode_id in self.leases
            ):
                self.leases[event.episode_id].expires = now + self.lease
            case EpisodeSealed():
                self.leases.pop(event.episode_id, None)

    async def _expire_loop(self, bus: Bus) -> None:
        last = anyio.current_time()
        while True:
            await anyio.sleep(self.check_every)
            now = anyio.current_time()
            stalled = now - last - self.check_every
            last = now
            if stalled > self.check_every:  # we were not listening: nobody's silence counts
                for lease in self.leases.values():
                    if lease.expires is not None:
                        lease.expires += stalled
            for episode_id, lease in list(self.leases.items()):
                expires = lease.expires
                if expires is not None and expires <= now and self.leases.get(episode_id) is lease:
                    del self.leases[episode_id]
                    await self._expired(bus, lease.request)

    async def _expired(self, bus: Bus, request: EpisodeRequested) -> None:
        attempt = request.attempt + 1
        reason = f"no sign of life from its worker for {self.lease:g} s"
        log.warning(
            "lease expired",
            episode=request.episode_id,
            task=request.task.task_id,
            attempt=attempt,
            why=reason,
        )
        if attempt >= self.max_attempts:
            self.stats["gave_up"] += 1
            failed = f"{reason}, after {attempt} attempts"
            await bus.publish(_abandoned(request, None, failed))
            if request.purpose != "train":  # the credit assigner fails training episodes itself
                await bus.publish(_failed_grade(request, failed))
            return
        self.stats["reissued"] += 1
        retry_id = new_id()  # so whatever the silent worker still sends is told from the retry's
        await bus.publish(_abandoned(request, retry_id, reason))
        await bus.publish(msgspec.structs.replace(request, episode_id=retry_id, attempt=attempt))


def _abandoned(request: EpisodeRequested, replaced_by: str | None, reason: str) -> EpisodeAbandoned:
    return EpisodeAbandoned(
        episode_id=request.episode_id,
        group_id=request.group_id,
        task=request.task,
        purpose=request.purpose,
        step=request.step,
        attempt=request.attempt,
        replaced_by=replaced_by,
        reason=reason,
    )


def _failed_grade(request: EpisodeRequested, reason: str) -> EpisodeGraded:
    return EpisodeGraded(
        episode_id=request.episode_id,
        group_id=request.group_id,
        task=request.task,
        reward=None,
        status="error",
        reason=reason,
        purpose=request.purpose,
        step=request.step,
        policy_version=request.policy_version,
    )

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
import re
import socket
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import msgspec
import structlog

from platoon.bus import Bus, ComponentBase, Stream, attach, run_components
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
    event_types,
    new_id,
)
from platoon.config import Config
from platoon.programs import EpisodeRunner

__all__ = [
    "DistributedError",
    "EpisodeAbandoned",
    "EpisodeSealed",
    "FollowingRunner",
    "LeaseKeeper",
    "PolicyAnnounced",
    "PolicyAnnouncer",
    "PolicyFollower",
    "ResultSeal",
    "TinkerPolicies",
    "Worker",
    "WorkerRegistry",
    "WorkerStatus",
    "lease_timeout",
    "run_name",
    "worker_name",
]

log = structlog.get_logger("platoon.distributed")


def __getattr__(name: str) -> Any:
    if name == "trainer_components":  # assembled in one place, `platoon.assembly`
        from platoon.assembly import trainer_components

        return trainer_components
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


# --- settings from the config ---------------------------------------------------------------


def run_name(config: Config) -> str:
    """The run's NATS subject token: `nats.run`, else the experiment (and trial) name.

    A worker must compute the same name from the same config, so the trial's start time
    (the default trial name) never takes part."""
    if config.nats is not None and config.nats.run:
        return config.nats.run
    parts = [config.stats.experiment_name, config.stats.trial_name or ""]
    return re.sub(r"[^A-Za-z0-9_-]+", "-", "-".join(p for p in parts if p)).strip("-") or "platoon"


def lease_timeout(config: Config) -> float:
    """`nats.lease_timeout`, else the rollout timeout plus 30 s, else 10 minutes."""
    if config.nats is not None and config.nats.lease_timeout is not None:
        return config.nats.lease_timeout
    if config.train is not None:
        timeout = config.train.workflow_config.rollout_config.timeout
        if timeout is not None:
            return timeout + LEASE_GRACE
    return LEASE_WITHOUT_TIMEOUT


def worker_name() -> str:
    """`host:pid`: unique among live workers, readable in metrics."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _nats(config: Config, url: str | None) -> Any:
    if config.nats is None and url is None:
        raise DistributedError("no NATS server: add a nats: section to the config or pass --nats URL")
    from platoon.config.schema import NatsConfig

    nats = config.nats or NatsConfig()
    if nats.subject_prefix != "platoon":
        raise DistributedError(
            f"nats.subject_prefix: the bridge sends on platoon.<run>.<event>; {nats.subject_prefix!r} "
            "is not supported (use nats.run to keep runs apart)"
        )
    return nats


def _extra_types(nats: Any) -> list[type[Event]]:
    by_name = {}
    for event_type in event_types():
        by_name[event_type.__name__] = event_type
        by_name[str(msgspec.inspect.type_info(event_type).tag)] = event_type
    extra = []
    for i, name in enumerate(nats.subjects):
        if name not in by_name:
            raise DistributedError(f"nats.subjects.{i}: no event type {name!r} is registered")
        extra.append(by_name[name])
    return extra


def _tls(nats: Any) -> ssl.SSLContext | None:
    if nats.tls is None:
        return None
    try:
        context = ssl.create_default_context(cafile=nats.tls.ca_file)
        if nats.tls.cert_file:
            context.load_cert_chain(nats.tls.cert_file, nats.tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise DistributedError(f"nats.tls: {exc}") from None
    return context


def _bridge(config: Config, url: str | None, **options: Any) -> Any:
    from platoon.bus.nats import NatsBridge, NatsBridgeError

    nats = _nats(config, url)
    _check_authenticated(nats, url or nats.url)
    try:
        return NatsBridge(
            url or nats.url,
            run=run_name(config),
            credentials=nats.credentials_file,
            tls=_tls(nats),
            offer_timeout=nats.offer_timeout,
            connect_timeout=nats.connect_timeout,
            **options,
        )
    except NatsBridgeError as exc:
        raise DistributedError(str(exc)) from None


def _check_authenticated(nats: Any, url: str) -> None:
    """Beyond this machine, NATS without credentials lets anyone read the run and steer it."""
    from urllib.parse import urlsplit

    from platoon.serving import is_loopback

    parts = urlsplit(url if "://" in url else f"nats://{url}")
    if nats.credentials_file or parts.password or nats.insecure or is_loopback(parts.hostname or ""):
        return
    raise DistributedError(
        f"nats.url {parts.hostname}:{parts.port or 4222} is beyond this machine and no credentials are "
        "given: anyone who reaches it could read every event and steer the run. Write a server config "
        "and per-role credentials with `platoon nats init`, then set nats.credentials_file (or, on a "
        "trusted isolated network only, nats.insecure: true)"
    )


def worker_identity(config: Config) -> dict[str, str]:
    """What must be the same on the trainer and its workers, for episodes to be the ones the
    trainer means: platoon's version, the environments (names, env versions, harnesses and their
    options, service options without secrets), the rollout settings, the model and renderer."""
    import hashlib
    import json

    from platoon import __version__
    from platoon.config import redact, to_builtins

    def digest(value: Any) -> str:
        text = json.dumps(redact(value), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    train = config.train
    assert train is not None
    environments = []
    for entry in to_builtins(config)["environments"]:
        entry.pop("service", None)  # where the env server is may differ per machine
        entry.get("service_kwargs", {}).pop("secrets", None)
        environments.append(entry)
    identity = {
        "platoon": __version__,
        "environments": digest(environments),
        "rollout": digest(to_builtins(train.workflow_config)),
        "renderer": f"{train.renderer_name} ({train.tool_call_parser})",
        "lora_rank": str(train.lora_rank),
    }
    if config.policies:
        # How a worker turns each policy's calls into tokens. What it samples is announced, and
        # how a policy trains (its optimizer, load_path, kl) or where its service is are the
        # trainer's alone, so a worker's config need not repeat them.
        shaping = ("model_name", "tokenizer", "renderer_name", "tool_call_parser", "frozen")
        policies = {
            name: {k: v for k, v in policy.items() if k in shaping}
            for name, policy in to_builtins(config)["policies"].items()
        }
        identity["policies"] = digest(policies)
    return identity


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


def authenticated(config: Config) -> bool:
    """Whether the run's NATS connection is authenticated (steering events come from the trainer)."""
    return config.nats is not None and bool(config.nats.credentials_file)


# --- the trainer's side ---------------------------------------------------------------------


class WorkerRegistry(ComponentBase):
    """The workers the trainer hears from, logged as they join. (The scheduler learns that a
    first worker is there from `WorkerStatus` too, and says once that it waits for one.)"""

    name = "worker-registry"
    subscribes = (WorkerStatus,)

    def __init__(self, *, every: float = 5.0) -> None:
        self.every = every
        self.last_seen: dict[str, float] = {}
        self._joined = anyio.Event()

    def on_attach(self, bus: Bus) -> None:
        bus.subscribe(WorkerStatus, self._on_status, name="worker-registry")

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        await anyio.sleep_forever()

    def _on_status(self, event: WorkerStatus) -> None:
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


# --- the worker's side ----------------------------------------------------------------------

SamplerFor = Callable[[PolicyUpdated], Awaitable[Any]]


class PolicyFollower(ComponentBase):
    """Learns the trainer's policies from `PolicyAnnounced` and is the gateway's sampler factory.

    `sampler_for(policy)` makes a sampler for one policy (`PolicyUpdated.policy` names it). A
    newer version of a policy is published on the local bus as `PolicyUpdated` (the gateway
    switches that policy's sampler); repeats are ignored, so the gateway makes one sampler
    per policy and version however often the trainer announces it. With several policies
    (RFC 0001), `factory(name)` is the gateway's factory of the policy `name`; the follower
    itself is that of the run's first policy."""

    name = "policy-follower"
    subscribes = (PolicyAnnounced,)
    publishes = (PolicyUpdated,)

    def __init__(self, sampler_for: SamplerFor) -> None:
        self.sampler_for = sampler_for
        self.policies: dict[str, PolicyUpdated] = {}  # by name, the run's first one first
        self.trainer: str | None = None
        self.trainer_identity: dict[str, str] = {}
        self.heard_at: float | None = None  # anyio clock of the last announcement
        self._changed = anyio.Event()
        self._samplers: dict[str, tuple[tuple[str | None, int, str], Any]] = {}  # the newest per policy
        self._retired: set[str] = set()
        self._bus: Bus | None = None

    @property
    def policy(self) -> PolicyUpdated | None:
        """The run's first policy, once announced."""
        return next(iter(self.policies.values()), None)

    def on_attach(self, bus: Bus) -> None:
        self._bus = bus
        bus.subscribe(PolicyAnnounced, self._on_announced, name="policy-follower")

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        await anyio.sleep_forever()

    async def _on_announced(self, event: PolicyAnnounced) -> None:
        self.heard_at = anyio.current_time()
        if event.trainer in self._retired:
            return  # a trainer that a newer one replaced; its last words may still be on the way
        same_trainer = event.trainer == self.trainer
        if self.trainer is not None and not same_trainer:
            self._retired.add(self.trainer)
        announced = event.policies()
        changed = [
            p
            for name, p in announced.items()
            if not same_trainer or name not in self.policies or p.version > self.policies[name].version
        ]
        if not changed:
            return
        known, fresh = self.policies, {p.policy for p in changed}
        self.policies = {name: p if name in fresh else known[name] for name, p in announced.items()}
        self.trainer = event.trainer
        self.trainer_identity = dict(event.identity)
        for p in changed:
            log.info(
                "policy learned",
                policy=p.policy,
                version=p.version,
                path=p.sampler_path or "(base model)",
            )
        self._changed.set()
        self._changed = anyio.Event()
        assert self._bus is not None
        for p in changed:
            if p.policy in known:  # the gateway took the first one from `initial()`
                await self._bus.publish(p)

    async def known(self, name: str | None = None) -> PolicyUpdated:
        """The current policy `name` (None: the run's first), once one has been announced."""
        while True:
            policy = self.policy if name is None else self.policies.get(name)
            if policy is not None:
                return policy
            await self._changed.wait()

    async def wait_for(self, versions: Mapping[str, int] | int, timeout: float) -> bool:
        """Whether the worker knows these versions (or newer ones) within `timeout` seconds:
        of the run's first policy (an int), or of each policy named."""

        def behind() -> bool:
            if isinstance(versions, int):
                return self.policy is None or self.policy.version < versions
            return any(
                name not in self.policies or self.policies[name].version < version
                for name, version in versions.items()
            )

        with anyio.move_on_after(timeout):
            while behind():
                await self._changed.wait()
            return True
        return False

    def factory(self, name: str) -> _FollowedPolicy:
        """The gateway's sampler factory of the policy `name`."""
        return _FollowedPolicy(self, name)

    async def initial(self) -> Any:
        return await self._sampler(await self.known())

    async def updated(self, event: PolicyUpdated) -> Any:
        return await self._sampler(event)

    async def _sampler(self, policy: PolicyUpdated) -> Any:
        key = (self.trainer, policy.version, policy.sampler_path)
        kept = self._samplers.get(policy.policy)
        if kept is None or kept[0] != key:
            kept = self._samplers[policy.policy] = (key, await self.sampler_for(policy))
        return kept[1]


@dataclass
class _FollowedPolicy:
    """One policy of a followed run, as the gateway's sampler factory of it."""

    follower: PolicyFollower
    name: str

    async def initial(self) -> Any:
        return await self.follower._sampler(await self.follower.known(self.name))

    async def updated(self, event: PolicyUpdated) -> Any:
        return await self.follower._sampler(event)


class FollowingRunner(EpisodeRunner):
    """The episode runner of a worker: holds a request until the worker knows the policy
    versions it was made for (at most `policy_wait` s; after that it plays on what it has and
    the trainer's staleness filter decides)."""

    def __init__(self, entries: list[Any], *, follower: PolicyFollower, policy_wait: float = 30.0, **kw: Any):
        super().__init__(entries, **kw)
        self.follower = follower
        self.policy_wait = policy_wait

    async def play(self, bus: Bus, request: EpisodeRequested) -> EpisodeFinished:
        wanted = request.policy_versions or request.policy_version
        if not await self.follower.wait_for(wanted, self.policy_wait):
            known = {name: p.version for name, p in self.follower.policies.items()}
            log.warning("playing on an older policy", wanted=wanted, known=known)
        return await super().play(bus, request)


class ResultSeal(ComponentBase):
    """Follows each `EpisodeGraded` of the episodes this worker plays with `EpisodeSealed`,
    counting what was sent before it; `idle()` waits until no episode is in flight."""

    name = "result-seal"
    subscribes = (EpisodeRequested, AgentSpawned, ModelCallFinished, AgentFinished, EpisodeGraded)
    publishes = (EpisodeSealed,)

    def __init__(self, *, worker: str, envs: set[str]) -> None:
        self.worker = worker
        self.envs = envs
        self.in_flight: dict[str, Counter[str]] = {}
        self.sealed = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._events: Stream[Event] | None = None

    def on_attach(self, bus: Bus) -> None:
        self._events = bus.stream(self.subscribes, name=self.name).open()

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        assert self._events is not None
        with self._events as events:
            async for event in events:
                await self._observe(bus, event)

    async def _observe(self, bus: Bus, event: Event) -> None:
        match event:
            case EpisodeRequested() if event.task.env in self.envs:
                self.in_flight.setdefault(event.episode_id, Counter())
                if self._idle.is_set():
                    self._idle = anyio.Event()
            case ModelCallFinished() | AgentSpawned() | AgentFinished() if event.episode_id in self.in_flight:
                self.in_flight[event.episode_id][type(event).__name__] += 1
            case EpisodeGraded() if event.episode_id in self.in_flight:
                counts = self.in_flight.pop(event.episode_id)
                await bus.publish(
                    EpisodeSealed(
                        episode_id=event.episode_id,
                        group_id=event.group_id,
                        worker=self.worker,
                        calls=counts["ModelCallFinished"],
                        agents=counts["AgentSpawned"],
                        agents_finished=counts["AgentFinished"],
                    )
                )
                self.sealed += 1
                if not self.in_flight:
                    self._idle.set()

    async def idle(self) -> None:
        await self._idle.wait()


class Worker:
    """A rollout worker: env services, gateway, runner and grader on a bus of its own,
    bridged to the trainer (built by `platoon.assembly`, purpose `worker`). See `run` for how
    it starts and stops."""

    def __init__(
        self,
        components: list[Any],
        *,
        results: Any,
        work: Any,
        follower: PolicyFollower,
        seal: ResultSeal,
        name: str,
        drain_timeout: float,
        every: float,
        trainer_timeout: float,
        identity: dict[str, str],
    ) -> None:
        self.components = components  # env services, gateway, runner, grader, seal, follower, plugins
        self.results = results  # the bridge that carries results and facts
        self.work = work  # the bridge that takes work from the queue group
        self.follower = follower
        self.seal = seal
        self.name = name
        self.drain_timeout = drain_timeout
        self.every = every
        self.trainer_timeout = trainer_timeout
        self.identity = identity
        self.refusal: str | None = None  # why this worker would not play for the trainer
        self.run_finished = anyio.Event()

    async def run(
        self,
        *,
        stop: anyio.Event | None = None,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> str:
        """Serve until `stop` is set or the trainer's run finishes; returns why it stopped.

        Start-up: the results bridge, the components, then (once a policy is known) the work
        bridge, whose queue-group membership is what makes this a worker. Shut-down: leave
        the queue group, let the episodes in flight finish (`drain_timeout` s), send their
        results, close the results bridge, and only then cancel what is left; the trainer's
        leases re-request those."""
        stop = stop or anyio.Event()
        async with Bus() as bus:
            bus.subscribe(RunFinished, lambda _: self.run_finished.set(), name="worker:run-finished")
            self.results.attach(bus)
            attach(self.components, bus)
            async with anyio.create_task_group() as components:
                async with anyio.create_task_group() as bridge:
                    await bridge.start(self.results.run, bus)
                    await components.start(run_components, bus, self.components)
                    reason = await _first(
                        policy=self.follower.known,
                        stop=stop.wait,
                        finished=self.run_finished.wait,
                        waiting=self._say_what_we_wait_for,
                    )
                    if reason == "policy" and self._refuse_a_different_run():
                        reason = "mismatch"
                        task_status.started()
                    elif reason == "policy":
                        async with anyio.create_task_group() as work:
                            await work.start(self.work.run, bus)
                            work.start_soon(self._heartbeat, bus)
                            log.info("worker taking work", worker=self.name, run=self.results.run_name)
                            task_status.started()
                            reason = await _first(
                                stop=stop.wait,
                                finished=self.run_finished.wait,
                                trainer_gone=self._trainer_gone,
                            )
                            work.cancel_scope.cancel()
                    else:
                        task_status.started()
                    log.info(
                        "worker stopping", worker=self.name, why=reason, in_flight=len(self.seal.in_flight)
                    )
                    with anyio.move_on_after(self.drain_timeout):
                        await self.seal.idle()
                    with anyio.move_on_after(self.results.close_timeout):
                        await self.results.flush()
                    bridge.cancel_scope.cancel()
                components.cancel_scope.cancel()
        return reason

    def _refuse_a_different_run(self) -> bool:
        """The handshake: a worker whose config shapes episodes differently takes no work."""
        theirs = self.follower.trainer_identity
        mismatch = identity_mismatch(theirs, self.identity) if theirs else None
        if mismatch is not None:
            self.refusal = f"this worker's config differs from the trainer's, so it takes no work: {mismatch}"
            log.error("worker refused", worker=self.name, why=self.refusal)
        return mismatch is not None

    async def _say_what_we_wait_for(self) -> None:
        """Log, now and then, that the worker waits for the trainer's first announcement."""
        while True:
            log.info(
                "worker waiting for the trainer's policy announcement",
                worker=self.name,
                run=self.results.run_name,
                server=self.results.server,
            )
            await anyio.sleep(max(self.every * 4, 10.0))

    async def _trainer_gone(self) -> None:
        """Return once no announcement has come for `trainer_timeout` s: the trainer is gone
        (its run's end may have been lost on the way), and waiting longer helps nobody."""
        while True:
            heard = self.follower.heard_at or anyio.current_time()
            silent = anyio.current_time() - heard
            if silent >= self.trainer_timeout:
                log.warning(
                    "no announcement from the trainer: taking it for gone",
                    worker=self.name,
                    silent_s=round(silent, 1),
                )
                return
            await anyio.sleep(self.trainer_timeout - silent)

    async def _heartbeat(self, bus: Bus) -> None:
        due = anyio.current_time()
        while True:
            late = anyio.current_time() - due
            if late > max(3 * self.every, 1.0):  # stopped (SIGSTOP, a suspended VM) or starved
                log.warning(
                    "this worker was stalled: the trainer may have given its episodes to others",
                    worker=self.name,
                    stalled_s=round(late, 1),
                    in_flight=len(self.seal.in_flight),
                )
            due = anyio.current_time() + self.every
            policy = self.follower.policy
            await bus.publish(
                WorkerStatus(
                    worker=self.name,
                    in_flight=len(self.seal.in_flight),
                    episodes=self.seal.sealed,
                    policy_version=policy.version if policy else None,
                )
            )
            await anyio.sleep(self.every)


class TinkerPolicies:
    """A worker's samplers on the Tinker service the trainer announces, one client per URL.

    The worker's `TINKER_API_KEY` goes only to a URL it trusts: its own `$TINKER_BASE_URL` or
    `tinker_base_url`, hosted Tinker, or one announced over an authenticated NATS connection
    (where only the trainer may announce). An announcement heard over an unauthenticated bus
    could come from anyone, so its URL gets the placeholder key of a keyless local server.
    """

    def __init__(self, config: Config, *, trust_announced: bool = False) -> None:
        from platoon.config.policies import resolve_policies

        assert config.train is not None
        self.base_url = config.tinker_base_url
        self.model_name = config.train.model_name
        self.trust_announced = trust_announced
        # several policies: each one's own `tinker_base_url` (a policy may train on a service
        # of its own), and its model should an announcement not say
        specs = resolve_policies(config) if config.policies else {}
        self.base_urls = {name: spec.tinker_base_url for name, spec in specs.items()}
        self.model_names = {name: spec.train.model_name for name, spec in specs.items()}
        self.clients: dict[str | None, Any] = {}

    def _client(self, base_url: str | None, policy: str = "default") -> Any:
        from platoon import system

        configured = self.base_urls.get(policy, self.base_url)
        own = os.environ.get("TINKER_BASE_URL") or configured
        url = own or base_url
        if url not in self.clients:
            if url is None:
                self.clients[url] = system.tinker_service_client(configured)
            else:
                import tinker

                trusted = url == own or self.trust_announced
                api_key = (os.environ.get("TINKER_API_KEY") if trusted else None) or "tml-local"
                if not trusted:
                    log.warning(
                        "sampling from the announced Tinker URL without this worker's key: the announcement "
                        "is not authenticated (set nats.credentials_file, or TINKER_BASE_URL)",
                        url=url,
                    )
                self.clients[url] = tinker.ServiceClient(base_url=url, api_key=api_key)
        return self.clients[url]

    async def __call__(self, policy: Any) -> Any:
        from platoon.policy.tinker import TinkerSamplerFactory

        client = await anyio.to_thread.run_sync(self._client, policy.base_url, policy.policy)
        factory = TinkerSamplerFactory(
            client,
            policy.base_model or self.model_names.get(policy.policy, self.model_name),
            model_path=policy.sampler_path or None,
            version=policy.version,
        )
        return await factory.initial()


async def _first(**waits: Callable[[], Awaitable[Any]]) -> str:
    """Run the waits together; the name of the first to return."""
    winner = ""
    async with anyio.create_task_group() as tg:

        async def wait(name: str, fn: Callable[[], Awaitable[Any]]) -> None:
            nonlocal winner
            await fn()
            winner = winner or name
            tg.cancel_scope.cancel()

        for name, fn in waits.items():
            tg.start_soon(wait, name, fn)
    return winner

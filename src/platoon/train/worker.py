"""The worker's side of a distributed run: it follows the trainer's policies
(`PolicyFollower`), plays the episodes it claims (`FollowingRunner`), seals each episode's
results (`ResultSeal`), and starts and stops in stages (`Worker`). Why it works this way is
in `platoon.train.distributed`."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import structlog

from platoon.bus import Bus, ComponentBase, Stream, attach, run_components
from platoon.bus.events import (
    AgentFinished,
    AgentSpawned,
    EpisodeFinished,
    EpisodeGraded,
    EpisodeRequested,
    EpisodeSealed,
    Event,
    ModelCallFinished,
    PolicyAnnounced,
    PolicyUpdated,
    RunFinished,
    WorkerStatus,
)
from platoon.policy.base import Sampler
from platoon.policy.tinker import TinkerSamplerFactory, tinker_service_client
from platoon.programs import EntrySettings, EpisodeRunner
from platoon.serving import published_key_for
from platoon.train.distributed import identity_mismatch

__all__ = [
    "FollowingRunner",
    "PolicyFollower",
    "ResultSeal",
    "SamplerFor",
    "TinkerPolicies",
    "Worker",
]

if TYPE_CHECKING:
    import tinker

    from platoon.bus.nats import NatsBridge

log = structlog.get_logger("platoon.distributed")


SamplerFor = Callable[[PolicyUpdated], Awaitable[Sampler]]


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
        self._samplers: dict[str, tuple[tuple[str | None, int, str], Sampler]] = {}  # the newest per policy
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

    async def initial(self) -> Sampler:
        return await self._sampler(await self.known())

    async def updated(self, event: PolicyUpdated) -> Sampler:
        return await self._sampler(event)

    async def _sampler(self, policy: PolicyUpdated) -> Sampler:
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

    async def initial(self) -> Sampler:
        return await self.follower._sampler(await self.follower.known(self.name))

    async def updated(self, event: PolicyUpdated) -> Sampler:
        return await self.follower._sampler(event)


class FollowingRunner(EpisodeRunner):
    """The episode runner of a worker: holds a request until the worker knows the policy
    versions it was made for (at most `policy_wait` s; after that it plays on what it has and
    the trainer's staleness filter decides)."""

    def __init__(
        self,
        entries: list[EntrySettings],
        *,
        follower: PolicyFollower,
        policy_wait: float = 30.0,
        worker: str = "",
        seed: int = 0,
    ) -> None:
        super().__init__(entries, worker=worker, seed=seed)
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
        components: list[object],
        *,
        results: NatsBridge,
        work: NatsBridge,
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
                        # The trainer hears why, so its user is not left waiting for nobody.
                        await bus.publish(WorkerStatus(worker=self.name, refused=self.refusal))
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
                    with anyio.move_on_after(self.results.connection.settings.close_timeout):
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

    def __init__(
        self,
        *,
        base_url: str | None,
        model_name: str,
        base_urls: Mapping[str, str | None] | None = None,
        model_names: Mapping[str, str] | None = None,
        trust_announced: bool = False,
    ) -> None:
        self.base_url = base_url  # `tinker_base_url`
        self.model_name = model_name
        self.trust_announced = trust_announced
        # several policies: each one's own `tinker_base_url` (a policy may train on a service
        # of its own), and its model should an announcement not say
        self.base_urls = dict(base_urls or {})
        self.model_names = dict(model_names or {})
        self.clients: dict[str | None, tinker.ServiceClient] = {}

    def _client(self, base_url: str | None, policy: str = "default") -> tinker.ServiceClient:
        configured = self.base_urls.get(policy, self.base_url)
        own = os.environ.get("TINKER_BASE_URL") or configured
        url = own or base_url
        if url not in self.clients:
            if url is None:
                self.clients[url] = tinker_service_client(configured)
            else:
                import tinker  # the tinker extra, and it imports torch: only a worker on Tinker

                trusted = url == own or self.trust_announced
                # A server of this user's on loopback (a trainer's embedded one) published its key
                # where only this user reads it: the key goes back to the server that made it.
                published = published_key_for(url)
                api_key = published or (os.environ.get("TINKER_API_KEY") if trusted else None) or "tml-local"
                if not trusted:
                    log.warning(
                        "sampling from the announced Tinker URL without this worker's key: the announcement "
                        "is not authenticated (set nats.credentials_file, or TINKER_BASE_URL)",
                        url=url,
                    )
                self.clients[url] = tinker.ServiceClient(base_url=url, api_key=api_key)
        return self.clients[url]

    async def __call__(self, policy: PolicyUpdated) -> Sampler:
        client = await anyio.to_thread.run_sync(self._client, policy.base_url, policy.policy)
        factory = TinkerSamplerFactory(
            client,
            policy.base_model or self.model_names.get(policy.policy, self.model_name),
            model_path=policy.sampler_path or None,
            version=policy.version,
        )
        return await factory.initial()


async def _first(**waits: Callable[[], Awaitable[object]]) -> str:
    """Run the waits together; the name of the first to return."""
    winner = ""
    async with anyio.create_task_group() as tg:

        async def wait(name: str, fn: Callable[[], Awaitable[object]]) -> None:
            nonlocal winner
            await fn()
            winner = winner or name
            tg.cancel_scope.cancel()

        for name, fn in waits.items():
            tg.start_soon(wait, name, fn)
    return winner

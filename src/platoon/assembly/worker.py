"""A rollout worker, built in stages: what it opens before its parts (its policies' tokenizers,
the follower that makes their samplers as the trainer announces them, the leases its bridges
share), its parts (components, the results bridge and the work bridge), then the `Worker`."""

from __future__ import annotations

from collections.abc import Sequence

from platoon.assembly.builders import parsers_identity_of
from platoon.assembly.nats import bridge, bridge_refusals
from platoon.assembly.part import Opened
from platoon.assembly.policies import OpenPolicy, load_policy
from platoon.assembly.settings import Settings
from platoon.bus.events import EpisodeRequested, PolicyAnnounced, PolicyUpdated, RunFinished, WorkerStatus
from platoon.policy.base import Sampler
from platoon.policy.scripted import policy_from_ref
from platoon.train.distributed import FACTS, RESULT_TYPES, worker_name
from platoon.train.worker import (
    FollowingRunner,
    PolicyFollower,
    ResultSeal,
    SamplerFor,
    TinkerPolicies,
    Worker,
)


def opened_worker(s: Settings, *, policy_wait: float) -> Opened:
    """What a worker opens before its parts are built: its policies' tokenizers and renderers
    (no training service), its policy follower and the leases its two bridges share."""
    from platoon.bus.nats import Leases  # the nats extra: imported only by a distributed run

    loaded = {n: load_policy(p) for n, p in s.policies.items()}
    follower = PolicyFollower(_sampler_for(s, loaded))
    # The work bridge learns each episode's token, the results bridge sends it.
    return Opened(loaded, follower=follower, leases=Leases(), policy_wait=policy_wait)


def worker_of(s: Settings, built: Sequence[object], opened: Opened) -> Worker:
    """The worker of its built parts (the two bridges last), nothing connected yet."""
    nats = s.nats
    assert nats is not None and opened.follower is not None
    *components, results, work = built
    [seal] = [c for c in components if isinstance(c, ResultSeal)]
    every = nats.announce_every
    return Worker(
        components,
        results=results,  # type: ignore[arg-type]  # the parts say what they are
        work=work,  # type: ignore[arg-type]
        follower=opened.follower,
        seal=seal,
        name=_name(s),
        drain_timeout=nats.nats.drain_timeout if nats.drain_timeout is None else nats.drain_timeout,
        every=every,
        trainer_timeout=nats.nats.trainer_timeout or max(30.0, 10 * every),
        identity=nats.identity | parsers_identity_of(opened.policies),
    )


# --- its parts ----------------------------------------------------------------------------------


def following_runner(s: Settings, opened: Opened) -> FollowingRunner:
    assert s.runner is not None and opened.follower is not None
    return FollowingRunner(
        s.runner.entries,
        follower=opened.follower,
        policy_wait=opened.policy_wait,
        worker=_name(s),
        seed=s.runner.seed,
    )


def result_seal(s: Settings, opened: Opened) -> ResultSeal:
    assert s.runner is not None
    return ResultSeal(worker=_name(s), envs={e.name for e in s.runner.entries})


def policy_follower(s: Settings, opened: Opened) -> PolicyFollower:
    assert opened.follower is not None
    return opened.follower


def results_bridge(s: Settings, opened: Opened) -> object:
    """The bridge that carries results (durably) and facts out, and the trainer's
    announcements and the run's end in."""
    assert s.nats is not None
    from platoon.bus.nats import Routes  # the nats extra: imported only by a distributed run

    with bridge_refusals():
        routes = Routes(
            mirror=[PolicyAnnounced, RunFinished, WorkerStatus, *s.nats.extra],
            durable=RESULT_TYPES,
            state=FACTS,
            read_state=True,
        )
    return bridge(s.nats, open_server="refuse", routes=routes, leases=opened.leases)


def work_bridge(s: Settings, opened: Opened) -> object:
    """The bridge that takes work from the workers' queue group."""
    assert s.nats is not None
    from platoon.bus.nats import Routes  # the nats extra: imported only by a distributed run

    routes = Routes(work=[EpisodeRequested], consume_work=True)
    return bridge(s.nats, open_server="refuse", routes=routes, leases=opened.leases)


def _name(s: Settings) -> str:
    """The worker's name: the one asked for, else `host:pid`."""
    assert s.nats is not None
    return s.nats.worker or worker_name()


def _sampler_for(s: Settings, loaded: dict[str, OpenPolicy]) -> SamplerFor:
    """How a worker makes the sampler of each policy the trainer announces."""
    if s.policy.scripted:
        factories = {
            name: policy_from_ref(p.settings.scripted or "", p.tokenizer) for name, p in loaded.items()
        }

        async def scripted(announced: PolicyUpdated) -> Sampler:
            return await factories[announced.policy].updated(announced)

        return scripted
    assert s.nats is not None
    return TinkerPolicies(
        base_url=s.policy.base_url,
        model_name=s.policy.model_name or "",
        base_urls={name: p.base_url for name, p in s.policies.items()},
        model_names={name: p.model_name or "" for name, p in s.policies.items()},
        trust_announced=s.nats.authenticated,
    )

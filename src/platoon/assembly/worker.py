"""A rollout worker, built in stages: its components, its two NATS bridges (results and facts
out, work in), and the samplers it makes for each policy the trainer announces."""

from __future__ import annotations

from collections.abc import Sequence

from platoon.assembly.builders import env_services, gateway, grader, parsers_identity_of
from platoon.assembly.nats import _bridge, _extra_types, _nats, authenticated, worker_identity
from platoon.assembly.policies import OpenPolicy, load_policy
from platoon.assembly.settings import Settings
from platoon.bus.events import EpisodeRequested, PolicyAnnounced, PolicyUpdated, RunFinished, WorkerStatus
from platoon.config import Config
from platoon.config.policies import resolve_policies
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


def build_worker(
    config: Config,
    settings: Settings,
    plugins: Sequence[object],
    *,
    nats_url: str | None,
    name: str | None = None,
    drain_timeout: float | None,
    policy_wait: float,
) -> Worker:
    """The worker of a `worker` run: its components built, nothing connected yet."""
    s = settings
    nats = _nats(config, nats_url)
    name = name or worker_name()
    loaded = {n: load_policy(p) for n, p in s.policies.items()}
    follower = PolicyFollower(_sampler_for(config, s, loaded))
    mirrored = [PolicyAnnounced, RunFinished, WorkerStatus, *_extra_types(nats)]
    from platoon.bus.nats import Leases  # the nats extra: imported only by a distributed run

    leases = Leases()  # the work bridge learns each episode's token, the results bridge sends it
    results = _bridge(
        config,
        nats_url,
        open_server="refuse",
        mirror=mirrored,
        durable=RESULT_TYPES,
        leases=leases,
        state=FACTS,
        read_state=True,
    )
    work = _bridge(
        config, nats_url, open_server="refuse", work=[EpisodeRequested], consume_work=True, leases=leases
    )
    assert s.runner is not None
    seal = ResultSeal(worker=name, envs={e.name for e in s.runner.entries})
    components = [
        *env_services(config),
        gateway(s.gateway, loaded, {n: follower.factory(n) for n in loaded}),
        FollowingRunner(
            s.runner.entries, follower=follower, policy_wait=policy_wait, worker=name, seed=s.runner.seed
        ),
        grader(config, s),
        seal,
        follower,
        *plugins,
    ]
    return Worker(
        components,
        results=results,
        work=work,
        follower=follower,
        seal=seal,
        name=name,
        drain_timeout=nats.drain_timeout if drain_timeout is None else drain_timeout,
        every=nats.announce_every,
        trainer_timeout=nats.trainer_timeout or max(30.0, 10 * nats.announce_every),
        identity=worker_identity(config) | parsers_identity_of(loaded),
    )


def _sampler_for(config: Config, settings: Settings, loaded: dict[str, OpenPolicy]) -> SamplerFor:
    """How a worker makes the sampler of each policy the trainer announces."""
    if settings.policy.scripted:
        factories = {
            name: policy_from_ref(p.settings.scripted or "", p.tokenizer) for name, p in loaded.items()
        }

        async def scripted(announced: PolicyUpdated) -> Sampler:
            return await factories[announced.policy].updated(announced)

        return scripted
    assert config.train is not None
    specs = resolve_policies(config) if config.policies else {}
    return TinkerPolicies(
        base_url=config.tinker_base_url,
        model_name=config.train.model_name,
        base_urls={name: spec.tinker_base_url for name, spec in specs.items()},
        model_names={name: spec.train.model_name for name, spec in specs.items()},
        trust_announced=authenticated(config),
    )

"""How each part of a run is built over what the run opened (`Opened`), from the settings it
was resolved into; and what lock.json and the worker handshake record of the opened policies.
Each builder is a part's `build` (`parts.py` lists them for each purpose).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import msgspec
import structlog

from platoon.assembly.nats import trainer_bridge
from platoon.assembly.part import Opened
from platoon.assembly.policies import OpenPolicy
from platoon.assembly.settings import EnvServiceSettings, Settings
from platoon.bus import EventLog
from platoon.bus.events import PolicyUpdated
from platoon.envs import build_env_service
from platoon.envs.service import EnvService
from platoon.gateway import Gateway, GatewayPolicy, GatewaySettings
from platoon.models.loading import TOY_TOKENIZER, model_window, tokenizer_identity
from platoon.policy.base import SampleParams, SamplerFactory
from platoon.programs import EpisodeRunner, Grader
from platoon.rewards import build_reward_rules
from platoon.stats.metrics import MetricsSink
from platoon.stats.progress import TrainProgress
from platoon.train.batcher import CreditAssigner
from platoon.train.distributed import LeaseKeeper, PolicyAnnouncer, WorkerRegistry, parsers_identity
from platoon.train.evaluate import Evaluator
from platoon.train.loop import Scheduler
from platoon.train.policies import StepJoin
from platoon.train.sft import SftFeeder
from platoon.train.trainer import Trainer

log = structlog.get_logger("platoon.assembly")


# --- the parts --------------------------------------------------------------------------------


def env_service(settings: EnvServiceSettings, opened: Opened | None = None) -> EnvService:
    """An environment entry's env service."""
    s = settings
    return build_env_service(s.name, s.service, s.env, s.options)


def event_log(s: Settings, opened: Opened) -> EventLog:
    """The run's event log; a served gateway's is flushed at each event (its reader follows it)."""
    assert s.run_dir is not None
    return EventLog(s.run_dir, flush_every=1) if s.purpose == "gateway" else EventLog(s.run_dir)


def gateway(s: Settings, opened: Opened) -> Gateway:
    """The gateway of a run: it serves each of the run's policies (the first under the gateway's
    model name, each other also under its own), sampled through each one's factory (a worker's:
    through its policy follower)."""
    follower = opened.follower
    factories: dict[str, SamplerFactory] = {
        name: follower.factory(name) if follower is not None else p.factory()
        for name, p in opened.policies.items()
    }
    first = next(iter(opened.policies))
    served = {
        name: GatewayPolicy(
            p.renderer,
            factories[name],
            frozen=p.settings.frozen,
            model_name=None if name == first else p.settings.model_name,
        )
        for name, p in opened.policies.items()
    }
    return gateway_of(s.gateway, served)


def gateway_of(settings: GatewaySettings, served: Mapping[str, GatewayPolicy]) -> Gateway:
    """A gateway over `served`, its context window unset taken from the first policy's model: a
    prompt past it is refused before it is tokenized whole."""
    window = settings.context_window or model_window(next(iter(served.values())).renderer.tokenizer)
    return Gateway(served, msgspec.structs.replace(settings, context_window=window), defaults=SampleParams())


def episode_runner(s: Settings, opened: Opened) -> EpisodeRunner:
    assert s.runner is not None
    return EpisodeRunner(s.runner.entries, max_concurrent=s.runner.max_concurrent, seed=s.runner.seed)


def grader(s: Settings, opened: Opened) -> Grader:
    """Each entry's reward processor, reward rules and judges; a `tinker` judge that names no
    service, model or renderer uses the run's (the service as the run opened it, with the key of
    its own embedded service)."""
    g = s.grader
    assert g is not None
    policy = opened.policy
    rules = build_reward_rules(
        g.entries,
        tinker_base_url=policy.base_url or g.tinker_base_url,
        tinker_api_key=policy.api_key if policy.base_url else None,
        model_name=g.model_name,
        renderer_name=g.renderer_name,
    )
    return Grader(reward_processors=g.reward_processors, rules=rules)


def evaluator(s: Settings, opened: Opened) -> Evaluator:
    assert s.eval is not None and s.run_dir is not None
    return Evaluator(s.eval, run_dir=s.run_dir)


def credit_assigner(s: Settings, opened: Opened) -> CreditAssigner:
    c = s.credit
    assert c is not None
    return CreditAssigner(c)


def trainer(name: str, opened: Opened) -> Trainer:
    """Policy `name`'s trainer, which `open_policies` made with its training client."""
    made = opened.policies[name].trainer
    assert made is not None, f"policy {name!r} does not train here"
    return made


def step_join(s: Settings, opened: Opened) -> StepJoin:
    """The join of the steps of the policies that train under their names."""
    return StepJoin([name for name in s.trained() if s.policies[name].prefix])


def scheduler(s: Settings, opened: Opened) -> Scheduler:
    assert s.scheduler is not None
    versions = {name: trainer(name, opened).version for name in s.trained()}
    return Scheduler(s.scheduler, start_step=opened.start_step, versions=versions)


def progress(s: Settings, opened: Opened) -> TrainProgress:
    m = s.metrics
    assert m is not None
    return TrainProgress(m.total_steps or 0, start_step=opened.start_step, limits=m.limits)


def metrics(s: Settings, opened: Opened) -> MetricsSink:
    """The metrics sink, of as many steps as the run trains (an SFT run's, as its plan has)."""
    m = s.metrics
    assert s.run_dir is not None and m is not None
    total_steps = opened.plan.total_steps if opened.plan is not None else m.total_steps
    return MetricsSink(s.run_dir, replace(m, total_steps=total_steps))


def sft_feeder(s: Settings, opened: Opened) -> SftFeeder:
    """The feeder of an SFT run's recorded datums, in place of rollouts and credit."""
    assert opened.plan is not None
    trained = [trainer(name, opened) for name in s.trained()]
    return SftFeeder(
        opened.plan,
        {t.policy: t.client for t in trained},
        start_step=opened.start_step,
        prefixed=any(t.prefix for t in trained),
    )


def nats_bridge(s: Settings, opened: Opened) -> object:
    assert s.nats is not None
    return trainer_bridge(s.nats)


def lease_keeper(s: Settings, opened: Opened) -> LeaseKeeper:
    assert s.nats is not None
    return LeaseKeeper(lease=s.nats.lease, max_attempts=s.nats.max_attempts)


def policy_announcer(s: Settings, opened: Opened) -> PolicyAnnouncer:
    """The announcer of each policy the workers sample, with the identity they must share."""
    n = s.nats
    assert n is not None
    identity = n.identity | parsers_identity_of(opened.policies)
    policies = [announced(p) for p in opened.policies.values()]
    return PolicyAnnouncer(policies, every=n.announce_every, identity=identity)


def worker_registry(s: Settings, opened: Opened) -> WorkerRegistry:
    assert s.nats is not None
    return WorkerRegistry(every=s.nats.announce_every)


# --- what the run records of its policies ----------------------------------------------------


def tokenizer_lock(policy: OpenPolicy) -> dict[str, str]:
    """The policy's tokenizer as lock.json records it: the name the config gave it and the
    fingerprint of its vocabulary (see `tokenizer_identity`)."""
    p = policy.settings
    scripted = TOY_TOKENIZER if p.scripted else None  # a scripted policy's fallback, named
    return tokenizer_identity(policy.tokenizer, p.tokenizer or p.model_name or scripted)


def policies_lock(opened: Mapping[str, OpenPolicy]) -> dict[str, object]:
    """What lock.json records of a run's policies: the first's as the run's own, and each one's
    by name when the config names them (`policies:`)."""
    first = next(iter(opened.values()))

    def lock(p: OpenPolicy) -> dict[str, object]:
        return {
            "renderer": p.settings.renderer_name,
            "tool_call_parser": p.tool_call_parser,
            "tokenizer": tokenizer_lock(p),
        }

    named = {name: lock(p) for name, p in opened.items() if p.settings.prefix}
    return {**lock(first), **({"policies": named} if named else {})}


def parsers_identity_of(opened: Mapping[str, OpenPolicy]) -> dict[str, str]:
    return parsers_identity({name: p.tool_call_parser for name, p in opened.items()})


def announced(policy: OpenPolicy) -> PolicyUpdated:
    """What the trainer announces of a policy at the start: the weights it resumed from (a
    trained one), or those it samples all run long (a frozen one)."""
    p = policy.settings
    if p.trainer is not None:
        assert policy.trainer is not None
        version, path, model = policy.trainer.version, policy.start_path or "", p.model_name
    else:
        version, path = 0, p.model_path or ""
        model = p.local_model() if p.backend == "local" else p.model_name
    return PolicyUpdated(
        version=version, sampler_path=path, base_model=model or "", base_url=policy.base_url, policy=p.name
    )

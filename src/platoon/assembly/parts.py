"""What a run of each purpose runs (`Part`s: names, classes and how each is built, known before
anything opens), and `assemble`, which resolves the config and returns the `Run`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog

from platoon import plugins
from platoon.assembly import builders as build
from platoon.assembly import worker
from platoon.assembly.part import Opened, Part
from platoon.assembly.run import Run
from platoon.assembly.settings import RunOptions, Settings, resolve
from platoon.bus import EventLog
from platoon.config import Config
from platoon.config.schema import PluginConfig
from platoon.envs.service import EnvService
from platoon.gateway import Gateway
from platoon.policy.base import SamplerFactory
from platoon.programs import EpisodeRunner, Grader
from platoon.stats.metrics import MetricsSink
from platoon.stats.progress import TrainProgress
from platoon.train.batcher import CreditAssigner
from platoon.train.distributed import LeaseKeeper, PolicyAnnouncer, WorkerRegistry
from platoon.train.evaluate import Evaluator
from platoon.train.loop import Scheduler
from platoon.train.policies import StepJoin
from platoon.train.sft import SftFeeder
from platoon.train.trainer import Trainer
from platoon.train.worker import FollowingRunner, PolicyFollower, ResultSeal

log = structlog.get_logger("platoon.assembly")


def assemble(
    config: Config,
    purpose: str,
    options: RunOptions | None = None,
    *,
    run_dir: str | Path | None = None,
    sampler_factory: SamplerFactory | None = None,
) -> Run:
    """The run `config` describes for `purpose`: its settings and parts, nothing started.

    `options`: what the command asked for besides the config (a scripted policy, an evaluation's
    split, a training run's resume and display, a worker's server and name, a served gateway's
    address, an SFT run's recorded episodes). `sampler_factory` (an object, in tests) replaces
    the model's sampler."""
    settings = resolve(config, purpose, options, run_dir=Path(run_dir) if run_dir is not None else None)
    made = [] if purpose == "gateway" else [_plugin(p) for p in config.plugins]
    return Run(settings, _parts(settings, made), sampler_factory=sampler_factory)


def _plugin(p: PluginConfig) -> Part:
    """A plugin's part: the component the config names, made now (its declarations may be its own)."""
    component = plugins.plugin_component(
        p.handler or p.component or "", event_names=p.events, options=p.options
    )
    name = getattr(component, "name", None) or type(component).__name__
    return Part(f"plugin:{name}", type(component), lambda opened: component, component)


def _parts(s: Settings, plugs: Sequence[Part]) -> list[Part]:
    """The parts of a run of `s.purpose`, in the order they are attached."""

    def part(name: str, kind: type, builder: Callable[[Settings, Opened], object]) -> Part:
        return Part(name, kind, functools.partial(builder, s))

    purpose = s.purpose
    log_part = part("event-log", EventLog, build.event_log)
    envs = [Part(f"env:{e.name}", EnvService, functools.partial(build.env_service, e)) for e in s.envs]
    gateway = part("gateway", Gateway, build.gateway)
    if purpose == "gateway":
        return [gateway, *([log_part] if s.event_log else [])]
    if purpose == "worker":
        from platoon.bus.nats import NatsBridge  # the nats extra: imported only by a distributed run

        return [
            *envs,
            gateway,
            part("episode-runner", FollowingRunner, worker.following_runner),
            part("grader", Grader, build.grader),
            part("result-seal", ResultSeal, worker.result_seal),
            part("policy-follower", PolicyFollower, worker.policy_follower),
            *plugs,
            part("nats:results", NatsBridge, worker.results_bridge),
            part("nats:work", NatsBridge, worker.work_bridge),
        ]
    metrics = part("metrics", MetricsSink, build.metrics)
    if purpose == "sft":
        return [log_part, part("sft-feeder", SftFeeder, build.sft_feeder), *_trainers(s), metrics, *plugs]
    evaluator = [part("evaluator", Evaluator, build.evaluator)] if s.eval is not None else []
    rollouts = [
        gateway,
        part("episode-runner", EpisodeRunner, build.episode_runner),
        part("grader", Grader, build.grader),
    ]
    if purpose in ("eval", "rollout"):
        return [log_part, *envs, *rollouts, *evaluator, *plugs]
    if s.nats is not None:
        from platoon.bus.nats import NatsBridge  # the nats extra: imported only by a distributed run

        rollouts = [
            part("nats", NatsBridge, build.nats_bridge),
            part("lease-keeper", LeaseKeeper, build.lease_keeper),
            part("policy-announcer", PolicyAnnouncer, build.policy_announcer),
            part("worker-registry", WorkerRegistry, build.worker_registry),
        ]
    assert s.metrics is not None
    return [
        log_part,
        *envs,
        *rollouts,
        part("credit-assigner", CreditAssigner, build.credit_assigner),
        *_trainers(s),
        part("scheduler", Scheduler, build.scheduler),
        *evaluator,
        *([part("progress", TrainProgress, build.progress)] if s.metrics.progress else []),
        metrics,
        *plugs,
    ]


def _trainers(s: Settings) -> list[Part]:
    """One trainer per trained policy, and where they train under their names the step join
    (RFC 0001)."""
    trained = s.trained()
    if not any(s.policies[name].prefix for name in trained):
        return [Part("trainer", Trainer, functools.partial(build.trainer, name)) for name in trained]
    return [
        *(Part(f"trainer:{name}", Trainer, functools.partial(build.trainer, name)) for name in trained),
        Part("step-join", StepJoin, functools.partial(build.step_join, s)),
    ]


__all__ = ["Opened", "Part", "assemble"]

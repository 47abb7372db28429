"""What a run of each purpose runs (`Part`s: names and classes, known before anything opens),
and `assemble`, which resolves the config and returns the `Run`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypedDict

import msgspec
import structlog

from platoon import plugins
from platoon.assembly.run import Part, Run
from platoon.assembly.settings import (
    Settings,
    SftSources,
    resolve,
)
from platoon.bus import EventLog
from platoon.config import Config, entry_names
from platoon.envs.service import EnvService
from platoon.gateway import Gateway
from platoon.models import loading
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


class ServedGateway(TypedDict, total=False):
    """What `platoon gateway serve` sets on a served gateway (the rest is the config's)."""

    host: str
    port: int
    model_name: str
    renderer_name: str


def _parts(settings: Settings, config: Config, plugin_components: Sequence[object]) -> list[Part]:

    purpose = settings.purpose
    envs = [Part(f"env:{name}", EnvService) for name in entry_names(config)]
    plugs = [
        Part(f"plugin:{getattr(c, 'name', None) or type(c).__name__}", type(c), c) for c in plugin_components
    ]
    if purpose == "gateway":
        return [Part("gateway", Gateway), *([Part("event-log", EventLog)] if settings.event_log else [])]
    if purpose == "worker":
        from platoon.bus.nats import NatsBridge  # the nats extra: imported only by a distributed run

        return [
            *envs,
            Part("gateway", Gateway),
            Part("episode-runner", FollowingRunner),
            Part("grader", Grader),
            Part("result-seal", ResultSeal),
            Part("policy-follower", PolicyFollower),
            *plugs,
            Part("nats:results", NatsBridge),
            Part("nats:work", NatsBridge),
        ]
    if purpose == "sft":
        return [
            Part("event-log", EventLog),
            Part("sft-feeder", SftFeeder),
            *_trainer_parts(settings, Trainer),
            Part("metrics", MetricsSink),
            *plugs,
        ]
    rollouts = [Part("gateway", Gateway), Part("episode-runner", EpisodeRunner), Part("grader", Grader)]
    if purpose in ("eval", "rollout"):
        evaluator = [Part("evaluator", Evaluator)] if purpose == "eval" else []
        return [Part("event-log", EventLog), *envs, *rollouts, *evaluator, *plugs]

    if settings.nats is not None:
        from platoon.bus.nats import NatsBridge  # the nats extra: imported only by a distributed run

        rollouts = [
            Part("nats", NatsBridge),
            Part("lease-keeper", LeaseKeeper),
            Part("policy-announcer", PolicyAnnouncer),
            Part("worker-registry", WorkerRegistry),
        ]
    assert settings.metrics is not None
    return [
        Part("event-log", EventLog),
        *envs,
        *rollouts,
        Part("credit-assigner", CreditAssigner),
        *_trainer_parts(settings, Trainer),
        Part("scheduler", Scheduler),
        *([Part("evaluator", Evaluator)] if settings.eval else []),
        *([Part("progress", TrainProgress)] if settings.metrics.progress else []),
        Part("metrics", MetricsSink),
        *plugs,
    ]


def _trainer_parts(settings: Settings, trainer: type) -> list[Part]:
    """One trainer per trained policy, and with several the step join (RFC 0001)."""
    trained = settings.trained()
    if not any(settings.policies[name].prefix for name in trained):
        return [Part("trainer", trainer) for _ in trained]
    return [*(Part(f"trainer:{name}", trainer) for name in trained), Part("step-join", StepJoin)]


def assemble(
    config: Config,
    purpose: str,
    *,
    run_dir: str | Path | None = None,
    policy: str | None = None,
    split: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    resume: bool = False,
    console: bool = True,
    live: bool = False,
    sampler_factory: SamplerFactory | None = None,
    nats_url: str | None = None,
    worker_name: str | None = None,
    drain_timeout: float | None = None,
    gateway: ServedGateway | None = None,
    events_dir: str | Path | None = None,
    sft: SftSources | None = None,
) -> Run:
    """The run `config` describes for `purpose`: its settings and parts, nothing started.

    `policy` (scripted:MODULE:ATTR) or `sampler_factory` (an object, in tests) replace the
    model's sampler; `split` and `progress` are the evaluator's; `resume`, `console` and `live`
    the training run's; `nats_url`, `worker_name` and `drain_timeout` a worker's; `gateway`
    (host, port, model_name, renderer_name) and `events_dir` a served gateway's; `sft` (the
    recorded episodes, filters and agent) an SFT run's."""
    directory = Path(run_dir) if run_dir is not None else None
    builtin = loading.builtin_model_dir(config.train.model_name) if config.train is not None else None
    if purpose in ("train", "worker", "sft") and config.train is not None and builtin is not None:
        # A trainer (and its workers) name a built-in model by its directory, which is built
        # (or pulled) when the run opens.
        config = msgspec.structs.replace(
            config, train=msgspec.structs.replace(config.train, model_name=builtin)
        )
    settings = resolve(
        config,
        purpose,
        run_dir=directory,
        policy=policy,
        split=split,
        progress=progress,
        resume=resume,
        console=console,
        live=live,
        sources=sft,
    )
    if purpose == "gateway":
        served, g = gateway or ServedGateway(), settings.gateway
        renderer = served.get("renderer_name")
        settings = replace(
            settings,
            gateway=msgspec.structs.replace(
                g,
                host=served.get("host", g.host),
                port=served.get("port", g.port),
                model_name=served.get("model_name", g.model_name),
            ),
            policies={
                name: replace(p, renderer_name=renderer) if renderer and i == 0 else p
                for i, (name, p) in enumerate(settings.policies.items())
            },
            event_log=events_dir is not None,
            run_dir=Path(events_dir) if events_dir is not None else None,
        )
    plugin_components = (
        []
        if purpose == "gateway"
        else [
            plugins.plugin_component(p.handler or p.component or "", event_names=p.events, options=p.options)
            for p in config.plugins
        ]
    )
    return Run(
        config,
        settings,
        _parts(settings, config, plugin_components),
        plugin_components,
        sampler_factory=sampler_factory,
        nats_url=nats_url,
        worker_name=worker_name,
        drain_timeout=drain_timeout,
    )

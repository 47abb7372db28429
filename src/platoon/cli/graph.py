"""`platoon graph`: the event graph of a run, from its components' declarations.

Nothing is opened to print it: no model, tokenizer, training service, environment or network.
The components' declarations are class attributes, so the graph is drawn from the classes a run
of the config would build (and from the config's plugin components, whose declarations may be
their own).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from platoon.bus.graph import event_graph
from platoon.config import Config, load_config

__all__ = ["PURPOSES", "graph", "run_components"]

PURPOSES = ("train", "eval", "rollout", "worker")


def run_components(config: Config, purpose: str) -> list[tuple[str, Any]]:
    """(name, class or instance) of each component a run of `purpose` builds from `config`."""
    from platoon import system
    from platoon.bus import EventLog
    from platoon.envs.service import EnvService
    from platoon.gateway import Gateway
    from platoon.programs import EpisodeRunner, Grader

    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {', '.join(PURPOSES)}, not {purpose!r}")
    envs: list[tuple[str, Any]] = [(f"env:{name}", EnvService) for name in system.entry_names(config)]
    plugins = [
        (f"plugin:{getattr(c, 'name', type(c).__name__)}", c) for c in system.plugin_components(config)
    ]
    rollouts: list[tuple[str, Any]] = [
        ("gateway", Gateway),
        ("episode-runner", EpisodeRunner),
        ("grader", Grader),
    ]
    if purpose == "worker":
        from platoon.bus.nats import NatsBridge
        from platoon.train.distributed import FollowingRunner, PolicyFollower, ResultSeal

        return [
            *envs,
            ("gateway", Gateway),
            ("episode-runner", FollowingRunner),
            ("grader", Grader),
            ("result-seal", ResultSeal),
            ("policy-follower", PolicyFollower),
            *plugins,
            ("nats:results", NatsBridge),
            ("nats:work", NatsBridge),
        ]
    if purpose in ("eval", "rollout"):
        return [("event-log", EventLog), *envs, *rollouts, *plugins]
    from platoon.stats.metrics import MetricsSink
    from platoon.stats.progress import TrainProgress
    from platoon.train.batcher import CreditAssigner
    from platoon.train.trainer import Trainer

    if config.nats is not None:
        from platoon.bus.nats import NatsBridge
        from platoon.train.distributed import LeaseKeeper, PolicyAnnouncer, WorkerRegistry

        rollouts = [
            ("nats", NatsBridge),
            ("lease-keeper", LeaseKeeper),
            ("policy-announcer", PolicyAnnouncer),
            ("worker-registry", WorkerRegistry),
        ]
    return [
        ("event-log", EventLog),
        *envs,
        *rollouts,
        ("credit-assigner", CreditAssigner),
        *_trainers(config, Trainer),
        ("progress", TrainProgress),
        ("metrics", MetricsSink),
        *plugins,
    ]


def _trainers(config: Config, trainer: Any) -> list[tuple[str, Any]]:
    """One trainer per trained policy, and the step join when there are several (RFC 0001)."""
    if not config.policies:
        return [("trainer", trainer)]
    from platoon.train.policies import StepJoin

    trained = [name for name, policy in config.policies.items() if not policy.frozen]
    return [*((f"trainer:{name}", trainer) for name in trained), ("step-join", StepJoin)]


def graph(args: Any) -> int:
    from platoon import system
    from platoon.cli import EXIT_CONFIG, CommandError

    path = Path(args.config)
    config = load_config(path, args.overrides)
    if args.purpose in ("train", "worker") and config.train is None:
        raise CommandError(f"{path} has no train: section, so it has no {args.purpose} run", EXIT_CONFIG)
    system.import_packages(config, path.resolve().parent)
    drawn = event_graph(run_components(config, args.purpose))
    if args.mermaid:
        print(drawn.mermaid(), end="")
    else:
        print(drawn.text(f"the event graph of {path}, purpose {args.purpose}"), end="")
    return 0

"""Assembling a run: the one place where a config becomes components.

    run = assemble(config, "train", RunOptions(...), run_dir=...)  # resolved once; nothing starts
    run.parts                          # what will run: each component's name, class and build
    async with run.running() as bus:   # services opened, each part built over them and started
        ...

What each purpose runs (`platoon graph CONFIG --purpose P` lists it from `run.parts`):

    rollout   event log, env services, gateway, runner, grader, plugins
    eval      the same and the evaluator
    train     event log, env services, gateway, runner, grader (with `nats:` instead: the bridge,
              lease keeper, policy announcer and worker registry), credit assigner, trainer,
              scheduler, evaluator (with `eval:`), progress display, metrics, plugins
    worker    env services, gateway, following runner, grader, result seal, policy follower,
              plugins and the two NATS bridges, run by `Run.worker()` (a worker starts in stages)
    gateway   the gateway alone, and an event log if asked for (`platoon gateway serve`)
    sft       event log, the SFT feeder (recorded datums in place of rollouts and credit),
              trainer(s), metrics, plugins (`platoon sft`)

The config is read here and nowhere after: `resolve` turns it into one settings object per
component (`Settings`), and a component gets its own, never the `Config`. A run has one policy or
several (`Settings.policies`, never empty: one is the case of one); each (its model, tokenizer,
renderer, training service, training client and sampler factory) is opened by `open_policies`,
once per run; the training services are opened there and only there.

The rooms: `settings` (the config, resolved), `parts` (what each purpose runs, and `assemble`),
`part` (a part, and what it is built over), `policies` (opening a policy), `builders` (each
part's build), `run` (the run's lifecycle and resumption), `nats` and `worker` (a distributed
run's trainer and worker sides), `sft` (an SFT run's recorded episodes, read and checked).
"""

from __future__ import annotations

from platoon.assembly.nats import nats_settings
from platoon.assembly.part import Opened, Part
from platoon.assembly.parts import assemble
from platoon.assembly.policies import OpenPolicy, load_policy, open_policies
from platoon.assembly.run import Run
from platoon.assembly.settings import (
    PURPOSES,
    CreditSettings,
    MetricsSettings,
    NatsSettings,
    PolicySettings,
    Purpose,
    RunnerSettings,
    RunOptions,
    ServedGateway,
    Settings,
    SftSettings,
    SftSources,
    check_training_service,
    credit_settings,
    entry_names,
    entry_settings,
    import_packages,
    resolve,
)
from platoon.gateway import GatewaySettings
from platoon.train.evaluate import EvalSettings
from platoon.train.loop import SchedulerSettings

__all__ = [
    "PURPOSES",
    "CreditSettings",
    "EvalSettings",
    "GatewaySettings",
    "MetricsSettings",
    "NatsSettings",
    "OpenPolicy",
    "Opened",
    "Part",
    "PolicySettings",
    "Purpose",
    "Run",
    "RunOptions",
    "RunnerSettings",
    "SchedulerSettings",
    "ServedGateway",
    "Settings",
    "SftSettings",
    "SftSources",
    "assemble",
    "check_training_service",
    "credit_settings",
    "entry_names",
    "entry_settings",
    "import_packages",
    "load_policy",
    "nats_settings",
    "open_policies",
    "resolve",
]

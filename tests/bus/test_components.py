"""Every component declares what it takes and publishes, and its real subscriptions agree.

The declarations (`ComponentBase.subscribes` / `publishes`) are what `platoon graph` draws and
what the docs are checked against, so they must say what the code does: each component is
attached to a bus of its own (or started, for those that subscribe when they start), and the
bus's subscriptions are compared with what it declares, both ways.
"""

from __future__ import annotations

import importlib
import io
import pkgutil
from pathlib import Path

import anyio
import pytest
from rich.console import Console

import platoon
from platoon.bus import Bus, ComponentBase, attach
from platoon.bus.events import (
    AgentFinished,
    AgentSpawned,
    EpisodeAbandoned,
    EpisodeGraded,
    EpisodeRequested,
    Event,
    ModelCallFinished,
    PolicyAnnounced,
    PolicyUpdated,
    Reply,
    RunFinished,
    WorkerStatus,
)

ROOT = Path(__file__).resolve().parents[2]

# What a component takes that it does not subscribe to when it is attached: the replies to its
# requests (`bus.request` takes those) and, for the runner, the model calls a command-line
# harness counts while its agent runs.
TAKEN_LATER = {
    "EpisodeRunner": {ModelCallFinished},
    "FollowingRunner": {ModelCallFinished},
    # what an evaluation collects while it runs
    "Evaluator": {ModelCallFinished, AgentSpawned, AgentFinished, EpisodeGraded, EpisodeAbandoned},
}


def all_component_classes() -> set[type]:
    """Every subclass of ComponentBase in platoon, once every module is imported."""
    for info in pkgutil.walk_packages(platoon.__path__, "platoon."):
        if ".backends." in info.name or info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except ImportError:  # an optional extra this environment lacks
            continue
    found, todo = set(), [ComponentBase]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("platoon.") and sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def components(tmp_path: Path, toy_tokenizer) -> list[object]:
    """One instance of every component class, built as cheaply as it allows."""
    from platoon.bus import EventLog
    from platoon.bus.nats import NatsBridge, Routes
    from platoon.config.schema import TrainConfig
    from platoon.credit import CreditConfig
    from platoon.envs import build_env_service
    from platoon.gateway import Gateway, GatewayPolicy, GatewaySettings
    from platoon.gateway.renderers import get_renderer
    from platoon.plugins import EventHandlerPlugin
    from platoon.programs import EpisodeRunner, Grader
    from platoon.stats.metrics import MetricsSettings, MetricsSink
    from platoon.stats.progress import TrainProgress
    from platoon.testing.policies import ScriptedSamplerFactory
    from platoon.train.batcher import CreditAssigner, CreditSettings
    from platoon.train.checkpoints import CheckpointStore
    from platoon.train.distributed import LeaseKeeper, PolicyAnnouncer, WorkerRegistry
    from platoon.train.evaluate import Evaluator
    from platoon.train.loop import Scheduler, SchedulerSettings
    from platoon.train.policies import StepJoin
    from platoon.train.sft import SftFeeder, SftPlan
    from platoon.train.trainer import Trainer, TrainerSettings
    from platoon.train.worker import FollowingRunner, PolicyFollower, ResultSeal

    async def sampler_for(policy: PolicyUpdated) -> None:
        return None

    follower = PolicyFollower(sampler_for)
    return [
        EventLog(tmp_path),
        build_env_service("vowels", "python://vowels:Vowels", None, {}),
        Gateway(
            GatewayPolicy(
                get_renderer("qwen3_instruct", toy_tokenizer), ScriptedSamplerFactory(toy_tokenizer, ["done"])
            ),
            GatewaySettings(serve_http=False),
        ),
        EpisodeRunner([]),
        FollowingRunner([], follower=follower),
        Grader(),
        CreditAssigner(CreditSettings(group_size=2, batch_size=1, credit=CreditConfig())),
        Trainer(
            None,
            TrainerSettings(train=TrainConfig(model_name="m", renderer_name="qwen3")),
            CheckpointStore(tmp_path),
        ),
        StepJoin(["planner", "executor"]),
        TrainProgress(3, console=Console(file=io.StringIO())),
        MetricsSink(tmp_path, MetricsSettings(console=False)),
        WorkerRegistry(),
        PolicyAnnouncer(PolicyUpdated(version=0, sampler_path="", base_model="m")),
        LeaseKeeper(lease=5.0),
        follower,
        ResultSeal(worker="w", envs={"vowels"}),
        Scheduler(
            SchedulerSettings({}, {}, batch_size=1, group_size=1, seed=0, total_steps=None, max_staleness=0)
        ),
        Evaluator(None, run_dir=tmp_path),
        SftFeeder(SftPlan(train={}, heldout={}, batch_size=1, epochs=1, seed=0), {}),
        EventHandlerPlugin("plugin", lambda event: None, [RunFinished, PolicyUpdated]),
        NatsBridge(
            "nats://127.0.0.1:4222",
            run="r",
            routes=Routes(
                mirror=[PolicyAnnounced, WorkerStatus],
                work=[EpisodeRequested],
                withdraw=[EpisodeAbandoned],
                consume_work=True,
            ),
        ),
    ]


@pytest.fixture
def built(tmp_path, toy_tokenizer, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "quickstart"))
    return components(tmp_path, toy_tokenizer)


def test_every_component_class_is_declared_and_checked_here(built):
    classes = all_component_classes()
    assert len(classes) >= 15
    assert classes <= {type(c) for c in built}, "add the new component to components() above"
    for cls in classes:
        for types in (cls.subscribes, cls.publishes):
            assert isinstance(types, tuple)
            assert all(isinstance(t, type) and issubclass(t, Event) for t in types), cls
        assert cls.subscribes, f"{cls.__name__} takes nothing"


async def _subscriptions(component: object) -> set[type]:
    """The event types `component` subscribes to once attached (or started)."""
    async with Bus() as bus:
        if type(component).__name__ == "EnvService":  # it subscribes as it starts
            async with anyio.create_task_group() as tg:
                await tg.start(component.run, bus)
                taken = {t for _, types in bus.subscriptions() for t in types}
                tg.cancel_scope.cancel()
            return taken
        attach([component], bus)
        return {t for _, types in bus.subscriptions() for t in types}


@pytest.mark.anyio
async def test_each_components_subscriptions_are_what_it_declares(built):
    for component in built:
        name = type(component).__name__
        real = await _subscriptions(component)
        declared = set(component.subscribes)
        assert real, f"{name} subscribed to nothing"
        assert all(issubclass(t, tuple(declared)) for t in real), (
            f"{name} subscribes to {sorted(t.__name__ for t in real - declared)} without declaring it"
        )
        expected = {t for t in declared if not issubclass(t, Reply)} - TAKEN_LATER.get(name, set())
        expected |= {t for t in declared if issubclass(t, Reply)} & real  # replies it takes as facts
        assert expected <= real, (
            f"{name} declares {sorted(t.__name__ for t in expected - real)} but never subscribes"
        )


@pytest.mark.anyio
async def test_attach_subscribes_once(built):
    for component in built:
        if type(component).__name__ == "EnvService":
            continue
        async with Bus() as bus:
            attach([component, component], bus)
            first = len(bus.subscriptions())
            component.attach(bus)
            assert len(bus.subscriptions()) == first, type(component).__name__


def test_instances_declare_their_own_settings(built):
    by_class = {type(c).__name__: c for c in built}
    bridge = by_class["NatsBridge"]
    assert set(bridge.subscribes) == {PolicyAnnounced, WorkerStatus, EpisodeRequested, EpisodeAbandoned}
    assert {PolicyAnnounced, WorkerStatus, EpisodeRequested} <= set(bridge.publishes)
    assert EpisodeAbandoned not in bridge.publishes  # withdrawn requests are not brought in
    assert type(bridge).subscribes == (Event,)  # the class: any event its settings name
    assert by_class["EventHandlerPlugin"].subscribes == (RunFinished, PolicyUpdated)

"""The run's lifecycle: `Run.running()` opens its policies and services, builds its components
(checked against its parts) and runs them on a bus of their own; a training run resumes here.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import structlog

from platoon.assembly.builders import (
    announced,
    env_services,
    parsers_identity_of,
    policies_lock,
)
from platoon.assembly.builders import gateway as build_gateway
from platoon.assembly.builders import grader as build_grader
from platoon.assembly.nats import (
    trainer_components,
)
from platoon.assembly.policies import OpenPolicy, load_policy, open_policies
from platoon.assembly.settings import TRAINING, Settings, check_training_service
from platoon.assembly.sft import sft_identity, sft_plan, with_schedule
from platoon.assembly.worker import build_worker
from platoon.bus import Bus, EventLog, running
from platoon.config import AssemblyError, Config, write_run_files
from platoon.config.policies import resolve_policies
from platoon.gateway import Gateway
from platoon.policy.base import SamplerFactory
from platoon.programs import EpisodeRunner, Grader
from platoon.programs.runner import checked_entry
from platoon.stats.metrics import MetricsSink, counted_from_zero, is_eval_row
from platoon.stats.progress import TrainProgress
from platoon.train.batcher import CreditAssigner
from platoon.train.checkpoints import (
    CheckpointStore,
    ResumeError,
)
from platoon.train.evaluate import Evaluator
from platoon.train.loop import Scheduler
from platoon.train.policies import StepJoin, policy_stores, resume_points
from platoon.train.sft import SftFeeder, SftPlan
from platoon.train.trainer import Trainer
from platoon.train.worker import Worker

C = TypeVar("C")

log = structlog.get_logger("platoon.assembly")


@dataclass(frozen=True)
class Part:
    """One component of a run, known before anything starts: its name and class, and the
    component itself where it is made up front (a plugin, whose declarations may be its own)."""

    name: str
    kind: type
    instance: object = None

    @property
    def declares(self) -> object:
        """What holds the component's declarations (`subscribes`, `publishes`)."""
        return self.instance if self.instance is not None else self.kind


def run_identity(config: Config) -> dict[str, object]:
    """What a resumed run must share with the run it resumes (checked against identity.json)."""
    train = config.train
    assert train is not None
    identity: dict[str, object] = {
        "model_name": train.model_name,
        "renderer_name": train.renderer_name,
        "lora_rank": train.lora_rank,
        "eval_splits": [e.splits.eval for e in config.environments],
        "holdout": None,  # never set; kept so that identity.json files written before compare equal
    }
    if config.policies:  # several policies: what each of them is, too
        identity["policies"] = {
            name: {
                "model_name": spec.train.model_name,
                "renderer_name": spec.train.renderer_name,
                "lora_rank": spec.train.lora_rank,
                "frozen": spec.frozen,
            }
            for name, spec in resolve_policies(config).items()
        }
    return identity


def _forget_metrics_from(run_dir: Path, step: int) -> None:
    """Drop metrics of steps a resume trains again, so each step is in metrics.jsonl once:
    those after `step`, the steps its checkpoint had trained (an eval at `step` stays). Rows of
    platoon 0.2, which counted steps from 0, are renumbered first, as the new rows count."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a crash
    rows = [r for r in records if isinstance(r, dict)]
    if counted_from_zero(rows):
        records = [
            r if not isinstance(r, dict) or is_eval_row(r) else {**r, "step": r["step"] + 1} for r in records
        ]
    kept = [r for r in records if not isinstance(r, dict) or r.get("step", -1) <= step]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))


class Run:
    """A run of one purpose: its settings and parts; `running()` opens and starts it."""

    def __init__(
        self,
        config: Config,
        settings: Settings,
        parts: list[Part],
        plugin_components: list[object],
        *,
        sampler_factory: SamplerFactory | None = None,
        nats_url: str | None = None,
        worker_name: str | None = None,
        drain_timeout: float | None = None,
    ) -> None:
        self.config = config  # read only to build env services, rules and bridges (see _build)
        self.settings = settings
        self.parts = parts
        self.purpose = settings.purpose
        self._plugins = plugin_components
        self._sampler_factory = sampler_factory
        self._nats_url = nats_url
        self._worker_name = worker_name
        self._drain_timeout = drain_timeout
        self.components: list[object] | None = None  # once running, in the order of the parts
        self.plan: SftPlan | None = None  # an SFT run's, once its recorded episodes are read

    def component(self, kind: type[C]) -> C:
        """The running component of class `kind` (the one there is)."""
        assert self.components is not None, "the run is not running"
        [found] = [c for c in self.components if isinstance(c, kind)]
        return found

    def declared(self) -> list[tuple[str, object]]:
        """(name, class or instance) of every component, in the order they are attached:
        what `platoon graph` draws, known without opening anything."""
        return [(p.name, p.declares) for p in self.parts]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Bus]:
        """Open the run's services, build its components and run them on a bus of their own;
        yields the bus. Leaving the block cancels the components and closes the services."""
        if self.purpose == "worker":
            raise AssemblyError("a worker runs in stages: use Run.worker()")
        for entry in self.settings.runner.entries if self.settings.runner else ():
            checked_entry(entry)  # a misnamed harness is said now, not after the model loads
        async with self._opened() as components:
            self.components = components
            async with Bus() as bus, running(bus, components):
                yield bus

    @contextlib.asynccontextmanager
    async def _opened(self) -> AsyncIterator[list[object]]:
        s = self.settings
        if s.purpose in TRAINING:
            async with self._opened_training() as components:
                yield components
            return
        loaded = {name: load_policy(p) for name, p in s.policies.items()}
        if s.purpose in ("eval", "rollout"):
            assert s.run_dir is not None
            write_run_files(s.run_dir, self.config, {**policies_lock(loaded), "policy": s.policy.scripted})
        async with open_policies(loaded) as opened:
            yield self._build(opened)

    @contextlib.asynccontextmanager
    async def _opened_training(self) -> AsyncIterator[list[object]]:
        """Open a run that trains: a checkpoint store, a resume point, a training client and a
        trainer per trained policy (each of several under `checkpoints/<policy>/`)."""
        s = self.settings
        run_dir = s.run_dir
        assert run_dir is not None
        if self._sampler_factory is None:
            check_training_service(self.config)
        trained = s.trained()
        loaded = {name: load_policy(p) for name, p in s.policies.items()}  # before the run exists
        run_store = CheckpointStore(run_dir)  # the run's identity.json
        stores = policy_stores(run_dir, trained, several=any(s.policies[n].prefix for n in trained))
        identity = run_identity(self.config)
        if s.sft is not None:  # its data, read and checked before the run exists
            self.plan = sft_plan(s.sft, loaded, trained)
            for name in trained:
                loaded[name].settings = with_schedule(loaded[name].settings, self.plan, s.sft.save_every)
            identity["sft"] = sft_identity(self.plan)
        if s.resume:
            run_store.check_identity(identity)
            candidates = resume_points(stores)
            if not any(candidates.values()):
                log.info("no checkpoint yet: the run starts from step 1", run_dir=str(run_dir))
        else:
            candidates = {name: [] for name in trained}
            if any(store.path.exists() for store in stores.values()):
                raise ResumeError(
                    f"{run_dir} already holds a training run; pass --resume {run_dir} to continue it"
                )
            run_store.write_identity(identity)
        async with open_policies(
            loaded,
            run_dir=run_dir,
            stores=stores,
            candidates=candidates,
            sampler_factory=self._sampler_factory,
        ) as opened:
            resumed = [p.checkpoint.step for p in opened.values() if p.checkpoint is not None]
            start_step = min(resumed) if resumed else 0  # the steps trained: the next one's index
            if s.resume:
                _forget_metrics_from(run_dir, start_step)
            # Only now that the run could start: a failed resume leaves the run's files as they were.
            write_run_files(run_dir, self.config, {**policies_lock(opened), "resumed_from_step": start_step})
            yield self._build(opened, start_step=start_step)

    def _build(self, opened: dict[str, OpenPolicy], *, start_step: int = 0) -> list[object]:
        """The components, in the order of the parts, over the run's opened policies."""
        s = self.settings
        config = self.config
        policy = next(iter(opened.values()))  # the run's own

        def gateway() -> Gateway:
            return build_gateway(s.gateway, opened, {name: p.factory() for name, p in opened.items()})

        if s.purpose == "gateway":
            built: list[object] = [gateway()]
            if s.event_log:
                assert s.run_dir is not None
                built.append(EventLog(s.run_dir, flush_every=1))
            return self._checked(built)

        if s.purpose == "sft":
            return self._built_sft(list(opened.values()), start_step)

        # `tinker` judges that name no service or model use the run's own.
        def grader() -> Grader:
            return build_grader(
                config,
                s,
                tinker_base_url=policy.base_url,
                tinker_api_key=policy.api_key,
                model_name=s.policy.model_name,
            )

        envs = env_services(config, s.run_dir)
        assert s.runner is not None
        runner = s.runner
        if s.purpose in ("eval", "rollout"):
            assert s.run_dir is not None
            return self._checked(
                [
                    EventLog(s.run_dir),
                    *envs,
                    gateway(),
                    EpisodeRunner(runner.entries, max_concurrent=runner.max_concurrent, seed=runner.seed),
                    grader(),
                    *([Evaluator(s.eval, run_dir=s.run_dir)] if s.eval is not None else []),
                    *self._plugins,
                ]
            )
        assert s.run_dir is not None
        trained = [p.trainer for p in opened.values() if p.trainer is not None]
        versions = {t.policy: t.version for t in trained}
        assert s.credit is not None and s.scheduler is not None and s.metrics is not None
        if s.nats is not None:
            nats = replace(s.nats, identity=s.nats.identity | parsers_identity_of(opened))
            rollouts = trainer_components(
                config, [announced(p) for p in opened.values()], url=self._nats_url, settings=nats
            )
        else:
            rollouts = [
                gateway(),
                EpisodeRunner(runner.entries, seed=runner.seed),
                grader(),
            ]
        c, m = s.credit, s.metrics
        return self._checked(
            [
                EventLog(s.run_dir),
                *envs,
                *rollouts,
                CreditAssigner(
                    group_size=c.group_size,
                    batch_size=c.batch_size,
                    credit=c.credit,
                    straggler_timeout=c.straggler_timeout,
                    straggler_quorum=c.straggler_quorum,
                    min_group_share=c.min_group_share,
                    sealed=c.sealed,
                    policies=c.policies,
                ),
                *self._trainers(trained),
                Scheduler(s.scheduler, start_step=start_step, versions=versions),
                *([Evaluator(s.eval, run_dir=s.run_dir)] if s.eval is not None else []),
                *(
                    [TrainProgress(m.total_steps or 0, start_step=start_step, limits=m.limits)]
                    if m.progress
                    else []
                ),
                self._metrics(m.total_steps),
                *self._plugins,
            ]
        )

    @staticmethod
    def _trainers(trained: list[Trainer]) -> list[Trainer | StepJoin]:
        """The trainers; where they train under their policies' names, the join of their steps."""
        joined = [t for t in trained if t.prefix]
        return [*trained, *([StepJoin([t.policy for t in joined])] if joined else [])]

    def _built_sft(self, policies: list[OpenPolicy], start_step: int) -> list[object]:
        """An SFT run's components: the feeder of recorded datums in place of rollouts and
        credit, then the trainers (and with several, the step join) and metrics of any run."""
        s = self.settings
        assert self.plan is not None and s.run_dir is not None
        trained = [p.trainer for p in policies if p.trainer is not None]
        feeder = SftFeeder(
            self.plan,
            {t.policy: t.client for t in trained},
            start_step=start_step,
            prefixed=any(t.prefix for t in trained),
        )
        metrics = self._metrics(self.plan.total_steps)
        return self._checked([EventLog(s.run_dir), feeder, *self._trainers(trained), metrics, *self._plugins])

    def _metrics(self, total_steps: int | None) -> MetricsSink:
        s, m = self.settings, self.settings.metrics
        assert s.run_dir is not None and m is not None
        return MetricsSink(
            s.run_dir,
            wandb=m.wandb,
            experiment=m.experiment,
            trial=m.trial,
            console=m.console,
            total_steps=total_steps,
            limits=m.limits,
        )

    def _checked(self, components: list[object]) -> list[object]:
        """The components, once checked against the parts the run said it would have."""
        kinds = [p.kind for p in self.parts]
        if len(components) != len(kinds) or not all(
            isinstance(c, k) for c, k in zip(components, kinds, strict=True)
        ):
            raise AssertionError(
                f"the {self.purpose} run built {[type(c).__name__ for c in components]}, "
                f"not its parts {[k.__name__ for k in kinds]}"
            )
        return components

    def worker(self, *, policy_wait: float = 30.0) -> Worker:
        """The rollout worker of a `worker` run (see `platoon.train.distributed.Worker`): its
        components built, nothing connected yet."""
        if self.purpose != "worker":
            raise AssemblyError(f"a {self.purpose} run is not a worker")
        built = build_worker(
            self.config,
            self.settings,
            self._plugins,
            nats_url=self._nats_url,
            name=self._worker_name,
            drain_timeout=self._drain_timeout,
            policy_wait=policy_wait,
        )
        self._checked([*built.components, built.results, built.work])
        return built

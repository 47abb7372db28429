"""The run's lifecycle: `Run.running()` opens its policies and services, builds each of its
parts over them and runs the components on a bus of their own; a training run resumes here.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypeVar

import structlog

from platoon.assembly.builders import policies_lock
from platoon.assembly.part import Opened, Part
from platoon.assembly.policies import load_policy, open_policies
from platoon.assembly.settings import TRAINING, Settings, check_services
from platoon.assembly.sft import sft_identity, sft_plan, with_schedule
from platoon.assembly.worker import opened_worker, worker_of
from platoon.bus import Bus, running
from platoon.config import AssemblyError, write_run_files
from platoon.policy.base import SamplerFactory
from platoon.programs.runner import checked_entry
from platoon.stats.metrics import counted_from_zero, is_eval_row
from platoon.train.checkpoints import Checkpoint, CheckpointStore, ResumeError
from platoon.train.policies import policy_stores, resume_points
from platoon.train.sft import SftPlan
from platoon.train.worker import Worker

C = TypeVar("C")

log = structlog.get_logger("platoon.assembly")


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
        self, settings: Settings, parts: list[Part], *, sampler_factory: SamplerFactory | None = None
    ) -> None:
        self.settings = settings
        self.parts = parts
        self.purpose = settings.purpose
        self._sampler_factory = sampler_factory
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
        async with self._opened() as opened:
            self.components = [part.build(opened) for part in self.parts]
            async with Bus() as bus, running(bus, self.components):
                yield bus

    @contextlib.asynccontextmanager
    async def _opened(self) -> AsyncIterator[Opened]:
        s = self.settings
        if s.purpose in TRAINING:
            async with self._opened_training() as opened:
                yield opened
            return
        loaded = {name: load_policy(p) for name, p in s.policies.items()}
        if s.purpose in ("eval", "rollout"):
            assert s.run_dir is not None
            write_run_files(s.run_dir, s.record, {**policies_lock(loaded), "policy": s.policy.scripted})
        async with open_policies(loaded) as opened:
            yield Opened(opened)

    @contextlib.asynccontextmanager
    async def _opened_training(self) -> AsyncIterator[Opened]:
        """Open a run that trains: a checkpoint store, a resume point, a training client and a
        trainer per trained policy (each of several under `checkpoints/<policy>/`)."""
        s = self.settings
        run_dir = s.run_dir
        assert run_dir is not None and s.identity is not None
        if self._sampler_factory is None:
            check_services(s.policies.values())
        trained = s.trained()
        loaded = {name: load_policy(p) for name, p in s.policies.items()}  # before the run exists
        stores = policy_stores(run_dir, trained, several=any(s.policies[n].prefix for n in trained))
        identity = dict(s.identity)
        if s.sft is not None:  # its data, read and checked before the run exists
            self.plan = sft_plan(s.sft, loaded, trained)
            for name in trained:
                loaded[name].settings = with_schedule(loaded[name].settings, self.plan, s.sft.save_every)
            identity["sft"] = sft_identity(self.plan)
        candidates = _resume_points(run_dir, stores, identity, resume=s.resume)
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
            write_run_files(run_dir, s.record, {**policies_lock(opened), "resumed_from_step": start_step})
            yield Opened(opened, start_step=start_step, plan=self.plan)

    def worker(self, *, policy_wait: float = 30.0) -> Worker:
        """The rollout worker of a `worker` run (see `platoon.train.distributed.Worker`): its
        components built, nothing connected yet."""
        if self.purpose != "worker":
            raise AssemblyError(f"a {self.purpose} run is not a worker")
        opened = opened_worker(self.settings, policy_wait=policy_wait)
        built = [part.build(opened) for part in self.parts]
        return worker_of(self.settings, built, opened)


def _resume_points(
    run_dir: Path, stores: dict[str, CheckpointStore], identity: dict[str, object], *, resume: bool
) -> dict[str, list[Checkpoint]]:
    """Each trained policy's checkpoints to resume from, newest first (none for a new run). A
    resumed run must be the one its folder holds (`identity`); a new one starts in a folder that
    holds none, and writes its identity."""
    run_store = CheckpointStore(run_dir)  # the run's identity.json
    if resume:
        run_store.check_identity(identity)
        candidates = resume_points(stores)
        if not any(candidates.values()):
            log.info("no checkpoint yet: the run starts from step 1", run_dir=str(run_dir))
        return candidates
    if any(store.path.exists() for store in stores.values()):
        raise ResumeError(f"{run_dir} already holds a training run; pass --resume {run_dir} to continue it")
    run_store.write_identity(identity)
    return {name: [] for name in stores}

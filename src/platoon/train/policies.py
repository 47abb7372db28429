"""What a run keeps once per policy when it has several (RFC 0001): checkpoint stores, resume
points, and the step that ends when every trained policy has stepped. The policies themselves
are opened by `platoon.assembly` (`open_policies`).

A run without `policies:` keeps its checkpoints where they always were (`checkpoints.jsonl` in
the run directory); one with several, each policy's under `checkpoints/<policy>/`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import structlog

from platoon.bus import Bus, ComponentBase, Stream
from platoon.bus.events import PolicyStepFinished, TrainStepFinished
from platoon.train.checkpoints import Checkpoint, CheckpointStore, ResumeError

__all__ = ["StepJoin", "policy_stores", "resume_points"]

log = structlog.get_logger("platoon.train")


def policy_stores(run_dir: Path, trained: Sequence[str], *, several: bool) -> dict[str, CheckpointStore]:
    """Where each trained policy records its checkpoints: the run directory for the one policy,
    `checkpoints/<policy>/` for each of several."""
    if not several:
        return {name: CheckpointStore(run_dir) for name in trained}
    return {name: CheckpointStore(run_dir / "checkpoints" / name) for name in trained}


def resume_points(stores: dict[str, CheckpointStore]) -> dict[str, list[Checkpoint]]:
    """Each policy's checkpoints a resume may start from, newest first, all at or before the
    newest step every policy saved (a run stopped between two policies' saves resumes from the
    step they all have). No policy starts from a checkpoint while another starts afresh."""
    found = {name: store.candidates() for name, store in stores.items()}
    if not all(found.values()):
        if any(found.values()):
            missing = sorted(name for name, candidates in found.items() if not candidates)
            raise ResumeError(
                f"policies {', '.join(missing)} have no checkpoint while others do; the run cannot "
                "resume all of them from one step"
            )
        return {name: [] for name in stores}
    common = min(candidates[0].step for candidates in found.values())
    return {name: [c for c in candidates if c.step <= common] for name, candidates in found.items()}


class StepJoin(ComponentBase):
    """Gathers each trained policy's `PolicyStepFinished` of a step into the step's one
    `TrainStepFinished`, so that the scheduler, metrics and progress see one step as ever."""

    name = "step-join"
    subscribes = (PolicyStepFinished,)
    publishes = (TrainStepFinished,)

    def __init__(self, policies: Sequence[str]) -> None:
        self.policies = tuple(policies)
        self.pending: dict[int, dict[str, dict[str, float]]] = {}
        self._events: Stream[PolicyStepFinished] | None = None

    def on_attach(self, bus: Bus) -> None:
        self._events = bus.stream(PolicyStepFinished, name=self.name).open()

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        assert self._events is not None
        with self._events as events:
            async for event in events:
                joined = self.add(event)
                if joined is not None:
                    await bus.publish(joined)

    def add(self, event: PolicyStepFinished) -> TrainStepFinished | None:
        """The step's `TrainStepFinished` once this was its last policy to finish, else None."""
        if event.policy not in self.policies:
            return None
        parts = self.pending.setdefault(event.step, {})
        parts[event.policy] = event.metrics
        if len(parts) < len(self.policies):
            return None
        del self.pending[event.step]
        metrics: dict[str, float] = {}
        for name in self.policies:
            metrics |= parts[name]
        return TrainStepFinished(step=event.step, metrics=metrics)

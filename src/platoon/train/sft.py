"""Supervised fine-tuning on recorded episodes: the plan of its steps and the component that
feeds them to the trainer (`platoon sft`).

An SFT run is a training run with its rollouts replaced by recorded datums: the `SftFeeder`
publishes each step's `BatchReady` (for each trained policy, its own datums) and the ordinary
`Trainer` trains it with Tinker's `cross_entropy` loss, saves checkpoints and publishes
`TrainStepFinished`, so metrics, the step line, the viewer's curves, checkpoints and
`--resume` are those of any run. The feeder publishes a step only once the step before it has
trained, and after each epoch's last step measures the loss per token of the held-out datums
(a forward pass, no gradient) and publishes it as an `EvalFinished` (`sft/heldout_loss`).

Which datums a step trains is a pure function of the seed and the step (`SftPlan.batch`): each
epoch is a fresh seeded shuffle, so a resumed run trains exactly the steps the stopped one had
left, on the same datums.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import structlog

from platoon.bus import Bus, ComponentBase, Stream
from platoon.bus.events import BatchReady, Datum, EvalFinished, RunFinished, TrainStepFinished
from platoon.credit import to_tinker
from platoon.policy.tinker import wait_future

if TYPE_CHECKING:
    import tinker

__all__ = ["SftFeeder", "SftPlan"]

log = structlog.get_logger("platoon.sft")


@dataclass(frozen=True)
class SftPlan:
    """What an SFT run trains: each policy's datums (training and held out), and how many per
    step and for how many epochs."""

    train: Mapping[str, Sequence[Datum]]  # policy -> the datums it trains on
    heldout: Mapping[str, Sequence[Datum]]  # policy -> the datums its held-out loss is measured on
    batch_size: int
    epochs: int
    seed: int

    @property
    def steps_per_epoch(self) -> int:
        """Steps of one pass: the policy with the most datums sets it (the others' batches run
        out first and their trainers skip those steps)."""
        most = max((len(d) for d in self.train.values()), default=0)
        return max(1, -(-most // self.batch_size))

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def ends_epoch(self, step: int) -> bool:
        return (step + 1) % self.steps_per_epoch == 0

    def batch(self, policy: str, step: int) -> list[Datum]:
        """The datums `policy` trains at `step`: its slice of the epoch's seeded shuffle."""
        datums = self.train.get(policy, ())
        epoch, index = divmod(step, self.steps_per_epoch)
        order = list(range(len(datums)))
        random.Random(f"{self.seed}:sft:{policy}:{epoch}").shuffle(order)
        return [datums[i] for i in order[index * self.batch_size : (index + 1) * self.batch_size]]


class SftFeeder(ComponentBase):
    """Publishes an SFT run's batches one step at a time, measures the held-out loss after each
    epoch, and ends the run (see the module docstring). `clients`: each trained policy's
    training client, for the held-out forward passes."""

    name = "sft-feeder"
    subscribes = (TrainStepFinished,)
    publishes = (BatchReady, EvalFinished, RunFinished)

    def __init__(
        self,
        plan: SftPlan,
        clients: Mapping[str, tinker.TrainingClient],
        *,
        start_step: int = 0,
        prefixed: bool = False,
    ) -> None:
        self.plan = plan
        self.clients = dict(clients)
        self.start_step = start_step
        self.prefixed = prefixed  # several policies: each one's held-out loss under its name
        self.done = anyio.Event()
        self.last: dict[str, float] = {}  # the last step's metrics
        self.heldout: list[dict[str, float]] = []  # each epoch's held-out metrics, in order
        self._events: Stream[TrainStepFinished] | None = None

    def on_attach(self, bus: Bus) -> None:
        self._events = bus.stream(TrainStepFinished, name=self.name).open()

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        assert self._events is not None
        plan = self.plan
        with self._events as finished:
            for step in range(self.start_step, plan.total_steps):
                for policy in self.clients:
                    datums = plan.batch(policy, step)
                    own = f"{policy}/" if self.prefixed else ""  # several: each one's under its name
                    stats = {
                        "sft/epoch": float(plan.epoch_of(step) + 1),
                        f"{own}train/datums": float(len(datums)),
                        f"{own}train/trained_tokens": float(sum(d.num_trained_tokens for d in datums)),
                    }
                    await bus.publish(BatchReady(step=step, datums=datums, stats=stats, policy=policy))
                async for event in finished:
                    if event.step == step:
                        self.last = event.metrics
                        break
                if plan.ends_epoch(step):
                    await self._measure(bus, step)
        await bus.publish(RunFinished(status="completed"))
        self.done.set()

    async def _measure(self, bus: Bus, step: int) -> None:
        """The held-out loss after `step`, the last of an epoch; recorded, as an evaluation is,
        at the number of steps trained."""
        if not any(self.plan.heldout.values()):
            return
        metrics = await self.heldout_loss()
        metrics["sft/epoch"] = float(self.plan.epoch_of(step) + 1)
        self.heldout.append(metrics)
        await bus.publish(EvalFinished(step=step + 1, metrics=metrics))

    async def heldout_loss(self) -> dict[str, float]:
        """Each policy's loss per held-out token under its current weights (forward only)."""
        out: dict[str, float] = {}
        for policy, client in self.clients.items():
            datums = list(self.plan.heldout.get(policy, ()))
            if not datums:
                continue
            tokens = sum(d.num_trained_tokens for d in datums)
            result = await wait_future(
                client.forward([to_tinker(d, "cross_entropy") for d in datums], "cross_entropy")
            )
            loss = float((getattr(result, "metrics", None) or {}).get("loss:sum", 0.0))
            prefix = f"{policy}/" if self.prefixed else ""
            out[f"{prefix}sft/heldout_loss"] = loss / max(tokens, 1)
            out[f"{prefix}sft/heldout_tokens"] = float(tokens)
            log.info("held-out loss measured", policy=policy, mean_nll=round(loss / max(tokens, 1), 4))
        return out

"""The trainer: one optimizer step per `BatchReady`, through a Tinker training client.

For each batch it drops datums whose policy is more than `max_staleness` versions old,
submits `forward_backward` and `optim_step` back to back (the SDK's recommended pipelining:
the optimizer step is queued before the gradients are awaited), saves sampler weights, and
publishes `PolicyUpdated` (the gateway switches samplers on it) and `TrainStepFinished`.
Every `save_every` steps it saves the full training state and records a checkpoint. Step
sampler weights that nothing can sample any more are deleted (`platoon.train.step_weights`).

With a reference policy (`train.kl`; with several policies, a policy's own `kl:`, whose
reference may be a frozen policy of the run), it first asks the reference for the logprobs of each
datum's sequence (Tinker `compute_logprobs`), reports `kl/mean` and folds the penalty into the
advantages (`platoon.credit.kl`). With a teacher (`train.distill`, or a policy's own `distill:`)
it scores each datum's sequence under the teacher the same way, reports `distill/reverse_kl` and
mixes the teacher's per-token advantage into the task's (`platoon.credit.distill`).

Several policies (RFC 0001): one trainer per trained policy, each with its own training client
and checkpoints; it takes only its policy's `BatchReady`, says which policy its events are of,
and (`prefix`) writes its own metrics under the policy's name (`planner/train/loss`) in a
`PolicyStepFinished`, which `StepJoin` gathers into the step's one `TrainStepFinished`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import structlog

from platoon.bus import Bus, ComponentBase, Stream
from platoon.bus.events import (
    BatchReady,
    CheckpointSaved,
    DatumsScored,
    EpisodeAbandoned,
    EpisodeFinished,
    EpisodeRequested,
    PolicyStepFinished,
    PolicyUpdated,
    TrainStepFinished,
    step_number,
)
from platoon.config.rundir import make_private_dir, write_private
from platoon.config.schema import TrainConfig
from platoon.credit import distill_advantages, filter_stale, kl_penalty, reference_targets, to_tinker
from platoon.credit.importance import CORRECTED_LOSSES, correct
from platoon.policy.tinker import wait_future
from platoon.train.checkpoints import Checkpoint, CheckpointStore
from platoon.train.health import health_metrics
from platoon.train.step_weights import StepWeights

if TYPE_CHECKING:
    import tinker

    from platoon.credit import Datum

__all__ = ["Trainer", "TrainerSettings"]

log = structlog.get_logger("platoon.trainer")


class TrainerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What a training step needs: the policy's `train:` whole, as the config has it (its base
    model, loss, optimizer, schedule, importance correction, KL and distillation), and what the
    run adds to it."""

    train: TrainConfig  # the policy's `train:`; `model_name` is the base model the service trains
    keep: int | None = None  # checkpoints kept (`checkpoint.keep`); None: all
    # whether rollouts sample the policy as it trains (RL): each step's sampler weights are
    # saved and announced, and datums more than `max_staleness` versions old are dropped. A
    # run without (`platoon sft`) trains every datum and saves samplers with checkpoints only.
    rollouts: bool = True
    base_url: str | None = None  # the training service's, recorded with each checkpoint

    def __post_init__(self) -> None:
        if self.train.correction is not None and self.train.loss_fn not in CORRECTED_LOSSES:
            raise ValueError(
                f"train.correction weighs the sampler's logprobs in a ratio loss "
                f"({', '.join(CORRECTED_LOSSES)}), and loss_fn is {self.train.loss_fn!r}"
            )


class Trainer(ComponentBase):
    """The trainer component (see the module docstring)."""

    name = "trainer"
    subscribes = (BatchReady, EpisodeRequested, EpisodeFinished, EpisodeAbandoned)
    publishes = (PolicyUpdated, CheckpointSaved, TrainStepFinished, PolicyStepFinished, DatumsScored)

    def __init__(
        self,
        training_client: tinker.TrainingClient,
        settings: TrainerSettings,
        checkpoints: CheckpointStore,
        *,
        version: int = 0,
        task_cursor_of: Callable[[int], int] | None = None,
        reference: tinker.SamplingClient | None = None,
        teacher: tinker.SamplingClient | None = None,
        policy: str = "default",
        prefix: str = "",
        delete: Callable[[str], Awaitable[None]] | None = None,
        digest: Callable[[str], str | None] | None = None,
    ) -> None:
        self.policy = policy
        self.delete = delete  # async (tinker path) -> None: deletes weights no longer needed
        self.digest = digest  # (tinker path) -> what checkpoints.jsonl records of its files
        self.prefix = prefix
        self.client = training_client
        self.reference = reference  # a sampling client of the reference policy, for the KL penalty
        self.teacher = teacher  # a sampling client of the teacher, for on-policy distillation
        self.settings = settings
        self.checkpoints = checkpoints
        self.version = version
        self.task_cursor_of = task_cursor_of or (lambda step: step + 1)
        self.idle_seconds = 0.0
        self.busy_seconds = 0.0
        self.waited_seconds = 0.0  # how long the trainer waited for the batch it is on
        self._batches: Stream[BatchReady] | None = None
        self.step_weights = StepWeights(settings.train.max_staleness)

    def on_attach(self, bus: Bus) -> None:
        self._batches = bus.stream(BatchReady, name=self.name).open()
        episodes = (EpisodeRequested, EpisodeFinished, EpisodeAbandoned)
        bus.subscribe(episodes, self._follow_episode, name=f"{self.name}:{self.policy}:episodes")

    def _follow_episode(self, event: EpisodeRequested | EpisodeFinished | EpisodeAbandoned) -> None:
        """Which policy versions episodes in flight may still sample (`StepWeights`)."""
        if isinstance(event, EpisodeRequested):
            version = event.policy_versions.get(self.policy, event.policy_version)
            self.step_weights.requested(event.episode_id, version)
        else:
            self.step_weights.ended(event.episode_id)

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        assert self._batches is not None
        await self._delete_leftovers()
        with self._batches as batches:
            waiting_since = time.monotonic()
            async for batch in batches:
                if batch.policy != self.policy:
                    continue
                started = time.monotonic()
                self.waited_seconds = started - waiting_since
                self.idle_seconds += self.waited_seconds
                await self.step(bus, batch)
                waiting_since = time.monotonic()
                self.busy_seconds += waiting_since - started

    async def step(self, bus: Bus, batch: BatchReady) -> None:
        import tinker

        started, train = time.monotonic(), self.settings.train  # the policy's `train:`
        staleness = train.max_staleness if self.settings.rollouts else None
        kept, dropped = filter_stale(batch.datums, self.version, staleness)
        metrics: dict[str, float] = {}
        if self.settings.rollouts:
            metrics["staleness/dropped_datums"] = float(dropped)
        if kept and self.settings.rollouts:
            metrics["staleness/mean"] = sum(self.version - d.policy_version for d in kept) / len(kept)
            metrics["staleness/max"] = float(max(self.version - d.policy_version for d in kept))
        if kept and self.reference is not None:
            kl_started = time.monotonic()
            kept, kl_stats = await self.kl(kept)
            metrics |= kl_stats
            metrics["time/reference"] = time.monotonic() - kl_started
        if kept and self.teacher is not None:
            teacher_started = time.monotonic()
            rows = await self._score(self.teacher, kept)
            kept, distill_stats = distill_advantages(
                kept,
                rows,
                train.distill.weight if train.distill else 1.0,
                scale=self._scale(kept),
            )
            metrics |= distill_stats
            metrics["time/teacher"] = time.monotonic() - teacher_started
        train_started = time.monotonic()
        if kept:
            sent = kept
            if train.correction is not None:
                sent, corrected = await self._correct(kept)
                metrics |= corrected
            data = [to_tinker(d, train.loss_fn) for d in sent]
            fwd_bwd = self.client.forward_backward(data, train.loss_fn, train.loss_fn_config or None)
            optim = self.client.optim_step(tinker.AdamParams(**msgspec.structs.asdict(train.optimizer)))
            result = await wait_future(fwd_bwd)
            optimized = await wait_future(optim)
            metrics |= _loss_metrics(result)
            metrics |= _optim_metrics(optimized)
            scored = _trainer_logprobs(result, len(sent))
            metrics |= health_metrics(
                kept,
                # recorded episodes (`platoon sft`) were sampled by another policy: no mismatch to measure
                scored if self.settings.rollouts else None,
                version=self.version,
                loss_fn=train.loss_fn,
                loss_fn_config=train.loss_fn_config,
                sent=sent,
            )
            if scored is not None and self.settings.rollouts:
                await bus.publish(_scored_event(batch, kept, scored, self.policy))
            trained = sum(d.num_trained_tokens for d in kept)
            if train.loss_fn == "cross_entropy" and "train/loss" in metrics and trained:
                metrics["train/loss_per_token"] = metrics["train/loss"] / trained  # the mean NLL
            metrics["time/train"] = time.monotonic() - train_started
            if self.settings.rollouts:
                await self._refresh_sampler(bus, batch, metrics)
            else:
                self.version += 1
        else:
            metrics["train/skipped"] = 1.0
            log.info("no datums to train on this step", step=step_number(batch.step), policy=self.policy)
        metrics["policy/version"] = float(self.version)
        last = train.max_training_steps is not None and batch.step + 1 >= train.max_training_steps
        every = train.save_every
        if (every and (batch.step + 1) % every == 0) or last:
            await self.save(bus, batch.step)
        metrics["time/step"] = time.monotonic() - started + batch.stats.get("time/rollout", 0.0)
        metrics["time/trainer_idle"] = self.waited_seconds
        total = self.idle_seconds + self.busy_seconds
        if total > 0:
            metrics["trainer/idle_fraction"] = self.idle_seconds / total
        if self.prefix:  # one of several policies: the step finishes when all of them trained
            metrics = {**batch.stats, **{self.prefix + k: v for k, v in metrics.items()}}
            await bus.publish(PolicyStepFinished(step=batch.step, policy=self.policy, metrics=metrics))
        else:
            await bus.publish(TrainStepFinished(step=batch.step, metrics={**batch.stats, **metrics}))

    async def _refresh_sampler(self, bus: Bus, batch: BatchReady, metrics: dict[str, float]) -> None:
        """Save the step's sampler weights and announce them (`PolicyUpdated`): the rollouts
        sample the new policy from now on."""
        refresh_started = time.monotonic()
        saved = await wait_future(self.client.save_weights_for_sampler(name=f"step-{batch.step + 1:06d}"))
        self.version += 1
        await bus.publish(
            PolicyUpdated(
                version=self.version,
                sampler_path=saved.path,
                base_model=self.settings.train.model_name,
                base_url=self.settings.base_url,
                policy=self.policy,
            )
        )
        metrics["time/sampler_refresh"] = time.monotonic() - refresh_started
        self.step_weights.published(self.version, saved.path)
        if self.delete is not None:  # before the step is reported: a run that ends has none left
            await self._delete(self.step_weights.unused(self._checkpoint_samplers()), "step sampler weights")
            self._record_step_weights(self.step_weights.paths())

    async def _correct(self, datums: list[Datum]) -> tuple[list[Datum], dict[str, float]]:
        """The datums with the importance correction (`train.correction`) in their advantages,
        from a forward pass of the trainer as it stands (`platoon.credit.importance`)."""
        assert self.settings.train.correction is not None
        started = time.monotonic()
        data = [to_tinker(d, self.settings.train.loss_fn) for d in datums]
        result = await wait_future(
            self.client.forward(data, self.settings.train.loss_fn, self.settings.train.loss_fn_config or None)
        )
        rows = _trainer_logprobs(result, len(datums))
        if rows is None:
            raise RuntimeError(
                "train.correction needs the trainer's logprobs of each datum, and the training "
                "service's forward returned none (loss_fn_outputs[i]['logprobs'])"
            )
        out, stats = correct(datums, rows, self.settings.train.correction)
        stats["time/correction"] = time.monotonic() - started
        return out, stats

    async def kl(self, datums: list[Datum]) -> tuple[list[Datum], dict[str, float]]:
        """The datums with the KL penalty folded in, and the KL metrics."""
        assert self.reference is not None, "a KL penalty needs its reference"
        rows = await self._score(self.reference, datums)
        return kl_penalty(
            datums,
            rows,
            (self.settings.train.kl.coefficient if self.settings.train.kl else 0.0),
            scale=self._scale(datums),
        )

    async def _score(self, client: tinker.SamplingClient, datums: list[Datum]) -> list[list[float | None]]:
        """Another policy's logprob of each target of each datum: its `compute_logprobs` of the
        datum's exact sequence, all datums at once."""
        import anyio
        import tinker

        rows: list[list[float | None]] = [[] for _ in datums]

        async def one(index: int) -> None:
            datum = datums[index]
            sequence = [*datum.model_input, datum.target_tokens[-1]]
            logprobs = await wait_future(client.compute_logprobs(tinker.ModelInput.from_ints(sequence)))
            rows[index] = reference_targets(datum, logprobs)

        async with anyio.create_task_group() as tg:
            for index in range(len(datums)):
                tg.start_soon(one, index)
        return rows

    def _scale(self, datums: list[Datum]) -> float:
        """The normalisation the datums' advantages carry: 1 / trained tokens under `token_mean`."""
        trained = sum(d.num_trained_tokens for d in datums)
        return 1.0 / trained if self.settings.train.loss_normalization == "token_mean" and trained else 1.0

    async def save(self, bus: Bus, step: int) -> Checkpoint:
        """Save the full training state (weights and optimizer) and record the checkpoint."""
        state = await wait_future(self.client.save_state(name=f"state-{step + 1:06d}"))
        sampler = await wait_future(self.client.save_weights_for_sampler(name=f"ckpt-{step + 1:06d}"))
        digests = {p: d for p in (state.path, sampler.path) if self.digest and (d := self.digest(p))}
        checkpoint = Checkpoint(
            step=step_number(step),  # checkpoints.jsonl counts as a user does
            state_path=state.path,
            sampler_path=sampler.path,
            policy_version=self.version,
            task_cursor=self.task_cursor_of(step),
            digests=digests,
        )
        self.checkpoints.append(checkpoint)
        if self.settings.keep:
            await self.forget(self.checkpoints.keep_newest(self.settings.keep))
        await bus.publish(
            CheckpointSaved(
                step=step,
                state_path=checkpoint.state_path,
                sampler_path=checkpoint.sampler_path,
                policy_version=checkpoint.policy_version,
                task_cursor=checkpoint.task_cursor,
                policy=self.policy,
            )
        )
        return checkpoint

    async def forget(self, dropped: list[Checkpoint]) -> None:
        """Delete the files of checkpoints no longer recorded. The record goes first, so a crash
        in between leaves files nobody points at, never a record of deleted files."""
        await self._delete([p for c in dropped for p in (c.state_path, c.sampler_path)], "an old checkpoint")

    async def _delete_leftovers(self) -> None:
        """Delete the step weights a stopped run left (`step_weights.json`): a resumed run
        samples its checkpoint's own weights, so nothing samples those any more."""
        if self.delete is None or not self._ledger.exists():
            return
        try:
            left = msgspec.json.decode(self._ledger.read_bytes(), type=list[str])
        except (OSError, msgspec.DecodeError) as exc:
            log.warning("could not read the step weights a stopped run left", error=str(exc))
            return
        protected = self._checkpoint_samplers()
        await self._delete([p for p in left if p not in protected], "step sampler weights of the stopped run")
        self._record_step_weights([])

    @property
    def _ledger(self) -> Path:
        return self.checkpoints.run_dir / "step_weights.json"

    def _record_step_weights(self, paths: list[str]) -> None:
        make_private_dir(self._ledger.parent)
        write_private(self._ledger, msgspec.json.encode(paths))

    def _checkpoint_samplers(self) -> set[str]:
        return {c.sampler_path for c in self.checkpoints.candidates(quiet=True)}

    async def _delete(self, paths: list[str], what: str) -> None:
        if self.delete is None:
            return
        for path in paths:
            try:
                await self.delete(path)
            except Exception as exc:  # the run goes on; the files stay
                log.warning(f"could not delete {what}", path=path, error=str(exc))


def _trainer_logprobs(result: object, count: int) -> list[list[float]] | None:
    """The trainer's logprob of each target of each datum (`loss_fn_outputs[i]["logprobs"]`),
    or None where the service did not give them all."""
    outputs = getattr(result, "loss_fn_outputs", None)
    if not isinstance(outputs, list) or len(outputs) != count:
        return None
    rows = []
    for output in outputs:
        values = output.get("logprobs") if isinstance(output, dict) else None
        if values is None:
            return None
        rows.append([float(v) for v in (values.tolist() if hasattr(values, "tolist") else values)])
    return rows


def _scored_event(batch: BatchReady, kept: list[Datum], rows: list[list[float]], policy: str) -> DatumsScored:
    """The trainer's logprobs of the batch's datums, by their place in `batch` (stale ones, not
    trained, left empty): what the viewer lays over each sampled token."""
    by_datum = {id(d): row for d, row in zip(kept, rows, strict=True)}
    return DatumsScored(
        step=batch.step,
        policy=policy,
        logprobs=[by_datum.get(id(d), []) for d in batch.datums],
    )


def _optim_metrics(result: object) -> dict[str, float]:
    """`train/grad_norm` (before clipping) where the training service reports it (the embedded
    backend does; hosted Tinker's optim_step may not, and then there is none)."""
    metrics = getattr(result, "metrics", None) or {}
    out = {}
    for key, value in metrics.items():
        if key.split(":")[0] == "grad_norm" and isinstance(value, int | float):
            out["train/grad_norm"] = float(value)
    return out


def _loss_metrics(result: tinker.ForwardBackwardOutput) -> dict[str, float]:
    """`loss:sum` and friends from a ForwardBackwardOutput, as `train/<name>` metrics."""
    out: dict[str, float] = {}
    for key, value in (getattr(result, "metrics", None) or {}).items():
        name = key.split(":")[0]
        out[f"train/{name}"] = float(value)
    return out

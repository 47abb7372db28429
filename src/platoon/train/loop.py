"""The training loop, read top to bottom.

    for step in steps:
        wait until the trainer is at most `max_staleness` steps behind
        request `batch_size` tasks x `group_size` rollouts for this step
        (episodes play, get graded; the credit assigner makes a batch; the trainer trains
         on it and publishes new sampler weights, which the gateway switches to)
        evaluate every `eval.every` steps

Everything between requesting rollouts and the new policy happens in components on the bus
(see `platoon.system`), which is why the loop itself is this short. With `max_staleness: 0`
a step's rollouts start only after the previous step trained (strictly on-policy); with 1,
the rollouts of step s run while step s-1 trains.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec
import structlog

from platoon import system
from platoon.bus import Bus, EventLog
from platoon.bus.events import EpisodeRequested, RunFinished, TaskRef, TrainStepFinished, new_id
from platoon.config import Config, load_config, load_site, run_dir, write_run_files
from platoon.config.policies import PolicySpec
from platoon.config.schema import workflow_for
from platoon.credit import CreditConfig
from platoon.gateway.core import GatewayPolicy
from platoon.policy.tinker import TinkerSamplerFactory
from platoon.train.batcher import CreditAssigner
from platoon.train.checkpoints import CheckpointStore, ResumeError, run_identity
from platoon.train.evaluate import as_json, eval_tasks, evaluate, evaluate_config, list_tasks
from platoon.train.policies import StepJoin, policy_services, policy_stores, resolved_specs, resume_points
from platoon.train.trainer import Trainer, TrainerSettings

__all__ = ["TaskOrder", "run", "train", "train_command"]

log = structlog.get_logger("platoon.train")

TINY_MODEL = system.TINY_MODEL


class TaskOrder:
    """Which tasks each step trains on: a pure function of the seed and the step.

    Each environment entry's tasks are shuffled per epoch with the seed; each slot of a step
    draws an entry by weight. Resuming at step s therefore requests exactly the tasks the
    interrupted run would have, without storing more than the step.
    """

    def __init__(
        self, tasks: dict[str, list[TaskRef]], weights: dict[str, float], batch_size: int, seed: int
    ):
        self.tasks = {name: list(found) for name, found in tasks.items() if found}
        if not self.tasks:
            raise ValueError("no training tasks: every environment's train split is empty")
        self.weights = {name: weights.get(name, 1.0) for name in self.tasks}
        self.batch_size = batch_size
        self.seed = seed
        self._drawn: list[str] = []
        # One generator for the whole sequence of draws, however the steps are asked for.
        self._rng = random.Random(f"{seed}:entries")

    def for_step(self, step: int) -> list[TaskRef]:
        names = list(self.tasks)
        while len(self._drawn) < (step + 1) * self.batch_size:
            self._drawn.append(
                self._rng.choices(names, [self.weights[n] for n in names])[0] if len(names) > 1 else names[0]
            )
        counts: dict[str, int] = dict.fromkeys(names, 0)
        for name in self._drawn[: step * self.batch_size]:
            counts[name] += 1
        out = []
        for name in self._drawn[step * self.batch_size : (step + 1) * self.batch_size]:
            out.append(self._task(name, counts[name]))
            counts[name] += 1
        return out

    def _task(self, name: str, position: int) -> TaskRef:
        tasks = self.tasks[name]
        epoch, index = divmod(position, len(tasks))
        order = list(range(len(tasks)))
        random.Random(f"{self.seed}:{name}:{epoch}").shuffle(order)
        return tasks[order[index]]


def _settings(config: Config | PolicySpec, base_url: str | None) -> TrainerSettings:
    train = config.train
    assert train is not None
    o = train.optimizer
    return TrainerSettings(
        base_model=train.model_name,
        loss_fn=train.loss_fn,
        loss_fn_config=dict(train.loss_fn_config),
        learning_rate=o.learning_rate,
        beta1=o.beta1,
        beta2=o.beta2,
        eps=o.eps,
        weight_decay=o.weight_decay,
        grad_clip_norm=o.grad_clip_norm,
        max_staleness=train.max_staleness,
        save_every=train.save_every,
        total_steps=train.max_training_steps,
        base_url=base_url,
        kl_coefficient=train.kl.coefficient if train.kl else 0.0,
        normalization=train.loss_normalization,
    )


def _credit(config: Config) -> CreditConfig:
    train = config.train
    assert train is not None
    workflow = train.workflow_config
    agents = config.environments[0].agents if config.environments else None
    return CreditConfig(
        baseline=workflow.baseline,
        std_scaling=workflow.std_scaling,
        remove_constant_groups=workflow.remove_constant_reward_groups,
        subagent_reward=agents.child_reward if agents else "root",
        mix_alpha=agents.child_reward_mix if agents else 0.5,
        depth_weighting=workflow.depth_weighting,
        gamma=workflow.depth_discount,
        normalization=train.loss_normalization,
        credit=workflow.credit,
        turn_discount=workflow.turn_discount,
    )


async def train(
    config: Config,
    *,
    run_dir: Path,
    resume: bool = False,
    console: bool = True,
    sampler_factory: Any = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Train as `config` says, writing into `run_dir`; returns the last step's metrics.

    `sampler_factory` replaces the training service's sampler for rollouts (a scripted policy
    in tests and demos). With `nats:` in the config the trainer plays no rollouts: workers
    (`platoon worker`) do, see `platoon.train.distributed`."""
    from platoon.programs import EpisodeRunner
    from platoon.stats.metrics import MetricsSink
    from platoon.stats.progress import TrainProgress

    train_cfg = config.train
    if train_cfg is None:
        raise ValueError("the config has no train: section")
    if sampler_factory is None:
        system.check_training_service(config)
    if train_cfg.model_name == TINY_MODEL:
        config = _replace_model(config, system.resolve_model(TINY_MODEL, seed=train_cfg.seed))
        train_cfg = config.train
        assert train_cfg is not None
    specs = resolved_specs(config)
    several = config.policies is not None
    trained = [name for name, spec in specs.items() if not spec.frozen]
    for name in trained:
        if specs[name].model_path:
            raise ValueError(
                f"policies.{name}.model_path: a policy that trains starts from its base model "
                "(model_path is what a frozen policy, or an evaluation, samples)"
            )
    run_store = CheckpointStore(run_dir)
    stores = policy_stores(run_dir, trained, several=several)
    identity = run_identity(config)
    if resume:
        run_store.check_identity(identity)
        candidates = resume_points(stores)
        if not any(candidates.values()):
            log.info("no checkpoint yet: the run starts from step 0", run_dir=str(run_dir))
    else:
        candidates = {name: [] for name in trained}
        if any(store.path.exists() for store in stores.values()):
            raise ResumeError(
                f"{run_dir} already holds a training run; pass --resume {run_dir} to continue it"
            )
        run_store.write_identity(identity)
    total_steps = train_cfg.max_training_steps
    workflow = train_cfg.workflow_config

    renderers = {}
    for name, spec in specs.items():
        tokenizer = system.load_tokenizer(spec.train.tokenizer or spec.train.model_name)
        renderers[name] = system.make_renderer(
            spec.train.renderer_name, tokenizer, spec.train.tool_call_parser
        )
    renderer, parser = renderers[next(iter(specs))]
    last: dict[str, Any] = {}

    async with policy_services(specs, run_dir) as services:
        trainers: dict[str, Trainer] = {}
        checkpoints: dict[str, Any] = {}
        for name in trained:
            spec, service = specs[name], services[name]
            client, checkpoints[name] = await _resumed_client(
                service.client, spec, stores[name], candidates[name]
            )
            version = checkpoints[name].policy_version if checkpoints[name] else 0
            reference = await _reference(service.client, spec) if spec.train.kl is not None else None
            trainers[name] = Trainer(
                client,
                _settings(spec, service.base_url),
                stores[name],
                version=version,
                reference=reference,
                policy=name,
                prefix=f"{name}/" if several else "",
            )
        resumed = [c for c in checkpoints.values() if c is not None]
        start_step = resumed[0].step + 1 if resumed else 0
        if resume:
            _forget_metrics_from(run_dir, start_step)
        # Only now that the run could start: a failed resume leaves the run's files as they were.
        lock = {
            "renderer": train_cfg.renderer_name,
            "tool_call_parser": parser,
            "resumed_from_step": start_step,
        }
        if several:
            lock["policies"] = {
                name: {"renderer": spec.train.renderer_name, "tool_call_parser": renderers[name][1]}
                for name, spec in specs.items()
            }
        write_run_files(run_dir, config, lock)
        first = next(iter(trainers.values()))
        if config.nats is not None:
            from platoon.bus.events import PolicyUpdated
            from platoon.train.distributed import trainer_components

            checkpoint = checkpoints[first.policy]
            policy = PolicyUpdated(
                version=first.version,
                sampler_path=checkpoint.sampler_path if checkpoint else "",
                base_model=train_cfg.model_name,
                base_url=services[first.policy].base_url,
            )
            rollouts = trainer_components(config, policy)
        else:
            factories = {
                name: sampler_factory
                or TinkerSamplerFactory(
                    services[name].client,
                    spec.train.model_name,
                    model_path=checkpoints[name].sampler_path if checkpoints.get(name) else spec.model_path,
                    version=trainers[name].version if name in trainers else 0,
                )
                for name, spec in specs.items()
            }
            default = next(iter(specs))
            rollouts = [
                system.gateway_for(
                    config,
                    renderer,
                    factories[default],
                    model_name=specs[default].train.model_name,
                    policy=default,
                    policies={
                        name: GatewayPolicy(
                            renderers[name][0],
                            factories[name],
                            frozen=spec.frozen,
                            model_name=spec.train.model_name,
                        )
                        for name, spec in specs.items()
                        if name != default
                    },
                ),
                EpisodeRunner(system.entry_settings(config), seed=train_cfg.seed),
                system.grader(
                    config,
                    tinker_base_url=services[default].base_url,
                    model_name=specs[default].train.model_name,
                ),
            ]
        components = [
            EventLog(run_dir),
            *system.env_services(config),
            *rollouts,
            CreditAssigner(
                group_size=workflow.group_size,
                batch_size=train_cfg.batch_size,
                credit=_credit(config),
                straggler_timeout=workflow.straggler_timeout_seconds,
                straggler_quorum=workflow.straggler_quorum,
                sealed=config.nats is not None,
                policies=tuple(trained),
            ),
            *trainers.values(),
            *([StepJoin(trained)] if several else []),
            *([TrainProgress(total_steps, start_step=start_step)] if progress else []),
            MetricsSink(
                run_dir,
                wandb=config.stats.wandb,
                experiment=config.stats.experiment_name,
                trial=run_dir.name,
                console=console and not progress,  # the live display prints the step lines
                total_steps=total_steps,
            ),
            *system.plugin_components(config),
        ]
        async with Bus() as bus, system.running(bus, components):
            names = system.entry_names(config)
            train_tasks = {
                n: await list_tasks(bus, n, e.splits.train)
                for n, e in zip(names, config.environments, strict=True)
            }
            order = TaskOrder(
                train_tasks,
                {n: e.weight for n, e in zip(names, config.environments, strict=True)},
                train_cfg.batch_size,
                train_cfg.seed,
            )
            steps = (
                total_steps
                if total_steps is not None
                else -(-sum(map(len, order.tasks.values())) // train_cfg.batch_size)
            )
            eval_tasks = await _eval_tasks_or_none(bus, config) if config.eval else []
            for component in rollouts:
                if hasattr(component, "wait_for_workers"):  # NATS: say once that it waits for a worker
                    await component.wait_for_workers()
            last = await _schedule(
                bus, config, order, eval_tasks, list(trainers.values()), start_step, steps, run_dir
            )
            await bus.publish(RunFinished(status="completed"))
    return last


class RunStopped(RuntimeError):
    """A training run ended by an error it could not go on past; the message says how to resume."""


def how_to_resume(args: Any, directory: Path) -> str:
    """Where a stopped run stands and the command that goes on with it (secrets left out)."""
    import shlex

    from platoon.config.redact import redact_text

    try:
        stores = [CheckpointStore(d) for d in sorted((directory / "checkpoints").glob("*")) if d.is_dir()]
        found = [store.latest() for store in stores or [CheckpointStore(directory)]]
        # several policies: a resume starts from the newest step all of them saved
        latest = None if None in found else min(found, key=lambda c: c.step)  # type: ignore[union-attr]
    except ResumeError:
        latest = None
    command = " ".join(
        [
            "platoon train",
            shlex.quote(str(args.config)),
            *(shlex.quote(o) for o in getattr(args, "overrides", None) or ()),
            "--resume",
            shlex.quote(str(directory)),
        ]
    )
    where = (
        f"its last checkpoint is after step {latest.step + 1}, so a resume trains from step {latest.step + 2}"
        if latest
        else "it has no checkpoint yet, so a resume starts it again from step 1"
    )
    return f"the run stopped; {where}: {redact_text(command)}"


class NothingGraded(RuntimeError):
    """The first step graded none of its episodes: training on would learn nothing."""


def _check_graded(metrics: dict[str, Any]) -> None:
    if metrics.get("episodes/graded", 0) or not metrics.get("episodes/total", 0):
        return
    failed = {
        k.removeprefix("episodes/failed/"): int(v)
        for k, v in metrics.items()
        if k.startswith("episodes/failed/")
    }
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(failed.items())) or "no reason recorded"
    raise NothingGraded(
        f"no episode of the first step was graded ({why}), so there is nothing to learn from; "
        "an ORS environment grades an episode by the reward of the tool result that finished it "
        "(give that result a reward), or by the sum of its rewards (platoon_reward = 'sum' on the "
        "class, or service_kwargs: {reward: sum}); `platoon events RUN_DIR --type EpisodeGraded` "
        "shows each episode's reason"
    )


async def _schedule(
    bus: Bus,
    config: Config,
    order: TaskOrder,
    eval_tasks: Sequence[TaskRef],
    trainers: Sequence[Trainer],
    start_step: int,
    steps: int,
    run_dir: Path,
) -> dict[str, Any]:
    """The loop of the module docstring. Several trained policies each have a version; a
    step's episodes ask each policy for its own (`policy_versions`)."""

    def version() -> int:
        return min(t.version for t in trainers)

    def versions() -> dict[str, int]:
        return {t.policy: t.version for t in trainers} if config.policies else {}

    train_cfg = config.train
    assert train_cfg is not None
    group_size = train_cfg.workflow_config.group_size
    eval_cfg = config.eval
    trained = start_step  # steps whose TrainStepFinished we have seen
    last: dict[str, Any] = {}

    async def run_eval(step: int) -> None:
        if not eval_tasks:
            return
        workflow = workflow_for(config, None, eval=True)
        report = await evaluate(
            bus,
            eval_tasks,
            group_size=workflow.group_size,
            concurrency=eval_cfg.concurrency if eval_cfg else 16,
            step=step,
            policy_version=version(),
        )
        (run_dir / "evals").mkdir(exist_ok=True)
        (run_dir / "evals" / f"step-{step:06d}.json").write_bytes(as_json(report))

    async with (
        bus.stream(TrainStepFinished, name="scheduler") as finished,
        anyio.create_task_group() as evals,
    ):
        if eval_cfg and eval_cfg.at_start and start_step == 0:
            await run_eval(0)

        async def wait_for_step() -> None:
            nonlocal trained, last
            event = await finished.receive()
            trained = event.step + 1
            last = event.metrics
            if event.step == start_step:
                _check_graded(event.metrics)
            if eval_cfg and eval_cfg.every and trained % eval_cfg.every == 0:
                evals.start_soon(run_eval, trained)

        for step in range(start_step, steps):
            while trained < step - train_cfg.max_staleness:
                await wait_for_step()
            for task in order.for_step(step):
                group_id = new_id()
                for _ in range(group_size):
                    await bus.publish(
                        EpisodeRequested(
                            episode_id=new_id(),
                            group_id=group_id,
                            task=task,
                            purpose="train",
                            step=step,
                            policy_version=version(),
                            policy_versions=versions(),
                        )
                    )
        while trained < steps:
            await wait_for_step()
    return last


async def _eval_tasks_or_none(bus: Bus, config: Config) -> list[TaskRef]:
    try:
        return await eval_tasks(bus, config)
    except ValueError as exc:
        log.warning("no eval tasks", error=str(exc))
        return []


async def _resumed_client(
    service: Any, config: Config | PolicySpec, store: CheckpointStore, candidates: list[Any]
) -> tuple[Any, Any]:
    """The training client, from the newest checkpoint whose files load (older ones next)."""
    failures = []
    for checkpoint in candidates:
        try:
            client = await _training_client(service, config, checkpoint)
        except Exception as exc:
            log.warning(
                "checkpoint did not load; trying the one before", step=checkpoint.step, error=str(exc)
            )
            failures.append(f"step {checkpoint.step}: {exc}")
            continue
        if failures:
            store.keep_through(checkpoint)
        log.info("resuming", from_step=checkpoint.step, state=checkpoint.state_path)
        return client, checkpoint
    if failures:
        raise ResumeError("no checkpoint of this run loads: " + "; ".join(failures))
    return await _training_client(service, config, None), None


def _forget_metrics_from(run_dir: Path, step: int) -> None:
    """Drop metrics of steps a resume trains again, so each step is in metrics.jsonl once."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a crash
        if not isinstance(record, dict) or record.get("step", -1) < step:
            kept.append(line)
    path.write_text("".join(line + "\n" for line in kept))


async def _reference(service: Any, config: Config | PolicySpec) -> Any:
    """The sampling client of the KL reference: `train.kl.reference_path`, else the base model."""
    from platoon.policy.tinker import sampling_client

    assert config.train is not None and config.train.kl is not None
    path = config.train.kl.reference_path
    return await (
        sampling_client(service, model_path=path)
        if path
        else sampling_client(service, base_model=config.train.model_name)
    )


async def _training_client(service: Any, config: Config | PolicySpec, checkpoint: Any) -> Any:
    train_cfg = config.train
    assert train_cfg is not None
    # `checkpoint.load_path` is the one policy's starting point (several policies start afresh)
    load_path = config.checkpoint.load_path if isinstance(config, Config) else None

    def create() -> Any:
        if checkpoint is not None:
            return service.create_training_client_from_state_with_optimizer(checkpoint.state_path).result()
        if load_path:
            return service.create_training_client_from_state(load_path).result()
        return service.create_lora_training_client(
            base_model=train_cfg.model_name, rank=train_cfg.lora_rank, seed=train_cfg.seed
        ).result()

    return await anyio.to_thread.run_sync(create)


def _replace_model(config: Config, model: str) -> Config:
    import msgspec

    assert config.train is not None
    return msgspec.structs.replace(config, train=msgspec.structs.replace(config.train, model_name=model))


# What a training run leaves (a rollout or an eval of the same config shares the directory).
_RUN_FILES = ("identity.json", "metrics.jsonl", "checkpoints.jsonl")


def _holds_run(directory: Path) -> bool:
    return any((directory / name).exists() for name in _RUN_FILES)


def _claimed(config: Config, directory: Path, *, new_trial: bool, overwrite: bool) -> tuple[Config, Path]:
    """The config and directory a new run writes to, when its directory may hold a run already:
    refused with the three ways on, or a numbered new trial beside it, or the old run deleted."""
    if not _holds_run(directory):
        return config, directory
    n = 2
    while _holds_run(directory.with_name(f"{directory.name}-{n}")):
        n += 1
    beside = directory.with_name(f"{directory.name}-{n}")
    if new_trial:
        stats = msgspec.structs.replace(config.stats, trial_name=beside.name)
        return msgspec.structs.replace(config, stats=stats), beside
    if overwrite:
        import shutil

        shutil.rmtree(directory)
        return config, directory
    from platoon.cli import CommandError

    raise CommandError(
        f"{directory} already holds a run: pass --resume {directory} to continue it, --new-trial to "
        f"train as {beside.name} beside it, or --overwrite to delete it and start over"
    )


def train_command(args: Any) -> int:
    """`platoon train CONFIG [KEY=VALUE ...] [--resume RUN_DIR]`."""
    path = Path(args.config)
    config = load_config(path, args.overrides)
    system.import_packages(config, path.resolve().parent)
    system.check_training_service(config)
    if getattr(args, "resume", None):
        directory = Path(args.resume)
    else:
        directory = run_dir(config, load_site())
        config, directory = _claimed(
            config,
            directory,
            new_trial=getattr(args, "new_trial", False),
            overwrite=getattr(args, "overwrite", False),
        )
    started = time.monotonic()
    live = sys.stderr.isatty() and not getattr(args, "quiet", False)
    resume = bool(getattr(args, "resume", None))
    from platoon.cli.run import run_async

    try:
        run_async(lambda: train(config, run_dir=directory, resume=resume, progress=live))
    except KeyboardInterrupt:
        if (directory / "identity.json").exists():
            print(f"platoon: {how_to_resume(args, directory)}", file=sys.stderr)
        raise
    except (ResumeError, NothingGraded):
        raise  # their messages say what to do
    except Exception as exc:
        if not (directory / "identity.json").exists():
            raise  # it failed before the run was set up: there is nothing to resume
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]  # type: ignore[assignment]
        why = str(exc) or type(exc).__name__
        raise RunStopped(f"{why}\n{how_to_resume(args, directory)}") from exc
    from platoon.stats.summary import train_summary

    print(train_summary(directory, time.monotonic() - started))
    return 0


async def run(
    config: Config | str | Path,
    *overrides: str,
    run_dir_path: str | Path | None = None,
    policy: str | None = None,
) -> Any:
    """Run what a config describes from your own async application: train (with its evals)
    when it has `train:`, else evaluate (`policy="scripted:MODULE:ATTR"` evaluates a scripted
    policy). Returns the last step's metrics, or the eval report."""
    if not isinstance(config, Config):
        path = anyio.Path(config)
        config = load_config(Path(config), overrides)
        system.import_packages(config, Path(await path.resolve()).parent)
    directory = Path(run_dir_path) if run_dir_path else run_dir(config, load_site())
    if config.train is not None:
        if policy is not None:
            raise ValueError(
                "policy= plays a scripted policy in an evaluation; this config trains (it has "
                "train:), and training samples the policy it trains"
            )
        return await train(config, run_dir=directory)
    return await evaluate_config(config, directory, policy=policy)

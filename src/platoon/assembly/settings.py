"""The config, resolved once: one settings object per component (`Settings`), read from the
whole `Config` here and nowhere below. Also the names of the config's entries and the packages
they import (so their harnesses register).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, TypedDict

import msgspec
import structlog

from platoon.assembly.nats import NatsSettings, nats_settings
from platoon.config import AssemblyError, Config, entry_names, load_site
from platoon.config.policies import DEFAULT_POLICY, resolve_policies
from platoon.config.schema import (
    EnvironmentConfig,
    PolicyChoice,
    SftConfig,
    TrainConfig,
    policy_names,
    workflow_for,
)
from platoon.credit import CreditConfig
from platoon.gateway import GatewaySettings
from platoon.models import loading
from platoon.policy.tinker import tinker_endpoint
from platoon.programs import EntrySettings
from platoon.stats.metrics import HealthLimits, MetricsSettings
from platoon.train.batcher import CreditSettings
from platoon.train.evaluate import EvalSettings
from platoon.train.loop import SchedulerSettings
from platoon.train.trainer import TrainerSettings

log = structlog.get_logger("platoon.assembly")

PURPOSES: tuple[str, ...] = ("train", "eval", "rollout", "worker", "gateway", "sft")
Purpose = Literal["train", "eval", "rollout", "worker", "gateway", "sft"]
TRAINING: tuple[str, ...] = ("train", "sft")  # the purposes whose policies train


@dataclass(frozen=True)
class PolicySettings:
    """One policy: the model it samples and trains, and the service it runs on."""

    name: str = "default"
    model_name: str | None = None  # a built-in model is named by its directory in the cache
    tokenizer: str | None = None  # None: the model's
    renderer_name: str = "qwen3_instruct"
    tool_call_parser: str = "auto"
    backend: str = "tinker"  # "local": the embedded Tinker-compatible server
    base_url: str | None = None  # `tinker_base_url`; else $TINKER_BASE_URL, else hosted Tinker
    seed: int = 0
    reproducible: bool = False  # the embedded server samples each sequence apart from its batch
    lora_rank: int = 32
    load_path: str | None = None  # a training state to start from (`checkpoint.load_path`)
    model_path: str | None = None  # sampler weights to evaluate (`eval.model_path`)
    scripted: str | None = None  # scripted:MODULE:ATTR plays instead of the model
    kl_reference: str | None = None  # `train.kl.reference_path`
    kl_policy: str | None = None  # `kl.reference_policy`: a frozen policy of the run is the reference
    kl: bool = False
    distill: bool = False  # a teacher scores what the policy samples (`distill:`)
    teacher_path: str | None = None  # `distill.teacher_path`; None (and no teacher policy): the base model
    teacher_policy: str | None = None  # `distill.teacher`: a frozen policy of the run teaches
    trainer: TrainerSettings | None = None  # None: the policy does not train here
    builtin: str | None = None  # the built-in model `model_name` is the directory of
    frozen: bool = False  # one of several policies that samples and never trains
    # where a finished run's weights (`model_path` on the embedded backend) are looked for
    runs: tuple[str, ...] = ()
    # "<name>/" where the config names its policies (`policies:`): its metrics and checkpoints
    # are kept under its name; "" for the one policy of a config without `policies:`
    prefix: str = ""

    def local_model(self) -> str:
        """The model as the embedded server loads it (a built-in one built on first use)."""
        return loading.resolve_model(self.model_name or "")


@dataclass(frozen=True)
class RunnerSettings:
    entries: list[EntrySettings]
    max_concurrent: int = 256
    seed: int = 0


@dataclass(frozen=True)
class SftSettings:
    """`platoon sft`'s: where the recorded episodes are, which to keep, and how to train on them
    (`sft:` in the config)."""

    sources: tuple[str, ...]  # run directories (their event logs) or conversation JSONL files
    where: tuple[str, ...] = ()  # --where filters, all of which an episode must pass
    agent: str | None = None  # --agent: only the agents of this role or harness train
    epochs: int = 1
    batch_size: int = 16
    heldout: float = 0.0
    seed: int = 0
    save_every: int = 0  # 0: at the end of each epoch
    # entry name -> how its agents choose their policy (`agents.policy`), for runs of several
    choices: dict[str, PolicyChoice] = field(default_factory=dict)


@dataclass(frozen=True)
class EnvServiceSettings:
    """One environment entry's env service: its name, the service and env it names, and the
    options its backend gets (a Harbor entry's `artifacts_dir` in the run's folder)."""

    name: str
    service: str | None
    env: str | None
    options: dict[str, object]


@dataclass(frozen=True)
class GraderSettings:
    """The grader's: each entry's reward processor, and what its reward rules and judges are
    made of (the entries' `reward:` and `judge:`, and the run's service, model and renderer,
    which a `tinker` judge that names none uses)."""

    entries: dict[str, EnvironmentConfig]
    reward_processors: dict[str, str]
    tinker_base_url: str | None = None
    model_name: str | None = None
    renderer_name: str | None = None


class ServedGateway(TypedDict, total=False):
    """What `platoon gateway serve` sets on a served gateway (the rest is the config's)."""

    host: str
    port: int
    model_name: str
    renderer_name: str


@dataclass(frozen=True)
class SftSources:
    """What `platoon sft` was asked to learn from: its `--from`, `--where` and `--agent`."""

    sources: tuple[str, ...] = ()
    where: tuple[str, ...] = ()
    agent: str | None = None


@dataclass(frozen=True)
class RunOptions:
    """What a command asks of a run besides its config: its command line's choices."""

    policy: str | None = None  # scripted:MODULE:ATTR plays instead of the model
    split: str | None = None  # an evaluation's split
    progress: Callable[[int, int], None] | None = None  # an evaluation's progress
    resume: bool = False  # a training run continues the one in its folder
    console: bool = True  # a training run's step lines
    live: bool = False  # a training run's live display
    nats_url: str | None = None  # a distributed run's NATS server, over `nats.url`
    worker_name: str | None = None  # a worker's name (None: host:pid)
    drain_timeout: float | None = None  # a worker's, over `nats.drain_timeout`
    gateway: ServedGateway | None = None  # a served gateway's host, port and names
    events_dir: str | Path | None = None  # where a served gateway writes its event log
    sft: SftSources | None = None  # an SFT run's recorded episodes, filters and agent


@dataclass(frozen=True)
class Settings:
    """Everything a run's components need, resolved from one config."""

    purpose: str
    run_dir: Path | None
    policies: dict[
        str, PolicySettings
    ]  # every policy of the run by name, never none; the first is the run's own
    gateway: GatewaySettings
    runner: RunnerSettings | None
    record: Config  # the resolved config, as the run writes it into its folder (no part reads it)
    envs: tuple[EnvServiceSettings, ...] = ()
    grader: GraderSettings | None = None
    identity: dict[str, object] | None = None  # what a resumed run must share with the one it resumes
    credit: CreditSettings | None = None
    scheduler: SchedulerSettings | None = None
    eval: EvalSettings | None = None
    metrics: MetricsSettings | None = None
    nats: NatsSettings | None = None
    sft: SftSettings | None = None
    resume: bool = False
    event_log: bool = True

    @property
    def policy(self) -> PolicySettings:
        """The run's own policy: the first (the one, "default", of a config without `policies:`)."""
        return next(iter(self.policies.values()))

    def trained(self) -> list[str]:
        return [name for name, p in self.policies.items() if p.trainer is not None]


def import_packages(config: Config, config_dir: Path | None = None) -> None:
    """Import each entry's `package`, so the harnesses it defines register themselves."""
    import sys

    if config_dir is not None and str(config_dir) not in sys.path:
        sys.path.insert(0, str(config_dir))
    for entry in config.environments:
        if entry.package:
            try:
                importlib.import_module(entry.package)
            except ImportError as exc:
                raise AssemblyError(f"cannot import package {entry.package!r}: {exc}") from exc


def credit_settings(config: Config) -> CreditConfig:
    """The credit assigner's advantages settings, from `train.workflow_config` and the agents."""
    train = config.train
    assert train is not None
    workflow = train.workflow_config
    agents = config.environments[0].agents if config.environments else None
    return CreditConfig(
        baseline=workflow.baseline,
        std_scaling=workflow.std_scaling,
        # a group whose rewards tie still has its teacher's signal: distillation keeps it
        remove_constant_groups=workflow.remove_constant_reward_groups and not _distills(config),
        subagent_reward=agents.child_reward if agents else "root",
        mix_alpha=agents.child_reward_mix if agents else 0.5,
        depth_weighting=workflow.depth_weighting,
        gamma=workflow.depth_discount,
        normalization=train.loss_normalization,
        credit=workflow.credit,
        turn_discount=workflow.turn_discount,
    )


def _distills(config: Config) -> bool:
    """Whether a policy of the run learns from a teacher (`distill:`)."""
    return any(
        spec.train.distill is not None and not spec.frozen for spec in resolve_policies(config).values()
    )


def _trainer_settings(
    train: TrainConfig, keep: int | None, *, sft: SftConfig | None = None
) -> TrainerSettings:
    """The trainer's: the policy's `train:` whole. `keep`: `checkpoint.keep`. `sft`: an SFT
    run's, whose trainer trains recorded datums with the cross-entropy loss at its own learning
    rate, with no rollouts, no KL, teacher or correction (its schedule is set once the datums
    are read)."""
    if sft is None:
        return TrainerSettings(train=train, keep=keep)
    optimizer = msgspec.structs.replace(
        train.optimizer, learning_rate=sft.learning_rate or train.optimizer.learning_rate
    )
    recorded = msgspec.structs.replace(
        train,
        loss_fn="cross_entropy",
        loss_fn_config={},
        optimizer=optimizer,
        max_staleness=0,
        max_training_steps=None,
        correction=None,
        kl=None,
        distill=None,
    )
    return TrainerSettings(train=recorded, keep=keep, rollouts=False)


def entry_settings(config: Config, *, eval: bool = False) -> list[EntrySettings]:
    """The runner's view of each environment entry."""
    settings = []
    for i, (name, entry) in enumerate(zip(entry_names(config), config.environments, strict=True)):
        rollout = workflow_for(config, entry, eval=eval).rollout_config
        inference = rollout.inference_params
        params = {
            "temperature": inference.temperature,
            "top_p": inference.top_p,
            "top_k": inference.top_k,
            "max_tokens": inference.max_completion_tokens,
            "stop": inference.stop,
            "seed": inference.seed,
        }
        if entry.harness is None:
            raise AssemblyError(f"environments.{i}.harness: an entry needs a harness to play it")
        settings.append(
            EntrySettings(
                name=name,
                harness=entry.harness if isinstance(entry.harness, str) else dict(entry.harness),
                harness_options=dict(entry.harness_options),
                program=entry.program,
                program_options=dict(entry.program_options),
                max_steps=rollout.max_steps,
                max_tokens=rollout.max_tokens_per_episode,
                timeout=rollout.timeout,
                params={k: v for k, v in params.items() if v is not None},
                agents=entry.agents,
                path=f"environments.{i}",
                default_policy=policy_names(config)[0],
            )
        )
    return settings


def _policy_settings(
    config: Config, purpose: str, scripted: str | None, models: _BuiltinModels
) -> dict[str, PolicySettings]:
    """Each policy of the run by name: `train:`'s one, or each of `policies:` (RFC 0001) with its
    own keys laid over `train:`. Without `train:` (an evaluation) the one policy is `eval:`'s."""
    train, ev = config.train, config.eval
    runs = _run_roots(config)
    if train is None:
        name = ev.model_name if ev else None
        directory, builtin = models(name)
        return {
            DEFAULT_POLICY: PolicySettings(
                model_name=directory or name,
                builtin=builtin,
                runs=runs,
                renderer_name=(ev.renderer_name if ev else None) or "qwen3_instruct",
                base_url=config.tinker_base_url,
                model_path=ev.model_path if ev else None,
                scripted=scripted,
            )
        }
    out = {}
    for name, spec in resolve_policies(config).items():
        train = spec.train
        # A built-in model (the tiny one, a catalogue model) is named by its cache directory.
        directory, builtin = models(train.model_name)
        model = directory or train.model_name
        trains = purpose in TRAINING and not spec.frozen
        rl = trains and purpose == "train"  # a KL penalty is RL's; SFT has no advantages to fold it in
        if train.reproducible and train.backend != "local":
            raise AssemblyError(
                "train.reproducible: only the embedded backend (train.backend: local) samples each "
                "sequence on its own; a Tinker service batches as it likes (set train.reproducible=false)"
            )
        if trains and spec.model_path and config.policies:
            raise AssemblyError(
                f"policies.{name}.model_path: a policy that trains starts from its base model, or "
                "from a training state named by load_path (model_path is what a frozen policy, or an "
                "evaluation, samples)"
            )
        out[name] = PolicySettings(
            name=name,
            model_name=model,
            tokenizer=train.tokenizer,
            renderer_name=train.renderer_name,
            tool_call_parser=train.tool_call_parser,
            backend=train.backend,
            base_url=spec.tinker_base_url,
            seed=train.seed,
            reproducible=train.reproducible,
            lora_rank=train.lora_rank,
            load_path=spec.load_path if trains else None,
            model_path=spec.model_path,
            scripted=scripted,
            kl=rl and train.kl is not None,
            kl_reference=train.kl.reference_path if rl and train.kl else None,
            kl_policy=train.kl.reference_policy if rl and train.kl else None,
            distill=rl and train.distill is not None,
            teacher_path=train.distill.teacher_path if rl and train.distill else None,
            teacher_policy=train.distill.teacher if rl and train.distill else None,
            trainer=(
                _trainer_settings(
                    msgspec.structs.replace(train, model_name=model),
                    config.checkpoint.keep,
                    sft=(config.sft or SftConfig()) if purpose == "sft" else None,
                )
                if trains
                else None
            ),
            builtin=builtin,
            frozen=spec.frozen,
            runs=runs,
            prefix=f"{name}/" if config.policies else "",
        )
    return out


def _run_roots(config: Config) -> tuple[str, ...]:
    """Where runs are written on this machine: the config's `log_path`, then the site's runs."""

    roots = [config.log_path] if config.log_path else []
    return (*roots, str(Path(load_site().runs).expanduser()))


def _eval_settings(
    config: Config, purpose: str, split: str | None, progress: Callable[[int, int], None] | None
) -> EvalSettings:
    ev = config.eval
    chosen = split or (ev.split if ev and ev.split else None)
    names = entry_names(config)
    return EvalSettings(
        splits={n: chosen or e.splits.eval for n, e in zip(names, config.environments, strict=True)},
        max_tasks=ev.max_tasks if ev else None,
        group_size=workflow_for(config, None, eval=True).group_size,
        concurrency=ev.concurrency if ev else 16,
        report="evals/step-{step:06d}.json" if purpose == "train" else "eval.json",
        optional=purpose == "train",
        progress=progress,
        seed=config.train.seed if config.train else 0,
    )


def resolve(
    config: Config, purpose: str, options: RunOptions | None = None, *, run_dir: Path | None = None
) -> Settings:
    """Each component's settings, read from `config` once (with what the command asked for,
    `options`). Raises on what cannot be assembled."""
    options = options or RunOptions()
    _check_purpose(config, purpose)
    models = _BuiltinModels()
    config = _models_by_directory(config, purpose, models)
    policies = _policy_settings(config, purpose, options.policy, models)
    settings = Settings(
        purpose=purpose,
        run_dir=run_dir,
        policies=policies,
        gateway=_gateway_settings(config, purpose, policies),
        runner=_runner_settings(config, purpose),
        record=config,
        resume=options.resume,
    )
    if purpose == "gateway":
        return _served(settings, options.gateway or ServedGateway(), options.events_dir)
    if purpose != "sft":
        settings = replace(
            settings, envs=_env_settings(config, run_dir), grader=_grader_settings(config, policies)
        )
    if purpose == "eval":
        return replace(settings, eval=_eval_settings(config, purpose, options.split, options.progress))
    if purpose == "worker":
        return replace(settings, nats=_nats_settings(config, options))
    if purpose == "sft":
        return replace(
            settings,
            sft=_sft_settings(config, options.sft or SftSources()),
            metrics=_metrics_settings(config, run_dir, console=options.console, live=False),
            identity=run_identity(config),
        )
    if purpose != "train":
        return settings
    return _training(settings, config, options)


def _check_purpose(config: Config, purpose: str) -> None:
    """Raise at once where `config` cannot make a run of `purpose`."""
    if purpose not in PURPOSES:
        raise AssemblyError(f"no such purpose {purpose!r}: one of {', '.join(PURPOSES)}")
    if purpose in ("train", "worker", "sft") and config.train is None:
        raise AssemblyError(
            "a worker needs the trainer's config, with its train: section"
            if purpose == "worker"
            else "the config has no train: section (it names the policy that trains)"
        )
    if purpose in ("eval", "rollout", "train", "worker") and not config.environments:
        raise AssemblyError(
            "the config has no environments (one with sft: and none is for platoon sft alone)"
        )


def _models_by_directory(config: Config, purpose: str, models: _BuiltinModels) -> Config:
    """`config`, where a trainer (and its workers) name a built-in model by its directory, which
    is built (or pulled) when the run opens: what the run records and its identity name."""
    if purpose not in ("train", "worker", "sft") or config.train is None:
        return config
    directory, _ = models(config.train.model_name)
    if directory is None:
        return config
    return msgspec.structs.replace(config, train=msgspec.structs.replace(config.train, model_name=directory))


class _BuiltinModels:
    """A run's built-in model names, each worked out once (`loading.builtin_model`): the cache
    directory a name (or that directory) stands for, and the built-in model's name."""

    def __init__(self) -> None:
        self.known: dict[str | None, tuple[str | None, str | None]] = {}

    def __call__(self, name: str | None) -> tuple[str | None, str | None]:
        if name not in self.known:
            directory, builtin = self.known[name] = loading.builtin_model(name)
            if directory is not None:
                self.known[directory] = (directory, builtin)
        return self.known[name]


def _gateway_settings(config: Config, purpose: str, policies: dict[str, PolicySettings]) -> GatewaySettings:
    train, policy = config.train, next(iter(policies.values()))
    return GatewaySettings(
        context_window=train.context_window_length if train else None,
        max_concurrent_samples=config.gateway.max_concurrent_samples,
        host=config.gateway.host,
        port=config.gateway.port,
        model_name=policy.model_name
        if purpose in ("train", "worker") and policy.model_name
        else "platoon-policy",
        model_aliases=tuple(config.gateway.model_aliases),
        constraint_tries=config.gateway.constraint_tries,
    )


def _served(settings: Settings, served: ServedGateway, events_dir: str | Path | None) -> Settings:
    """A served gateway's settings (`platoon gateway serve`): its host, port and names as asked,
    and an event log where asked for."""
    g, renderer = settings.gateway, served.get("renderer_name")
    return replace(
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


def _runner_settings(config: Config, purpose: str) -> RunnerSettings | None:
    if purpose in ("gateway", "sft"):
        return None
    evaluating = purpose == "eval"
    return RunnerSettings(
        entries=entry_settings(config, eval=evaluating),
        max_concurrent=config.eval.concurrency if (evaluating and config.eval) else 256,
        seed=config.train.seed if config.train else 0,
    )


def _env_settings(config: Config, run_dir: Path | None) -> tuple[EnvServiceSettings, ...]:
    """One env service per environment entry. A Harbor entry's artifacts go to the run's folder
    (`<run dir>/artifacts/<entry>`) unless it names its own `artifacts_dir`."""
    services = []
    for name, entry in zip(entry_names(config), config.environments, strict=True):
        options = dict(entry.service_kwargs)
        if entry.service == "harbor" and run_dir is not None:
            options.setdefault("artifacts_dir", str(run_dir / "artifacts" / name))
        services.append(EnvServiceSettings(name, entry.service, entry.env, options))
    return tuple(services)


def _grader_settings(config: Config, policies: dict[str, PolicySettings]) -> GraderSettings:
    train, names = config.train, entry_names(config)
    return GraderSettings(
        entries=dict(zip(names, config.environments, strict=True)),
        reward_processors={
            n: e.reward_processor
            for n, e in zip(names, config.environments, strict=True)
            if e.reward_processor
        },
        tinker_base_url=config.tinker_base_url,
        model_name=next(iter(policies.values())).model_name or (train.model_name if train else None),
        renderer_name=train.renderer_name if train else None,
    )


def _nats_settings(config: Config, options: RunOptions) -> NatsSettings:
    return nats_settings(
        config, options.nats_url, worker=options.worker_name, drain_timeout=options.drain_timeout
    )


def _training(settings: Settings, config: Config, options: RunOptions) -> Settings:
    """A training run's settings: the credit assigner's, the scheduler's, the evaluator's, the
    metrics', the NATS bridges' (with `nats:`) and its identity."""
    train, ev, run_dir = config.train, config.eval, settings.run_dir
    assert train is not None
    workflow = train.workflow_config
    names = entry_names(config)
    return replace(
        settings,
        credit=CreditSettings(
            credit=credit_settings(config),
            group_size=workflow.group_size,
            batch_size=train.batch_size,
            straggler_timeout=workflow.straggler_timeout_seconds,
            straggler_quorum=workflow.straggler_quorum,
            min_group_share=workflow.min_group_share,
            sealed=config.nats is not None,
            policies=tuple(settings.trained()),
        ),
        scheduler=SchedulerSettings(
            splits={n: e.splits.train for n, e in zip(names, config.environments, strict=True)},
            weights={n: e.weight for n, e in zip(names, config.environments, strict=True)},
            batch_size=train.batch_size,
            group_size=workflow.group_size,
            seed=train.seed,
            total_steps=train.max_training_steps,
            max_staleness=train.max_staleness,
            eval_every=(ev.every or None) if ev else None,
            eval_at_start=bool(ev and ev.at_start),
            wait_for_workers=config.nats is not None,
            policies=tuple(settings.trained()),
        ),
        eval=_eval_settings(config, "train", None, None) if ev else None,
        metrics=_metrics_settings(config, run_dir, console=options.console, live=options.live),
        nats=_nats_settings(config, options) if config.nats is not None else None,
        identity=run_identity(config),
    )


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


def _metrics_settings(config: Config, run_dir: Path | None, *, console: bool, live: bool) -> MetricsSettings:
    return MetricsSettings(
        wandb=config.stats.wandb,
        experiment=config.stats.experiment_name,
        trial=run_dir.name if run_dir else "",
        console=console and not live,
        progress=live,
        total_steps=config.train.max_training_steps if config.train else None,
        limits=HealthLimits(config.stats.warn_mismatch_kl, config.stats.warn_clipped_fraction),
    )


def _sft_settings(config: Config, asked: SftSources) -> SftSettings:
    sft, train = config.sft or SftConfig(), config.train
    assert train is not None
    return SftSettings(
        sources=asked.sources,
        where=asked.where,
        agent=asked.agent,
        epochs=sft.epochs,
        batch_size=sft.batch_size,
        heldout=sft.heldout,
        seed=train.seed if sft.seed is None else sft.seed,
        save_every=sft.save_every,
        choices={
            name: entry.agents.policy
            for name, entry in zip(entry_names(config), config.environments, strict=True)
            if entry.agents.policy is not None
        },
    )


def check_services(policies: Iterable[PolicySettings]) -> None:
    """Raise at once, before any model or tokenizer loads, when a policy needs a Tinker service
    and none is named (the embedded backend needs none)."""
    for policy in policies:  # `policies:` may put each on a service of its own
        if policy.backend != "local":
            tinker_endpoint(policy.base_url)


def check_training_service(config: Config) -> None:
    """Raise at once, before any model or tokenizer loads, when a Tinker service is needed and
    none is named (the embedded backend needs none)."""
    if config.train is None:
        tinker_endpoint(config.tinker_base_url)
        return
    check_services(
        PolicySettings(backend=spec.train.backend, base_url=spec.tinker_base_url)
        for spec in resolve_policies(config).values()
    )

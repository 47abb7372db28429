"""Assembling a run: the one place where a config becomes components.

    run = assemble(config, "train", run_dir=...)   # the config resolved once; nothing starts
    run.parts                                       # what will run: each component's name and class
    async with run.running() as bus:                # services opened, components built and started
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

The config is read here and nowhere after: `resolve` turns it into one settings object per
component (`Settings`), and a component gets its own, never the `Config`. A policy (its model,
tokenizer, renderer, training service, training client and sampler factory) is opened by
`open_policy`, once per policy; the training service is opened there and only there.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import anyio
import msgspec
import structlog

from platoon import plugins, system
from platoon.bus.events import PolicyUpdated
from platoon.config import Config, write_run_files
from platoon.config.policies import DEFAULT_POLICY, resolve_policies
from platoon.config.schema import TrainConfig, policy_names, workflow_for
from platoon.credit import CreditConfig
from platoon.programs import EntrySettings
from platoon.system import SystemError
from platoon.train.evaluate import EvalSettings
from platoon.train.loop import SchedulerSettings
from platoon.train.trainer import TrainerSettings

__all__ = [
    "PURPOSES",
    "CreditSettings",
    "EvalSettings",
    "GatewaySettings",
    "MetricsSettings",
    "NatsSettings",
    "OpenPolicy",
    "Part",
    "PolicySettings",
    "Purpose",
    "Run",
    "RunnerSettings",
    "SchedulerSettings",
    "Settings",
    "assemble",
    "credit_settings",
    "entry_settings",
    "load_policy",
    "open_policy",
    "resolve",
    "trainer_components",
]

log = structlog.get_logger("platoon.assembly")

Purpose = Literal["train", "eval", "rollout", "worker", "gateway"]
PURPOSES: tuple[str, ...] = ("train", "eval", "rollout", "worker", "gateway")


# --- settings: the config, resolved once ----------------------------------------------------


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
    lora_rank: int = 32
    load_path: str | None = None  # a training state to start from (`checkpoint.load_path`)
    model_path: str | None = None  # sampler weights to evaluate (`eval.model_path`)
    scripted: str | None = None  # scripted:MODULE:ATTR plays instead of the model
    kl_reference: str | None = None  # `train.kl.reference_path`
    kl_policy: str | None = None  # `kl.reference_policy`: a frozen policy of the run is the reference
    kl: bool = False
    trainer: TrainerSettings | None = None  # None: the policy does not train here
    builtin: str | None = None  # the built-in model `model_name` is the directory of
    frozen: bool = False  # one of several policies that samples and never trains
    # where a finished run's weights (`model_path` on the embedded backend) are looked for
    runs: tuple[str, ...] = ()

    def local_model(self) -> str:
        """The model as the embedded server loads it (a built-in one built on first use)."""
        return system.resolve_model(self.model_name or "")


@dataclass(frozen=True)
class GatewaySettings:
    context_window: int | None = None
    max_concurrent_samples: int = 256
    host: str = "127.0.0.1"
    port: int = 0
    model_name: str = "platoon-policy"
    model_aliases: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunnerSettings:
    entries: list[EntrySettings]
    max_concurrent: int = 256
    seed: int = 0


@dataclass(frozen=True)
class CreditSettings:
    """The credit assigner's: how advantages are computed, and what makes a step's batch."""

    credit: CreditConfig
    group_size: int
    batch_size: int
    straggler_timeout: float | None = None
    straggler_quorum: float = 1.0
    sealed: bool = False  # results come from workers, each episode sealed
    policies: tuple[str, ...] = ("default",)  # the trained policies: one batch each per step


@dataclass(frozen=True)
class MetricsSettings:
    wandb: Any = None
    experiment: str = "platoon"
    trial: str = ""
    console: bool = True
    progress: bool = False  # the live display (it prints the step lines then)
    total_steps: int | None = None


@dataclass(frozen=True)
class NatsSettings:
    """The trainer's side of a distributed run (the bridges are made from the config's `nats:`)."""

    lease: float
    max_attempts: int
    announce_every: float
    identity: dict[str, str]


@dataclass(frozen=True)
class Settings:
    """Everything a run's components need, resolved from one config."""

    purpose: str
    run_dir: Path | None
    policy: PolicySettings
    gateway: GatewaySettings
    runner: RunnerSettings | None
    reward_processors: dict[str, str]
    credit: CreditSettings | None = None
    scheduler: SchedulerSettings | None = None
    eval: EvalSettings | None = None
    metrics: MetricsSettings | None = None
    nats: NatsSettings | None = None
    resume: bool = False
    event_log: bool = True
    # `policies:` (RFC 0001): every policy by name, `policy` first; empty: `policy` is the one
    policies: dict[str, PolicySettings] = field(default_factory=dict)

    def all_policies(self) -> dict[str, PolicySettings]:
        """Every policy of the run by name (the one policy, named "default", without `policies:`)."""
        return self.policies or {self.policy.name: self.policy}

    def trained(self) -> list[str]:
        return [name for name, p in self.all_policies().items() if p.trainer is not None]


def credit_settings(config: Config) -> CreditConfig:
    """The credit assigner's advantages settings, from `train.workflow_config` and the agents."""
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


def _trainer_settings(train: TrainConfig, keep: int | None) -> TrainerSettings:
    """The trainer's; the optimizer's settings are read here once (`train:`, or one policy's).
    `keep`: `checkpoint.keep`."""
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
        kl_coefficient=train.kl.coefficient if train.kl else 0.0,
        normalization=train.loss_normalization,
        keep=keep,
    )


def entry_settings(config: Config, *, eval: bool = False) -> list[EntrySettings]:
    """The runner's view of each environment entry."""
    settings = []
    for i, (name, entry) in enumerate(zip(system.entry_names(config), config.environments, strict=True)):
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
            raise SystemError(f"environments.{i}.harness: an entry needs a harness to play it")
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


def _policy_settings(config: Config, purpose: str, scripted: str | None) -> dict[str, PolicySettings]:
    """Each policy of the run by name: `train:`'s one, or each of `policies:` (RFC 0001) with its
    own keys laid over `train:`. Without `train:` (an evaluation) the one policy is `eval:`'s."""
    train, ev = config.train, config.eval
    runs = _run_roots(config)
    if train is None:
        name = ev.model_name if ev else None
        return {
            DEFAULT_POLICY: PolicySettings(
                model_name=system.builtin_model_dir(name) or name,
                builtin=system.builtin_model_name(name),
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
        builtin = system.builtin_model_dir(train.model_name)
        model = builtin or train.model_name
        trains = purpose == "train" and not spec.frozen
        if trains and spec.model_path and config.policies:
            raise SystemError(
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
            lora_rank=train.lora_rank,
            load_path=spec.load_path if trains else None,
            model_path=spec.model_path,
            scripted=scripted,
            kl=trains and train.kl is not None,
            kl_reference=train.kl.reference_path if trains and train.kl else None,
            kl_policy=train.kl.reference_policy if trains and train.kl else None,
            trainer=(
                _trainer_settings(msgspec.structs.replace(train, model_name=model), config.checkpoint.keep)
                if trains
                else None
            ),
            builtin=system.builtin_model_name(train.model_name),
            frozen=spec.frozen,
            runs=runs,
        )
    return out


def _run_roots(config: Config) -> tuple[str, ...]:
    """Where runs are written on this machine: the config's `log_path`, then the site's runs."""
    from platoon.config import load_site

    roots = [config.log_path] if config.log_path else []
    return (*roots, str(Path(load_site().runs).expanduser()))


def _eval_settings(config: Config, purpose: str, split: str | None, progress: Any) -> EvalSettings:
    ev = config.eval
    chosen = split or (ev.split if ev and ev.split else None)
    names = system.entry_names(config)
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
    config: Config,
    purpose: str,
    *,
    run_dir: Path | None = None,
    policy: str | None = None,
    split: str | None = None,
    progress: Any = None,
    resume: bool = False,
    console: bool = True,
    live: bool = False,
) -> Settings:
    """Each component's settings, read from `config` once. Raises on what cannot be assembled."""
    if purpose not in PURPOSES:
        raise SystemError(f"no such purpose {purpose!r}: one of {', '.join(PURPOSES)}")
    train = config.train
    if purpose in ("train", "worker") and train is None:
        raise SystemError(
            "the config has no train: section"
            if purpose == "train"
            else "a worker needs the trainer's config, with its train: section"
        )
    if purpose in ("eval", "rollout") and not config.environments:
        raise SystemError("the config has no environments")
    policies = _policy_settings(config, purpose, policy)
    pol = next(iter(policies.values()))
    several = policies if config.policies and train else {}
    gateway = GatewaySettings(
        context_window=train.context_window_length if train else None,
        max_concurrent_samples=config.gateway.max_concurrent_samples,
        host=config.gateway.host,
        port=config.gateway.port,
        model_name=pol.model_name if purpose in ("train", "worker") and pol.model_name else "platoon-policy",
        model_aliases=tuple(config.gateway.model_aliases),
    )
    names = system.entry_names(config)
    runner = None
    if purpose != "gateway":
        evaluating = purpose == "eval"
        runner = RunnerSettings(
            entries=entry_settings(config, eval=evaluating),
            max_concurrent=config.eval.concurrency if (evaluating and config.eval) else 256,
            seed=train.seed if train else 0,
        )
    settings = Settings(
        purpose=purpose,
        run_dir=run_dir,
        policy=pol,
        gateway=gateway,
        runner=runner,
        reward_processors={
            n: e.reward_processor
            for n, e in zip(names, config.environments, strict=True)
            if e.reward_processor
        },
        resume=resume,
        policies=several,
    )
    if purpose == "eval":
        settings = replace(settings, eval=_eval_settings(config, purpose, split, progress))
    if purpose != "train":
        return settings
    assert train is not None
    workflow = train.workflow_config
    ev = config.eval
    nats = None
    if config.nats is not None:
        from platoon.train.distributed import lease_timeout, worker_identity

        nats = NatsSettings(
            lease=lease_timeout(config),
            max_attempts=config.nats.max_attempts,
            announce_every=config.nats.announce_every,
            identity=worker_identity(config),
        )
    return replace(
        settings,
        credit=CreditSettings(
            credit=credit_settings(config),
            group_size=workflow.group_size,
            batch_size=train.batch_size,
            straggler_timeout=workflow.straggler_timeout_seconds,
            straggler_quorum=workflow.straggler_quorum,
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
            several=bool(several),
        ),
        eval=_eval_settings(config, purpose, None, None) if ev else None,
        metrics=MetricsSettings(
            wandb=config.stats.wandb,
            experiment=config.stats.experiment_name,
            trial=run_dir.name if run_dir else "",
            console=console and not live,
            progress=live,
            total_steps=train.max_training_steps,
        ),
        nats=nats,
    )


# --- the parts of a run ---------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """One component of a run, known before anything starts: its name and class, and the
    component itself where it is made up front (a plugin, whose declarations may be its own)."""

    name: str
    kind: type
    instance: Any = None

    @property
    def declares(self) -> Any:
        """What holds the component's declarations (`subscribes`, `publishes`)."""
        return self.instance if self.instance is not None else self.kind


def _parts(settings: Settings, config: Config, plugin_components: Sequence[Any]) -> list[Part]:
    from platoon.bus import EventLog
    from platoon.envs.service import EnvService
    from platoon.gateway import Gateway
    from platoon.programs import EpisodeRunner, Grader

    purpose = settings.purpose
    envs = [Part(f"env:{name}", EnvService) for name in system.entry_names(config)]
    plugs = [
        Part(f"plugin:{getattr(c, 'name', None) or type(c).__name__}", type(c), c) for c in plugin_components
    ]
    if purpose == "gateway":
        return [Part("gateway", Gateway), *([Part("event-log", EventLog)] if settings.event_log else [])]
    if purpose == "worker":
        from platoon.bus.nats import NatsBridge
        from platoon.train.distributed import FollowingRunner, PolicyFollower, ResultSeal

        return [
            *envs,
            Part("gateway", Gateway),
            Part("episode-runner", FollowingRunner),
            Part("grader", Grader),
            Part("result-seal", ResultSeal),
            Part("policy-follower", PolicyFollower),
            *plugs,
            Part("nats:results", NatsBridge),
            Part("nats:work", NatsBridge),
        ]
    rollouts = [Part("gateway", Gateway), Part("episode-runner", EpisodeRunner), Part("grader", Grader)]
    if purpose in ("eval", "rollout"):
        from platoon.train.evaluate import Evaluator

        evaluator = [Part("evaluator", Evaluator)] if purpose == "eval" else []
        return [Part("event-log", EventLog), *envs, *rollouts, *evaluator, *plugs]
    from platoon.stats.metrics import MetricsSink
    from platoon.stats.progress import TrainProgress
    from platoon.train.batcher import CreditAssigner
    from platoon.train.evaluate import Evaluator
    from platoon.train.loop import Scheduler
    from platoon.train.trainer import Trainer

    if settings.nats is not None:
        from platoon.bus.nats import NatsBridge
        from platoon.train.distributed import LeaseKeeper, PolicyAnnouncer, WorkerRegistry

        rollouts = [
            Part("nats", NatsBridge),
            Part("lease-keeper", LeaseKeeper),
            Part("policy-announcer", PolicyAnnouncer),
            Part("worker-registry", WorkerRegistry),
        ]
    assert settings.metrics is not None
    return [
        Part("event-log", EventLog),
        *envs,
        *rollouts,
        Part("credit-assigner", CreditAssigner),
        *_trainer_parts(settings, Trainer),
        Part("scheduler", Scheduler),
        *([Part("evaluator", Evaluator)] if settings.eval else []),
        *([Part("progress", TrainProgress)] if settings.metrics.progress else []),
        Part("metrics", MetricsSink),
        *plugs,
    ]


def _trainer_parts(settings: Settings, trainer: type) -> list[Part]:
    """One trainer per trained policy, and with several the step join (RFC 0001)."""
    if not settings.policies:
        return [Part("trainer", trainer)]
    from platoon.train.policies import StepJoin

    return [*(Part(f"trainer:{name}", trainer) for name in settings.trained()), Part("step-join", StepJoin)]


def assemble(
    config: Config,
    purpose: str,
    *,
    run_dir: str | Path | None = None,
    policy: str | None = None,
    split: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    resume: bool = False,
    console: bool = True,
    live: bool = False,
    sampler_factory: Any = None,
    nats_url: str | None = None,
    worker_name: str | None = None,
    drain_timeout: float | None = None,
    gateway: dict[str, Any] | None = None,
    events_dir: str | Path | None = None,
) -> Run:
    """The run `config` describes for `purpose`: its settings and parts, nothing started.

    `policy` (scripted:MODULE:ATTR) or `sampler_factory` (an object, in tests) replace the
    model's sampler; `split` and `progress` are the evaluator's; `resume`, `console` and `live`
    the training run's; `nats_url`, `worker_name` and `drain_timeout` a worker's; `gateway`
    (host, port, model_name, renderer_name) and `events_dir` a served gateway's."""
    directory = Path(run_dir) if run_dir is not None else None
    builtin = system.builtin_model_dir(config.train.model_name) if config.train is not None else None
    if purpose in ("train", "worker") and config.train is not None and builtin is not None:
        # A trainer (and its workers) name a built-in model by its directory, which is built
        # (or pulled) when the run opens.
        config = msgspec.structs.replace(
            config, train=msgspec.structs.replace(config.train, model_name=builtin)
        )
    settings = resolve(
        config,
        purpose,
        run_dir=directory,
        policy=policy,
        split=split,
        progress=progress,
        resume=resume,
        console=console,
        live=live,
    )
    if purpose == "gateway":
        overrides = dict(gateway or {})
        renderer = overrides.pop("renderer_name", None)
        settings = replace(
            settings,
            gateway=replace(settings.gateway, **overrides),
            policy=replace(settings.policy, renderer_name=renderer or settings.policy.renderer_name),
            event_log=events_dir is not None,
            run_dir=Path(events_dir) if events_dir is not None else None,
        )
    plugin_components = (
        []
        if purpose == "gateway"
        else [
            plugins.plugin_component(p.handler or p.component or "", event_names=p.events, options=p.options)
            for p in config.plugins
        ]
    )
    return Run(
        config,
        settings,
        _parts(settings, config, plugin_components),
        plugin_components,
        sampler_factory=sampler_factory,
        nats_url=nats_url,
        worker_name=worker_name,
        drain_timeout=drain_timeout,
    )


# --- a policy, opened -----------------------------------------------------------------------


@dataclass
class OpenPolicy:
    """A policy while its run is open: what the gateway and the trainer take from it."""

    settings: PolicySettings
    tokenizer: Any
    renderer: Any
    tool_call_parser: str | None
    sampler_factory: Any = None
    base_url: str | None = None  # the training service, as samplers and judges reach it
    trainer: Any = None  # the trainer component, when the policy trains here
    checkpoint: Any = None  # the checkpoint it resumed from
    start_path: str | None = None  # the sampler weights it trains from: its checkpoint's or load_path's


def load_policy(policy: PolicySettings) -> OpenPolicy:
    """A policy's tokenizer and renderer (a built-in model is built first); no service yet.

    The tool-call parser `auto` is chosen by a probe of the tokenizer, the same on a trainer and
    its workers (the identity handshake compares the choice)."""
    if policy.builtin:
        system.resolve_model(policy.builtin)
    if policy.trainer is not None:
        tokenizer = system.load_tokenizer(policy.tokenizer or policy.model_name or "")
    else:
        name = policy.tokenizer or policy.model_name
        tokenizer = system.tokenizer_named(name, scripted=bool(policy.scripted))
    renderer, chosen = system.make_renderer(policy.renderer_name, tokenizer, policy.tool_call_parser)
    return OpenPolicy(policy, tokenizer, renderer, chosen)


@contextlib.asynccontextmanager
async def _service(
    policy: PolicySettings, checkpoint_dir: Path | None
) -> AsyncIterator[tuple[Any, str | None]]:
    """The policy's Tinker service (a client, and the URL others reach it at): the embedded
    server (`train.backend: local`), a self-hosted one, or hosted Tinker. Opened once per run."""
    from platoon.policy.tinker import closing

    if policy.backend == "local":
        import tinker

        from platoon.backends.local import running_server_in_thread

        assert policy.model_name is not None
        options = {"checkpoint_dir": checkpoint_dir} if checkpoint_dir is not None else {}
        async with running_server_in_thread(policy.local_model(), **options) as base_url:
            async with closing(tinker.ServiceClient(base_url=base_url, api_key="tml-local")) as client:
                yield client, base_url
        return
    async with closing(system.tinker_service_client(policy.base_url)) as client:
        yield client, policy.base_url


@contextlib.asynccontextmanager
async def open_policy(
    loaded: OpenPolicy,
    *,
    run_dir: Path | None = None,
    store: Any = None,
    candidates: Sequence[Any] = (),
    sampler_factory: Any = None,
    service: tuple[Any, str | None] | None = None,
    prefix: str = "",
    reference: Any = None,
) -> AsyncIterator[OpenPolicy]:
    """Open a loaded policy for a run: its training service and, when it trains
    (`settings.trainer`), its training client (resumed from the newest checkpoint of
    `candidates` that loads) and trainer; and its sampler factory.

    Call it once per policy of a run: everything a policy owns is made here. `service`: one
    already open that the policy shares with others of the run (`open_policies`); `prefix`:
    the policy's name on its trainer's metrics, when the run has several; `reference`: the
    sampling client of its KL reference when another policy of the run is that (`open_policies`)."""
    from platoon.policy.tinker import TinkerSamplerFactory

    policy = loaded.settings
    if policy.scripted:
        loaded.sampler_factory = system.policy_from_ref(policy.scripted, loaded.tokenizer)
        yield loaded
        return
    checkpoint_dir = run_dir / "tinker" if policy.trainer is not None and run_dir is not None else None
    if service is None and policy.trainer is None and policy.backend == "local" and policy.model_path:
        # A finished run's weights: the embedded server opens on that run's checkpoints.
        checkpoint_dir, path = _finished_weights(policy)
        policy = loaded.settings = replace(policy, model_path=path)
    shared = contextlib.nullcontext(service) if service is not None else _service(policy, checkpoint_dir)
    async with shared as (service, base_url):
        loaded.base_url = base_url
        if policy.trainer is None:
            model = policy.local_model() if policy.backend == "local" else policy.model_name or ""
            loaded.sampler_factory = TinkerSamplerFactory(service, model, model_path=policy.model_path)
            yield loaded
            return
        from platoon.train.trainer import Trainer

        client, checkpoint = await _resumed_client(service, policy, store, list(candidates))
        version = checkpoint.policy_version if checkpoint else 0
        if policy.kl and reference is None:
            reference = await _reference(service, policy)
        settings = _with_base_url(policy.trainer, base_url)
        loaded.trainer = Trainer(
            client,
            settings,
            store,
            version=version,
            reference=reference,
            policy=policy.name,
            prefix=prefix,
            delete=_deleter(base_url, local=policy.backend == "local"),
        )
        loaded.checkpoint = checkpoint
        loaded.start_path = checkpoint.sampler_path if checkpoint else await _loaded_sampler(client, policy)
        loaded.sampler_factory = sampler_factory or TinkerSamplerFactory(
            service, policy.model_name or "", model_path=loaded.start_path, version=version
        )
        yield loaded


@contextlib.asynccontextmanager
async def open_policies(
    loaded: dict[str, OpenPolicy],
    *,
    run_dir: Path | None = None,
    stores: dict[str, Any] | None = None,
    candidates: dict[str, Sequence[Any]] | None = None,
    sampler_factory: Any = None,
) -> AsyncIterator[dict[str, OpenPolicy]]:
    """Open the several policies of a run (RFC 0001), each with `open_policy`. Policies that
    share a training service share one client: two policies on one base model of the embedded
    backend are two LoRA adapters on one server; each other service is opened once (the
    checkpoints of a second embedded server go to `run_dir/tinker-<policy>`). A trained policy
    whose KL reference is a frozen one (`kl.reference_policy`) scores against the weights that
    policy samples, on its service."""
    keys = {name: _service_key(p.settings) for name, p in loaded.items()}
    async with contextlib.AsyncExitStack() as stack:
        services: dict[tuple[str, str], tuple[Any, str | None]] = {}
        opened: dict[str, OpenPolicy] = {}
        for name, policy in loaded.items():
            key = keys[name]
            if key not in services and not policy.settings.scripted:
                trains = any(loaded[n].settings.trainer is not None for n in loaded if keys[n] == key)
                where = None
                if trains and run_dir is not None:
                    where = run_dir / ("tinker" if not services else f"tinker-{name}")
                services[key] = await stack.enter_async_context(_service(policy.settings, where))
        for name, policy in loaded.items():
            key, frozen = keys[name], policy.settings.kl_policy
            reference = None
            if frozen is not None and policy.settings.trainer is not None and keys[frozen] in services:
                reference = await _frozen_reference(services[keys[frozen]][0], loaded[frozen].settings)
            opened[name] = await stack.enter_async_context(
                open_policy(
                    policy,
                    run_dir=run_dir,
                    store=(stores or {}).get(name),
                    candidates=(candidates or {}).get(name, ()),
                    sampler_factory=sampler_factory,
                    service=services.get(key),
                    prefix=f"{name}/",
                    reference=reference,
                )
            )
        yield opened


def _finished_weights(policy: PolicySettings) -> tuple[Path, str]:
    """(checkpoint directory, tinker:// path) of the weights a policy on the embedded backend
    samples: a finished run's checkpoint, named by its tinker:// path, its directory or the run's."""
    from platoon.train.checkpoints import CheckpointNotFound, locate_weights

    assert policy.model_path is not None
    try:
        return locate_weights(policy.model_path, policy.runs)
    except CheckpointNotFound as exc:
        raise SystemError(f"model_path: {exc}") from None


def _service_key(policy: PolicySettings) -> tuple[str, str]:
    if policy.backend == "local":
        return ("local", policy.model_name or "")
    return ("tinker", policy.base_url or "")


def _deleter(base_url: str | None, *, local: bool) -> Any:
    """How a trainer deletes weights it no longer needs (old checkpoints, `checkpoint.keep`;
    step sampler weights nothing samples any more): the Tinker REST API's DELETE, on the
    policy's own service."""
    import tinker

    url, key = (base_url, None) if local else system._tinker_endpoint(base_url)
    rest: list[Any] = []  # made at the first delete: its connections stay open for the process

    async def delete(path: str) -> None:
        if not rest:
            rest.append(tinker.RestClient(base_url=url, api_key=key or "tml-local"))
        await rest[0].delete_checkpoint_from_tinker_path(path)

    return delete


def _with_base_url(settings: TrainerSettings, base_url: str | None) -> TrainerSettings:
    import copy

    out = copy.copy(settings)
    out.base_url = base_url
    return out


async def _resumed_client(
    service: Any, policy: PolicySettings, store: Any, candidates: list[Any]
) -> tuple[Any, Any]:
    """The training client, from the newest checkpoint whose files load (older ones next)."""
    from platoon.train.checkpoints import ResumeError

    failures = []
    for checkpoint in candidates:
        try:
            client = await _training_client(service, policy, checkpoint)
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
    return await _training_client(service, policy, None), None


async def _training_client(service: Any, policy: PolicySettings, checkpoint: Any) -> Any:
    def create() -> Any:
        if checkpoint is not None:
            return service.create_training_client_from_state_with_optimizer(checkpoint.state_path).result()
        if policy.load_path:
            return service.create_training_client_from_state(policy.load_path).result()
        return service.create_lora_training_client(
            base_model=policy.model_name, rank=policy.lora_rank, seed=policy.seed
        ).result()

    return await anyio.to_thread.run_sync(create)


async def _loaded_sampler(client: Any, policy: PolicySettings) -> str | None:
    """Sampler weights of a training client started from `load_path` (a training state is no
    sampler path), so that the first rollouts sample the weights that train; else None."""
    if not policy.load_path:
        return None
    from platoon.policy.tinker import wait_future

    saved = await wait_future(client.save_weights_for_sampler(name="loaded"))
    return saved.path


async def _reference(service: Any, policy: PolicySettings) -> Any:
    """The sampling client of the KL reference: `train.kl.reference_path`, else the base model."""
    from platoon.policy.tinker import sampling_client

    path = policy.kl_reference
    return await (
        sampling_client(service, model_path=path)
        if path
        else sampling_client(service, base_model=policy.model_name)
    )


async def _frozen_reference(service: Any, frozen: PolicySettings) -> Any:
    """The KL reference a trained policy names by `kl.reference_policy`: a sampling client on
    the weights the frozen policy samples (its `model_path`, else its base model)."""
    from platoon.policy.tinker import sampling_client

    if frozen.model_path:
        return await sampling_client(service, model_path=frozen.model_path)
    model = frozen.local_model() if frozen.backend == "local" else frozen.model_name
    return await sampling_client(service, base_model=model)


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


# --- the run --------------------------------------------------------------------------------


class Run:
    """A run of one purpose: its settings and parts; `running()` opens and starts it."""

    def __init__(
        self,
        config: Config,
        settings: Settings,
        parts: list[Part],
        plugin_components: list[Any],
        *,
        sampler_factory: Any = None,
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
        self.components: list[Any] | None = None  # once running, in the order of the parts

    def component(self, kind: type) -> Any:
        """The running component of class `kind` (the one there is)."""
        assert self.components is not None, "the run is not running"
        [found] = [c for c in self.components if isinstance(c, kind)]
        return found

    def declared(self) -> list[tuple[str, Any]]:
        """(name, class or instance) of every component, in the order they are attached:
        what `platoon graph` draws, known without opening anything."""
        return [(p.name, p.declares) for p in self.parts]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Any]:
        """Open the run's services, build its components and run them on a bus of their own;
        yields the bus. Leaving the block cancels the components and closes the services."""
        from platoon.bus import Bus

        if self.purpose == "worker":
            raise SystemError("a worker runs in stages: use Run.worker()")
        async with self._opened() as components:
            self.components = components
            async with Bus() as bus, system.running(bus, components):
                yield bus

    @contextlib.asynccontextmanager
    async def _opened(self) -> AsyncIterator[list[Any]]:
        s = self.settings
        if s.purpose == "train":
            async with self._opened_training() as components:
                yield components
            return
        if s.policies:  # several policies: the gateway serves every one of them
            loaded_all = {name: load_policy(p) for name, p in s.policies.items()}
            if s.purpose in ("eval", "rollout"):
                assert s.run_dir is not None
                write_run_files(
                    s.run_dir, self.config, {**_policy_lock(loaded_all), "policy": s.policy.scripted}
                )
            async with open_policies(loaded_all) as opened:
                yield self._build(next(iter(opened.values())), several=opened)
            return
        loaded = load_policy(s.policy)
        if s.purpose in ("eval", "rollout"):
            assert s.run_dir is not None
            lock = {"renderer": s.policy.renderer_name, "tool_call_parser": loaded.tool_call_parser}
            write_run_files(s.run_dir, self.config, {**lock, "policy": s.policy.scripted})
        async with open_policy(loaded) as policy:
            yield self._build(policy)

    @contextlib.asynccontextmanager
    async def _opened_training(self) -> AsyncIterator[list[Any]]:
        from platoon.train.checkpoints import CheckpointStore, ResumeError, run_identity

        s = self.settings
        run_dir = s.run_dir
        assert run_dir is not None
        if self._sampler_factory is None:
            system.check_training_service(self.config)
        if s.policy.builtin:
            system.resolve_model(s.policy.builtin)  # built here on first use
        if s.policies:
            async with self._opened_policies_training() as assembled:
                yield assembled
            return
        store = CheckpointStore(run_dir)
        identity = run_identity(self.config)
        candidates = store.candidates() if s.resume else []
        if s.resume:
            store.check_identity(identity)
            if not candidates:
                log.info("no checkpoint yet: the run starts from step 0", run_dir=str(run_dir))
        else:
            if store.path.exists():
                raise ResumeError(
                    f"{run_dir} already holds a training run; pass --resume {run_dir} to continue it"
                )
            store.write_identity(identity)
        loaded = load_policy(s.policy)
        async with open_policy(
            loaded, run_dir=run_dir, store=store, candidates=candidates, sampler_factory=self._sampler_factory
        ) as policy:
            checkpoint = policy.checkpoint
            start_step = checkpoint.step + 1 if checkpoint else 0
            if s.resume:
                _forget_metrics_from(run_dir, start_step)
            # Only now that the run could start: a failed resume leaves the run's files as they were.
            lock = {
                "renderer": s.policy.renderer_name,
                "tool_call_parser": policy.tool_call_parser,
                "resumed_from_step": start_step,
            }
            write_run_files(run_dir, self.config, lock)
            yield self._build(policy, start_step=start_step)

    @contextlib.asynccontextmanager
    async def _opened_policies_training(self) -> AsyncIterator[list[Any]]:
        """`_opened_training` for several policies (RFC 0001): a checkpoint store, a resume
        point, a training client and a trainer per trained policy."""
        from platoon.train.checkpoints import CheckpointStore, ResumeError, run_identity
        from platoon.train.policies import policy_stores, resume_points

        s = self.settings
        run_dir = s.run_dir
        assert run_dir is not None
        trained = s.trained()
        run_store = CheckpointStore(run_dir)  # the run's identity.json
        stores = policy_stores(run_dir, trained, several=True)
        identity = run_identity(self.config)
        if s.resume:
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
        loaded = {name: load_policy(p) for name, p in s.policies.items()}
        async with open_policies(
            loaded,
            run_dir=run_dir,
            stores=stores,
            candidates=candidates,
            sampler_factory=self._sampler_factory,
        ) as opened:
            resumed = [p.checkpoint.step for p in opened.values() if p.checkpoint is not None]
            start_step = min(resumed) + 1 if resumed else 0
            if s.resume:
                _forget_metrics_from(run_dir, start_step)
            lock = {**_policy_lock(opened), "resumed_from_step": start_step}
            write_run_files(run_dir, self.config, lock)
            yield self._build(next(iter(opened.values())), start_step=start_step, several=opened)

    def _build(
        self, policy: OpenPolicy, *, start_step: int = 0, several: dict[str, OpenPolicy] | None = None
    ) -> list[Any]:
        """The components, in the order of the parts. `several`: every policy of a run with
        `policies:` (`policy` is the first of them)."""
        from platoon.bus import EventLog
        from platoon.programs import EpisodeRunner

        s = self.settings
        config = self.config
        several = several or {}

        def gateway() -> Any:
            if not several:
                return _gateway(s.gateway, policy.renderer, policy.sampler_factory)
            return _policies_gateway(
                s.gateway, several, {name: p.sampler_factory for name, p in several.items()}
            )

        if s.purpose == "gateway":
            built: list[Any] = [gateway()]
            if s.event_log:
                assert s.run_dir is not None
                built.append(EventLog(s.run_dir, flush_every=1))
            return self._checked(built)

        # `tinker` judges that name no service or model use the run's own.
        def grader() -> Any:
            return _grader(config, s, tinker_base_url=policy.base_url, model_name=s.policy.model_name)

        envs = _env_services(config)
        assert s.runner is not None
        runner = s.runner
        if s.purpose in ("eval", "rollout"):
            from platoon.train.evaluate import Evaluator

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
        from platoon.stats.metrics import MetricsSink
        from platoon.stats.progress import TrainProgress
        from platoon.train.batcher import CreditAssigner
        from platoon.train.evaluate import Evaluator
        from platoon.train.loop import Scheduler

        assert s.credit is not None and s.scheduler is not None and s.metrics is not None
        assert s.run_dir is not None
        trainer, checkpoint = policy.trainer, policy.checkpoint
        version = checkpoint.policy_version if checkpoint else 0
        trainers = [p.trainer for p in several.values() if p.trainer is not None] or [trainer]
        versions = {t.policy: t.version for t in trainers} if several else {}
        if several:
            from platoon.train.policies import StepJoin

            trainers.append(StepJoin(list(versions)))
            version = min(versions.values())
        if s.nats is not None:
            opened = several or {policy.settings.name: policy}
            nats = replace(s.nats, identity=s.nats.identity | _parsers_identity(opened))
            announced = [_announced(p) for p in opened.values()]
            rollouts = trainer_components(config, announced, url=self._nats_url, settings=nats)
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
                    sealed=c.sealed,
                    policies=c.policies,
                ),
                *trainers,
                Scheduler(s.scheduler, start_step=start_step, version=version, versions=versions),
                *([Evaluator(s.eval, run_dir=s.run_dir)] if s.eval is not None else []),
                *([TrainProgress(m.total_steps, start_step=start_step)] if m.progress else []),
                MetricsSink(
                    s.run_dir,
                    wandb=m.wandb,
                    experiment=m.experiment,
                    trial=m.trial,
                    console=m.console,
                    total_steps=m.total_steps,
                ),
                *self._plugins,
            ]
        )

    def _checked(self, components: list[Any]) -> list[Any]:
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

    def worker(self, *, policy_wait: float = 30.0) -> Any:
        """The rollout worker of a `worker` run (see `platoon.train.distributed.Worker`): its
        components built, nothing connected yet."""
        from platoon.bus.events import EpisodeRequested, PolicyAnnounced, RunFinished, WorkerStatus
        from platoon.bus.nats import Leases
        from platoon.train import distributed as d

        if self.purpose != "worker":
            raise SystemError(f"a {self.purpose} run is not a worker")
        s, config = self.settings, self.config
        nats = d._nats(config, self._nats_url)
        name = self._worker_name or d.worker_name()
        loaded = {n: load_policy(p) for n, p in s.all_policies().items()}
        sampler_for = self._worker_sampler_for(loaded)
        mirrored = [PolicyAnnounced, RunFinished, WorkerStatus, *d._extra_types(nats)]
        leases = Leases()  # the work bridge learns each episode's token, the results bridge sends it
        results = d._bridge(
            config,
            self._nats_url,
            mirror=mirrored,
            durable=d.RESULT_TYPES,
            leases=leases,
            state=d.FACTS,
            read_state=True,
        )
        work = d._bridge(config, self._nats_url, work=[EpisodeRequested], consume_work=True, leases=leases)
        follower = d.PolicyFollower(sampler_for)
        assert s.runner is not None
        seal = d.ResultSeal(worker=name, envs={e.name for e in s.runner.entries})
        if s.policies:
            gateway = _policies_gateway(s.gateway, loaded, {n: follower.factory(n) for n in loaded})
        else:
            gateway = _gateway(s.gateway, loaded[s.policy.name].renderer, follower)
        components = [
            *_env_services(config),
            gateway,
            d.FollowingRunner(
                s.runner.entries, follower=follower, policy_wait=policy_wait, worker=name, seed=s.runner.seed
            ),
            _grader(config, s),
            seal,
            follower,
            *self._plugins,
        ]
        self._checked([*components, results, work])
        return d.Worker(
            components,
            results=results,
            work=work,
            follower=follower,
            seal=seal,
            name=name,
            drain_timeout=nats.drain_timeout if self._drain_timeout is None else self._drain_timeout,
            every=nats.announce_every,
            trainer_timeout=nats.trainer_timeout or max(30.0, 10 * nats.announce_every),
            identity=d.worker_identity(config) | _parsers_identity(loaded),
        )

    def _worker_sampler_for(self, loaded: dict[str, OpenPolicy]) -> Any:
        """How a worker makes the sampler of each policy the trainer announces."""
        from platoon.train import distributed as d

        if self.settings.policy.scripted:
            factories = {
                name: system.policy_from_ref(p.settings.scripted or "", p.tokenizer)
                for name, p in loaded.items()
            }

            async def sampler_for(announced: Any) -> Any:
                return await factories[announced.policy].updated(announced)

            return sampler_for
        return d.TinkerPolicies(self.config, trust_announced=d.authenticated(self.config))


def _env_services(config: Config) -> list[Any]:
    """One env service per environment entry."""
    from platoon.envs import build_env_service

    return [
        build_env_service(name, entry.service, entry.env, dict(entry.service_kwargs))
        for name, entry in zip(system.entry_names(config), config.environments, strict=True)
    ]


def _policy_lock(opened: dict[str, OpenPolicy]) -> dict[str, Any]:
    """What lock.json records of a run's several policies (the first's as the run's own)."""
    first = next(iter(opened.values()))
    return {
        "renderer": first.settings.renderer_name,
        "tool_call_parser": first.tool_call_parser,
        "policies": {
            name: {"renderer": p.settings.renderer_name, "tool_call_parser": p.tool_call_parser}
            for name, p in opened.items()
        },
    }


def _parsers_identity(opened: dict[str, OpenPolicy]) -> dict[str, str]:
    from platoon.train.distributed import parsers_identity

    return parsers_identity({name: p.tool_call_parser for name, p in opened.items()})


def _announced(policy: OpenPolicy) -> PolicyUpdated:
    """What the trainer announces of a policy at the start: the weights it resumed from (a
    trained one), or those it samples all run long (a frozen one)."""
    p = policy.settings
    if p.trainer is not None:
        version, path, model = policy.trainer.version, policy.start_path or "", p.model_name
    else:
        version, path = 0, p.model_path or ""
        model = p.local_model() if p.backend == "local" else p.model_name
    return PolicyUpdated(
        version=version, sampler_path=path, base_model=model or "", base_url=policy.base_url, policy=p.name
    )


def _policies_gateway(g: GatewaySettings, opened: dict[str, OpenPolicy], factories: dict[str, Any]) -> Any:
    """The gateway of a run with several policies (RFC 0001): it serves each of them, the
    first as its own."""
    from platoon.gateway import GatewayPolicy

    first, *others = opened
    served = {
        name: GatewayPolicy(
            opened[name].renderer,
            factories[name],
            frozen=opened[name].settings.frozen,
            model_name=opened[name].settings.model_name,
        )
        for name in others
    }
    return _gateway(g, opened[first].renderer, factories[first], policy=first, policies=served)


def _gateway(g: GatewaySettings, renderer: Any, factory: Any, **policies: Any) -> Any:
    from platoon.gateway import Gateway
    from platoon.policy.base import SampleParams

    return Gateway(
        renderer=renderer,
        sampler_factory=factory,
        defaults=SampleParams(),
        context_window=g.context_window,
        max_concurrent_samples=g.max_concurrent_samples,
        host=g.host,
        port=g.port,
        model_name=g.model_name,
        model_aliases=list(g.model_aliases),
        **policies,
    )


def _grader(config: Config, settings: Settings, **judge: Any) -> Any:
    """Each entry's reward processor, reward rules and judges (`judge`: the run's training
    service and base model, for `tinker` judges that name neither)."""
    from platoon.programs import Grader
    from platoon.rewards import build_reward_rules

    return Grader(reward_processors=settings.reward_processors, rules=build_reward_rules(config, **judge))


def trainer_components(
    config: Config,
    policy: PolicyUpdated | Sequence[PolicyUpdated],
    *,
    url: str | None = None,
    settings: NatsSettings | None = None,
) -> list[Any]:
    """What the trainer runs instead of a gateway, runner and grader when `nats:` is set:
    the bridge, the lease keeper, the policy announcer (`policy`: the one it starts with, or
    each of several) and the worker registry."""
    from platoon.bus.events import EpisodeAbandoned, EpisodeRequested, RunFinished, WorkerStatus
    from platoon.train import distributed as d

    nats = d._nats(config, url)
    if settings is None:
        settings = NatsSettings(
            lease=d.lease_timeout(config),
            max_attempts=nats.max_attempts,
            announce_every=nats.announce_every,
            identity=d.worker_identity(config),
        )
    mirrored = [d.PolicyAnnounced, RunFinished, WorkerStatus, *d._extra_types(nats)]
    bridge = d._bridge(
        config,
        url,
        mirror=mirrored,
        work=[EpisodeRequested],
        durable=d.RESULT_TYPES,
        consume_durable=True,
        durable_name=d.TRAINER_DURABLE,
        issue_leases=True,  # results count only from the worker that was given the episode
        state=d.FACTS,
        write_state=True,
        withdraw=[EpisodeAbandoned],  # a request the lease keeper gave up is offered no more
    )
    return [
        bridge,
        d.LeaseKeeper(lease=settings.lease, max_attempts=settings.max_attempts),
        d.PolicyAnnouncer(policy, every=settings.announce_every, identity=settings.identity),
        d.WorkerRegistry(every=settings.announce_every),
    ]

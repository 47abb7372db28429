"""The config schema: what a platoon config file may say, with a default for everything optional.

Every Struct forbids unknown keys, so a typo fails before anything runs. Types here are also the
loader's source of truth: it walks them (through ``msgspec.inspect``) to report every problem of a
file at once, to resolve relative paths and to parse ``key=value`` overrides.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, field

from .merge import deep_merge

__all__ = [
    "AdamParams",
    "AgentsConfig",
    "CheckpointConfig",
    "Config",
    "EnvironmentConfig",
    "EvalConfig",
    "FilePath",
    "GatewayConfig",
    "InferenceParams",
    "NatsConfig",
    "NatsTLS",
    "PathOrName",
    "PluginConfig",
    "RolloutConfig",
    "SplitsConfig",
    "StatsConfig",
    "TrainConfig",
    "WandbConfig",
    "WorkflowConfig",
    "WorkflowOverlay",
    "workflow_for",
]

# A path the loader makes absolute, relative to the file that names it.
FilePath = Annotated[str, Meta(extra={"platoon_path": "path"})]
# A local path or a name (a model on the hub, a tinker:// path): made absolute only when written
# as a path (``./x``, ``../x``, ``~/x``), so names pass through untouched.
PathOrName = Annotated[str, Meta(extra={"platoon_path": "maybe"})]

PositiveInt = Annotated[int, Meta(ge=1)]
NonNegativeInt = Annotated[int, Meta(ge=0)]
PositiveFloat = Annotated[float, Meta(gt=0)]
NonNegativeFloat = Annotated[float, Meta(ge=0)]
Fraction = Annotated[float, Meta(ge=0, le=1)]
Port = Annotated[int, Meta(ge=0, le=65535)]


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    pass


# --- train.workflow_config: groups, credit and rollouts ------------------------------------------


class InferenceParams(_Strict):
    """Sampling parameters a harness gets unless its request names its own."""

    temperature: NonNegativeFloat = 1.0  # sampling temperature; 0 is greedy
    # nucleus sampling: keep the smallest set of tokens with this much probability
    top_p: Annotated[float, Meta(gt=0, le=1)] = 1.0
    top_k: int = -1  # -1: no top-k cut
    max_completion_tokens: PositiveInt = 4096  # tokens one model call may sample
    stop: list[str] | None = None  # None: the renderer's stop tokens
    seed: int | None = None  # sampling seed; None: random


class RolloutConfig(_Strict):
    """Limits of one episode."""

    max_steps: PositiveInt = 20  # model calls of the root agent
    timeout: PositiveFloat | None = None  # wall-clock seconds; None: no limit
    inference_params: InferenceParams = field(default_factory=InferenceParams)
    # sampled tokens of the whole agent tree; None: no limit
    max_tokens_per_episode: PositiveInt | None = None


class WorkflowConfig(_Strict):
    """How rollouts are grouped and turned into advantages."""

    group_size: PositiveInt = 8  # rollouts per task; rewards are centred within the group
    # mean: r - mean(r) of the group; leave_one_out: r - mean of the others
    baseline: Literal["mean", "leave_one_out"] = "mean"
    std_scaling: bool = False  # divide advantages by the group's reward std
    # drop groups whose rollouts all got the same reward (no signal)
    remove_constant_reward_groups: bool = True
    # scale subagents' advantages by depth: none, 1/count per depth, or depth_discount^depth
    depth_weighting: Literal["none", "inverse_count", "discount"] = "none"
    depth_discount: Fraction = 1.0  # gamma for depth_weighting: discount
    # close a group this long after its first grade; None: wait for all
    straggler_timeout_seconds: PositiveFloat | None = None
    straggler_quorum: Fraction = 0.5  # share of a group that must be in before a timeout closes it
    rollout_config: RolloutConfig = field(default_factory=RolloutConfig)


# A partial WorkflowConfig laid over train's: only the keys written take effect. Kept as a mapping
# so that "not written" and "written with the default value" stay different; the loader checks it
# against WorkflowConfig all the same.
WorkflowOverlay = Annotated[dict[str, Any], Meta(extra={"platoon_overlay": WorkflowConfig})]


# --- environments ---------------------------------------------------------------------------------


class AgentsConfig(_Strict):
    """The agent tree an episode may grow: subagents, their budgets and their rewards."""

    max_depth: NonNegativeInt = 0  # 0: no subagents
    budget: Literal["shared", "per_depth"] = "shared"  # one step budget for the tree, or one per depth
    fork: Literal["shared", "copy", "fresh"] = "shared"  # what a child's env session starts from
    # model calls per subagent (the pool per depth when budget is per_depth)
    child_max_steps: PositiveInt = 15
    child_timeout: PositiveFloat | None = None  # wall-clock seconds per subagent; None: no limit
    max_concurrent_children: PositiveInt = 4  # children of one agent running at once
    max_children: PositiveInt = 64  # spawns per episode
    # a subagent trains on the root's reward, its own grade, or a mix of both
    child_reward: Literal["root", "own", "mix"] = "root"
    child_reward_mix: Fraction = 0.5  # weight of the child's own reward when child_reward is mix


class SplitsConfig(_Strict):
    """Which of the environment's splits train and evaluation draw tasks from."""

    train: str = "train"  # the split training draws tasks from
    eval: str = "test"  # the split evaluation draws tasks from


class EnvironmentConfig(_Strict):
    """One environment entry: a service paired with the harness that plays it."""

    # the entry's name in events, metrics and --env; None: derived from env or service
    name: str | None = None
    env: str | None = None  # a named environment, e.g. platoon-number-search@1
    service: str | None = None  # python://module:Class, http://host:port, harbor, module:Class
    # passed to the service's backend; secrets, tool_errors and tool_timeout go to the env service
    service_kwargs: dict[str, Any] = {}
    package: str | None = None  # a module imported first, so the harnesses it defines register
    # a harness name, a *.toml spec path, or {name: weight} to mix harnesses
    harness: str | Annotated[dict[str, PositiveFloat], Meta(min_length=1)] | None = None
    harness_options: dict[str, Any] = {}  # checked later against what the harness declares
    program: str = "single"  # the episode program: single, recursive, compacting, or a registered name
    program_options: dict[str, Any] = {}  # checked against the options the program declares
    agents: AgentsConfig = field(default_factory=AgentsConfig)
    # module:attr or a name: f(finished, graded) -> reward, applied to each grade
    reward_processor: str | None = None
    weight: PositiveFloat = 1.0  # share of training tasks drawn from this entry
    splits: SplitsConfig = field(default_factory=SplitsConfig)
    workflow_config: WorkflowOverlay = {}  # overrides of train.workflow_config for this entry's tasks


# --- train ----------------------------------------------------------------------------------------


class AdamParams(_Strict):
    """AdamW settings, as Tinker's ``AdamParams`` takes them."""

    learning_rate: PositiveFloat = 4e-5  # AdamW step size
    beta1: Fraction = 0.9  # decay of the first-moment estimate
    beta2: Fraction = 0.95  # decay of the second-moment estimate
    eps: PositiveFloat = 1e-8  # added to the denominator for numerical stability
    weight_decay: NonNegativeFloat = 0.0  # decoupled weight decay
    grad_clip_norm: NonNegativeFloat = 0.0  # 0: no clipping


class TrainConfig(_Strict):
    """The policy, the training service and the schedule."""

    model_name: PathOrName  # the base model: a name the training service knows, or a local directory
    renderer_name: str  # how messages become tokens: qwen3, qwen3_instruct, or a registered renderer
    tokenizer: PathOrName | None = None  # None: the model's own
    # how replies become tool calls: auto (from the renderer), hermes, qwen, llama3, json
    tool_call_parser: str = "auto"
    backend: Literal["tinker", "local"] = "tinker"  # local: platoon's embedded training service
    batch_size: PositiveInt = 32  # tasks per step
    max_training_steps: PositiveInt | None = None  # None: one pass over the training tasks
    seed: int = 0  # seed for task order and sampling
    optimizer: AdamParams = field(default_factory=AdamParams)
    lora_rank: PositiveInt = 32  # rank of the LoRA adapter that trains
    # the training service's loss function
    loss_fn: Literal["importance_sampling", "ppo", "cispo", "dro", "cross_entropy"] = "importance_sampling"
    loss_fn_config: dict[str, float | str] = {}  # passed to the loss function (e.g. clip thresholds)
    # sum: Tinker's summed loss; token_mean: divided by the batch's trained tokens
    loss_normalization: Literal["sum", "token_mean"] = "token_mean"
    max_staleness: NonNegativeInt = 0  # steps a datum's policy may lag; 0: strictly on-policy
    workflow_config: WorkflowConfig = field(default_factory=WorkflowConfig)
    save_every: NonNegativeInt = 10  # steps between checkpoints; 0: only the last
    context_window_length: PositiveInt | None = None  # None: the model's


class EvalConfig(_Strict):
    """Evaluation on held-out tasks, during training or alone."""

    every: NonNegativeInt = 0  # steps between evaluations while training; 0: none
    at_start: bool = False  # evaluate the base model before the first update
    split: str | None = None  # None: each environment's splits.eval
    group_size: PositiveInt = 1  # attempts per task (pass@k)
    concurrency: PositiveInt = 16  # episodes in flight at once
    max_tasks: PositiveInt | None = None  # evaluate at most this many tasks per entry; None: the whole split
    model_name: PathOrName | None = None  # None: train.model_name
    renderer_name: str | None = None  # None: train.renderer_name
    model_path: str | None = None  # sampler weights to evaluate, e.g. a tinker:// path
    workflow_config: WorkflowOverlay = {}  # overrides of the workflow settings for evaluation


class CheckpointConfig(_Strict):
    """Where training starts from and what it keeps."""

    load_path: PathOrName | None = None  # start from these weights with a fresh optimizer
    keep: PositiveInt | None = None  # checkpoints kept; None: all


# --- stats, plugins, gateway, nats ----------------------------------------------------------------


class WandbConfig(_Strict):
    # disabled, online (needs WANDB_API_KEY and the wandb package) or offline
    mode: Literal["disabled", "online", "offline"] = "disabled"
    project: str | None = None  # the W&B project; None: stats.experiment_name
    entity: str | None = None  # the W&B team or user; None: W&B's default
    tags: list[str] = []  # tags of the W&B run


class StatsConfig(_Strict):
    """Names of the run (its directory) and where metrics go."""

    experiment_name: str = "platoon"  # the run directory is <runs>/<experiment_name>/<trial_name>
    trial_name: str | None = None  # None: the UTC start time
    wandb: WandbConfig = field(default_factory=WandbConfig)  # Weights & Biases logging
    log_every: PositiveInt = 1  # not read yet: metrics are written every step


class PluginConfig(_Strict):
    """An event-handler plugin: a handler with the events it takes, or a whole component."""

    handler: str | None = None  # module:attr or an entry-point name
    component: str | None = None  # module:attr or an entry-point name of a component class or factory
    events: list[str] = []  # event type names the handler receives; []: what it declares, else all
    options: dict[str, Any] = {}  # keyword arguments for a component's constructor


class GatewayConfig(_Strict):
    """The model gateway's HTTP listener; loopback unless asked otherwise."""

    host: str = "127.0.0.1"  # where the gateway listens; beyond loopback, agents on other hosts can reach it
    port: Port = 0  # 0: a free port chosen at start
    max_concurrent_samples: PositiveInt = 256  # model calls sampled at once; more wait
    # Model names agents may ask for besides the policy's and "platoon-policy"; others are a 404.
    model_aliases: list[str] = []


class NatsTLS(_Strict):
    ca_file: FilePath | None = None  # the CA that signed the server's certificate
    cert_file: FilePath | None = None  # a client certificate, for servers that ask for one
    key_file: FilePath | None = None  # the client certificate's private key


class NatsConfig(_Strict):
    """The NATS bridge that spreads the bus over machines."""

    url: str = "nats://127.0.0.1:4222"  # the NATS server, or a list of servers; tls://... for TLS
    subject_prefix: str = "platoon"  # events travel on <prefix>.<run>.<event>
    run: str | None = None  # None: <experiment_name>-<trial_name>; trainer and workers must agree
    subjects: list[str] = []  # more event types (names or tags) mirrored between trainer and workers
    credentials_file: FilePath | None = None  # from `platoon nats init` (or a NATS .creds file)
    tls: NatsTLS | None = None  # TLS files for tls:// URLs
    insecure: bool = False  # allow a server beyond loopback without credentials (isolated networks)
    # Failure handling (see platoon.train.distributed): an episode with no sign of life for
    # lease_timeout s is re-requested, at most max_attempts times in all.
    lease_timeout: PositiveFloat | None = None  # None: the rollout timeout + 30 s, else 600 s
    max_attempts: PositiveInt = 3  # tries per episode before it counts as failed
    announce_every: PositiveFloat = 5.0  # s between re-announcements of the current policy
    # A worker that has heard no announcement for this long takes the trainer for gone and
    # stops (None: 10 announcement periods, at least 30 s).
    trainer_timeout: PositiveFloat | None = None
    drain_timeout: NonNegativeFloat = 30.0  # s a stopping worker lets its episodes finish


# --- the whole file -------------------------------------------------------------------------------


class Config(_Strict):
    """A platoon config file, after ``extends:`` and overrides are applied."""

    extends: str | list[str] | None = None  # consumed by the loader; None once loaded
    environments: list[EnvironmentConfig] = []
    train: TrainConfig | None = None
    eval: EvalConfig | None = None
    stats: StatsConfig = field(default_factory=StatsConfig)
    plugins: list[PluginConfig] = []
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    nats: NatsConfig | None = None
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log_path: FilePath | None = None  # None: the site profile's runs
    # a self-hosted Tinker-API server for every Tinker client; None: $TINKER_BASE_URL or hosted
    tinker_base_url: str | None = None


def workflow_for(
    config: Config, environment: EnvironmentConfig | None = None, *, eval: bool = False
) -> WorkflowConfig:
    """The workflow settings in force for one environment, in training or in evaluation.

    Layers, lowest first: ``train.workflow_config``, the environment's overlay, then (for
    evaluation) ``eval.workflow_config`` and ``eval.group_size``.
    """
    base = config.train.workflow_config if config.train is not None else WorkflowConfig()
    merged = msgspec.to_builtins(base)
    overlays = [environment.workflow_config if environment is not None else {}]
    if eval and config.eval is not None:
        overlays += [config.eval.workflow_config, {"group_size": config.eval.group_size}]
    for overlay in overlays:
        merged = deep_merge(merged, overlay)
    return msgspec.convert(merged, WorkflowConfig)

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
    "CorrectionConfig",
    "DistillConfig",
    "EnvironmentConfig",
    "EvalConfig",
    "FilePath",
    "GatewayConfig",
    "InferenceParams",
    "JudgeConfig",
    "JudgeScore",
    "KLConfig",
    "NatsConfig",
    "NatsTLS",
    "PathOrName",
    "PluginConfig",
    "PolicyChoice",
    "PolicyConfig",
    "RewardConfig",
    "RewardRule",
    "RolloutConfig",
    "SftConfig",
    "SplitsConfig",
    "StatsConfig",
    "TrainConfig",
    "WandbConfig",
    "WorkflowConfig",
    "WorkflowOverlay",
    "policy_names",
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


# The losses of the Tinker API a config may name.
LossFn = Literal["importance_sampling", "ppo", "cispo", "dro", "cross_entropy"]


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    pass


# --- train.workflow_config: groups, credit and rollouts ------------------------------------------


class InferenceParams(_Strict, frozen=True):
    """Sampling parameters a harness gets unless its request names its own."""

    temperature: NonNegativeFloat = 1.0  # sampling temperature; 0 is greedy
    # nucleus sampling: keep the smallest set of tokens with this much probability
    top_p: Annotated[float, Meta(gt=0, le=1)] = 1.0
    top_k: int = -1  # -1: no top-k cut
    max_completion_tokens: PositiveInt = 4096  # tokens one model call may sample
    stop: list[str] | None = None  # None: the renderer's stop tokens
    # one seed for every call (rarely wanted); None: each call's seed derives from train.seed
    seed: int | None = None


class RolloutConfig(_Strict, frozen=True):
    """Limits of one episode."""

    max_steps: PositiveInt = 20  # model calls of the root agent
    timeout: PositiveFloat | None = None  # wall-clock seconds; None: no limit
    inference_params: InferenceParams = field(default_factory=InferenceParams)
    # sampled tokens of the whole agent tree; None: no limit
    max_tokens_per_episode: PositiveInt | None = None


class WorkflowConfig(_Strict, frozen=True):
    """How rollouts are grouped and turned into advantages."""

    group_size: PositiveInt = 8  # rollouts per task; rewards are centred within the group
    # mean: r - mean(r) of the group; leave_one_out: r - mean of the others; or a rule of your
    # own: a name registered with @platoon.credit.register_credit_rule (in a module of `package:`), or
    # module:attr of a function rewards -> advantages
    baseline: str = "mean"
    std_scaling: bool = False  # divide advantages by the group's reward std
    # drop groups whose rollouts all got the same reward (no signal)
    remove_constant_reward_groups: bool = True
    # scale subagents' advantages by depth: none, 1/count per depth, or depth_discount^depth
    depth_weighting: Literal["none", "inverse_count", "discount"] = "none"
    depth_discount: Fraction = 1.0  # gamma for depth_weighting: discount
    # close a group this long after its first grade; None: wait for all
    straggler_timeout_seconds: PositiveFloat | None = None
    straggler_quorum: Fraction = 0.5  # share of a group that must be in before a timeout closes it
    # a group trains only when at least this share of its rollouts were graded: episodes the
    # system failed (sandbox, environment, sampler, worker) are never in a baseline, and a group
    # left with fewer is dropped rather than trained on the few
    min_group_share: Fraction = 0.5
    # outcome: one reward per episode, spread over its calls; per_turn: each call answers to the
    # rewards that arrived after it (tool results), with baselines per turn of the group
    credit: Literal["outcome", "per_turn"] = "outcome"
    turn_discount: Fraction = 1.0  # per_turn: a reward k turns later counts turn_discount^k
    rollout_config: RolloutConfig = field(default_factory=RolloutConfig)


# A partial WorkflowConfig laid over train's: only the keys written take effect. Kept as a mapping
# so that "not written" and "written with the default value" stay different; the loader checks it
# against WorkflowConfig all the same.
WorkflowOverlay = Annotated[dict[str, Any], Meta(extra={"platoon_overlay": WorkflowConfig})]


# --- rewards: judges and rules --------------------------------------------------------------------


class JudgeScore(_Strict, frozen=True):
    """How a judge's reply becomes a score: one of `number`, `labels`, `json_schema`."""

    # [low, high]: the judge answers a number in this range, mapped to 0..1
    number: Annotated[list[float], Meta(min_length=2, max_length=2)] | None = None
    labels: dict[str, float] | None = None  # a word the judge answers -> its score
    json_schema: dict[str, Any] | None = None  # the judge answers a JSON object; its `field` is the score
    field: str = "score"  # json_schema: the key holding the score (a number, or a label of `labels`)


class JudgeConfig(_Strict, frozen=True):
    """A model that scores an episode from a rubric (see docs: Judges)."""

    backend: Literal["openai", "tinker"] = "openai"  # an OpenAI-compatible endpoint, or a Tinker sampler
    # openai: the endpoint's /v1 root; tinker: a Tinker-API server (None: the run's training service)
    base_url: str | None = None
    model: str | None = None  # the judge model; tinker: None is the policy's base model (frozen)
    model_path: str | None = None  # tinker: sampler weights, e.g. a frozen platoon policy's tinker:// path
    renderer_name: str | None = None  # tinker: how messages become tokens; None: train.renderer_name
    api_key_env: str | None = None  # the environment variable holding the endpoint's key
    # the rubric, a template: {task} {transcript} {final_answer} {reward}; the transcript is fenced
    rubric: str | None = None
    rubric_file: FilePath | None = None  # the rubric from a file instead
    files: list[str] = []  # sandbox files (absolute paths) the rubric shows as {files}, read before grading
    system: str | None = None  # a system message for the judge
    score: JudgeScore = field(default_factory=lambda: JudgeScore(number=[0.0, 10.0]))
    samples: PositiveInt = 1  # judge replies per episode
    aggregate: Literal["mean", "median", "min", "max", "majority"] = "mean"  # how samples combine
    temperature: NonNegativeFloat = 1.0  # the judge's sampling temperature
    max_tokens: PositiveInt = 512  # tokens per judge reply
    max_concurrent: PositiveInt = 8  # judge calls in flight at once
    retries: NonNegativeInt = 2  # more tries per sample when a call fails or its reply has no score
    timeout: PositiveFloat = 120.0  # seconds per judge call
    cache: bool = True  # reuse the reply to an identical prompt (same judge, same sample) in this run
    # compare the attempts of one task group instead: each scores its share of wins; the rubric's
    # placeholders are then {task}, {attempt_a}, {attempt_b}
    pairwise: bool = False
    group_timeout: PositiveFloat = 900.0  # pairwise: seconds to wait for the group's other attempts
    # score each turn of the root agent (the episode up to that reply) instead: the part is their mean,
    # and each turn's score is that turn's reward for per-turn credit
    per_turn: bool = False


class RewardRule(_Strict, frozen=True):
    """One part of an episode's reward; the parts are combined with their weights."""

    # env: the environment's grade; judge: a judge's score; format: 1 when the text matches `pattern`
    # whole; match: 1 when the text matches `expected`; length_penalty, tool_penalty: per token/call
    # over the allowance; python: `ref`, f(episode) -> float
    rule: Literal["env", "judge", "format", "match", "length_penalty", "tool_penalty", "python"]
    name: str | None = None  # the part's name in rewards and metrics; None: the rule's
    weight: float = 1.0  # its weight in the combination
    text: Literal["final_answer", "last_reply", "replies"] = "final_answer"  # what format and match read
    pattern: str | None = None  # format: a regex the whole text must match; match (regex): to search
    # match: how the text is compared with `expected`
    kind: Literal["exact", "regex", "numeric"] = "exact"
    expected: str | None = None  # match: the answer; {key} is taken from the task's spec
    tolerance: NonNegativeFloat = 1e-6  # match (numeric): how far the number may be off
    max_tokens: NonNegativeInt = 0  # length_penalty: sampled tokens that are free
    per_token: float = -0.001  # length_penalty: the value of each token beyond them
    per_call: float = -0.01  # tool_penalty: the value of each tool call beyond `free_calls`
    free_calls: NonNegativeInt = 0  # tool_penalty: calls that are free
    tools: list[str] = []  # tool_penalty: only these tools count; []: all
    ref: str | None = None  # python: module:attr
    judge: JudgeConfig | None = None  # judge: this rule's own judge; None: the entry's


class RewardConfig(_Strict, frozen=True):
    """An entry's reward: its rules and how they combine."""

    rules: list[RewardRule] = []
    # weighted_sum: sum of weight * part; min, product: of the weighted parts
    combine: Literal["weighted_sum", "min", "product"] = "weighted_sum"


# --- environments ---------------------------------------------------------------------------------


class PolicyChoice(_Strict, frozen=True):
    """Which of the config's `policies:` plays an agent: looked up by the agent's depth in the
    tree (keys "0", "1", ...), its harness's name, or the role its program gave it (the root's
    role is "root"). An agent the map does not name is an error, never a fallback."""

    by: Literal["depth", "harness", "role"]  # what of the agent picks its policy
    map: Annotated[dict[str, str], Meta(min_length=1)]  # depth, harness or role -> policy name


class AgentsConfig(_Strict, frozen=True):
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
    # which of `policies:` plays each agent; None: the one policy (train:, or a single entry)
    policy: PolicyChoice | None = None


class SplitsConfig(_Strict, frozen=True):
    """Which of the environment's splits train and evaluation draw tasks from."""

    train: str = "train"  # the split training draws tasks from
    eval: str = "test"  # the split evaluation draws tasks from


class EnvironmentConfig(_Strict, frozen=True):
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
    judge: JudgeConfig | None = None  # a model that scores episodes; alone, its score is the reward
    reward: RewardConfig | None = None  # weighted reward rules; None: the environment's grade
    weight: PositiveFloat = 1.0  # share of training tasks drawn from this entry
    splits: SplitsConfig = field(default_factory=SplitsConfig)
    workflow_config: WorkflowOverlay = {}  # overrides of train.workflow_config for this entry's tasks


# --- train ----------------------------------------------------------------------------------------


class AdamParams(_Strict, frozen=True):
    """AdamW settings, as Tinker's ``AdamParams`` takes them."""

    learning_rate: PositiveFloat = 4e-5  # AdamW step size
    beta1: Fraction = 0.9  # decay of the first-moment estimate
    beta2: Fraction = 0.95  # decay of the second-moment estimate
    eps: PositiveFloat = 1e-8  # added to the denominator for numerical stability
    weight_decay: NonNegativeFloat = 0.0  # decoupled weight decay
    grad_clip_norm: NonNegativeFloat = 0.0  # 0: no clipping


class KLConfig(_Strict, frozen=True):
    """A KL penalty against a reference policy, folded into the advantages."""

    coefficient: NonNegativeFloat = 0.01  # weight of the penalty; 0 only reports the KL
    reference_path: str | None = None  # sampler weights of the reference; None: the base model
    # a frozen policy of `policies:` as the reference, by name: the weights it samples (its
    # model_path on its base model); it must share the trained policy's tokenizer and renderer
    reference_policy: str | None = None


class DistillConfig(_Strict, frozen=True):
    """On-policy distillation: a frozen teacher scores the tokens the policy sampled, and the
    per-token reverse KL to it is the policy's advantage, mixed with the task's by `weight`."""

    weight: Fraction = 1.0  # 1: the teacher only; w: (1 - w) x the task's advantage + w x the teacher's
    teacher: str | None = None  # a frozen policy of `policies:`, by name
    # or sampler weights: a tinker:// path, a checkpoint's directory or a run directory (its
    # newest checkpoint); with neither, the base model ("recover what fine-tuning lost")
    teacher_path: PathOrName | None = None


class CorrectionConfig(_Strict, frozen=True):
    """Token-level importance sampling against the sampler (`train.correction`): before the step, a
    forward pass measures r = p_trainer / p_sampler on every sampled token, and each token's
    advantage is weighted by r, truncated (TIS) or masked (MIS) where r strays."""

    # truncate: weight min(r, high); mask: weight r where low <= r <= high, else 0 (the token is dropped)
    mode: Literal["truncate", "mask"] = "truncate"
    high: PositiveFloat = 2.0  # the largest weight a token carries (truncate), or keeps (mask)
    low: NonNegativeFloat = 0.0  # mask: tokens whose r is below this are dropped too

    def __post_init__(self) -> None:
        if self.low >= self.high:
            raise ValueError(f"correction.low ({self.low}) must be below correction.high ({self.high})")


class TrainConfig(_Strict, frozen=True):
    """The policy, the training service and the schedule."""

    model_name: PathOrName  # the base model: a name the training service knows, or a local directory
    renderer_name: str  # how messages become tokens: qwen3, qwen3_instruct, or a registered renderer
    tokenizer: PathOrName | None = None  # None: the model's own
    # how replies become tool calls: auto (from the renderer), hermes, qwen, llama3, json
    tool_call_parser: str = "auto"
    backend: Literal["tinker", "local"] = "tinker"  # local: platoon's embedded training service
    batch_size: PositiveInt = 32  # tasks per step
    max_training_steps: PositiveInt | None = None  # None: one pass over the training tasks
    # task order, harness draws and each model call's sampling seed derive from it: a rerun
    # with the same seed draws the same random numbers
    seed: int = 0
    # local backend: a sequence's numbers never depend on what shares its batch, so that a rerun
    # with the same seed is the same run bit for bit whatever the machine's load (batched
    # sampling's last float bits follow what shares a batch); its prefix cache is exact
    reproducible: bool = False
    optimizer: AdamParams = field(default_factory=AdamParams)
    lora_rank: PositiveInt = 32  # rank of the LoRA adapter that trains
    # the training service's loss function
    loss_fn: LossFn = "importance_sampling"
    loss_fn_config: dict[str, float | str] = {}  # passed to the loss function (e.g. clip thresholds)
    # sum: Tinker's summed loss; token_mean: divided by the batch's trained tokens
    loss_normalization: Literal["sum", "token_mean"] = "token_mean"
    max_staleness: NonNegativeInt = 0  # steps a datum's policy may lag; 0: strictly on-policy
    # correct for the sampler's numbers differing from the trainer's (and for staleness) with
    # truncated or masked importance weights; costs a forward pass a step. None: no correction
    correction: CorrectionConfig | None = None
    workflow_config: WorkflowConfig = field(default_factory=WorkflowConfig)
    save_every: NonNegativeInt = 10  # steps between checkpoints; 0: only the last
    context_window_length: PositiveInt | None = None  # None: the model's
    kl: KLConfig | None = None  # a KL penalty against a reference policy; None: none
    distill: DistillConfig | None = None  # on-policy distillation from a teacher; None: none


class PolicyConfig(_Strict, frozen=True):
    """One of several policies trained (or only sampled) in one run. A key left out is taken
    from `train:`, which also keeps the schedule (batch size, steps, workflow) for all of them."""

    model_name: PathOrName | None = None  # the base model; None: train.model_name
    renderer_name: str | None = None  # None: train.renderer_name
    tokenizer: PathOrName | None = None  # None: train.tokenizer, else the model's own
    tool_call_parser: str | None = None  # None: train.tool_call_parser
    backend: Literal["tinker", "local"] | None = None  # None: train.backend
    tinker_base_url: str | None = None  # this policy's Tinker-API server; None: the run's
    lora_rank: PositiveInt | None = None  # None: train.lora_rank
    optimizer: AdamParams | None = None  # None: train.optimizer
    loss_fn: LossFn | None = None
    loss_fn_config: dict[str, float | str] | None = None  # None: train.loss_fn_config
    # the sampler weights a frozen policy (or an evaluation) samples, e.g. a tinker:// path; None: the base model
    model_path: PathOrName | None = None
    # a training state (a tinker:// path of `save_state`) this trained policy starts from, with a
    # fresh optimizer; what `checkpoint.load_path` is to a run of one policy. None: its base model
    load_path: PathOrName | None = None
    kl: KLConfig | None = None  # this policy's KL penalty (e.g. against a frozen policy); None: train.kl
    distill: DistillConfig | None = None  # this policy's teacher (e.g. a frozen policy); None: train.distill
    correction: CorrectionConfig | None = None  # this policy's importance correction; None: train.correction
    frozen: bool = False  # a frozen policy samples and never trains: an opponent or a reference


class EvalConfig(_Strict, frozen=True):
    """Evaluation on held-out tasks, during training or alone."""

    every: NonNegativeInt = 0  # steps between evaluations while training; 0: none
    at_start: bool = False  # evaluate the base model before the first update
    split: str | None = None  # None: each environment's splits.eval
    group_size: PositiveInt = 1  # attempts per task (pass@k)
    concurrency: PositiveInt = 16  # episodes in flight at once
    max_tasks: PositiveInt | None = None  # evaluate at most this many tasks per entry; None: the whole split
    model_name: PathOrName | None = None  # None: train.model_name
    renderer_name: str | None = None  # None: train.renderer_name
    # sampler weights to evaluate: a tinker:// path; on the embedded backend also a finished run's
    # directory (its newest checkpoint) or a checkpoint's directory
    model_path: PathOrName | None = None
    workflow_config: WorkflowOverlay = {}  # overrides of the workflow settings for evaluation


class CheckpointConfig(_Strict, frozen=True):
    """Where training starts from and what it keeps."""

    # start from this training state with a fresh optimizer; with `policies:`, each policy's own
    # `policies.<name>.load_path` instead
    load_path: PathOrName | None = None
    keep: PositiveInt | None = None  # checkpoints kept; None: all


class SftConfig(_Strict, frozen=True):
    """Supervised fine-tuning on recorded episodes (`platoon sft`): cross-entropy on the exact
    tokens a run recorded, the policy's own completions weighted 1, prompts and tool results 0."""

    epochs: PositiveInt = 1  # passes over the kept datums
    batch_size: PositiveInt = 16  # datums (an agent's merged calls) per optimizer step
    learning_rate: PositiveFloat | None = None  # None: train.optimizer.learning_rate
    # share of the kept episodes held out (whole episodes, chosen by the seed): their loss per
    # token is measured after each epoch and never trained on
    heldout: Annotated[float, Meta(ge=0, lt=1)] = 0.0
    save_every: NonNegativeInt = 0  # steps between checkpoints; 0: at the end of each epoch
    seed: int | None = None  # the order of datums in each epoch and the held-out draw; None: train.seed


# --- stats, plugins, gateway, nats ----------------------------------------------------------------


class WandbConfig(_Strict, frozen=True):
    # disabled, online (needs WANDB_API_KEY and the wandb package) or offline
    mode: Literal["disabled", "online", "offline"] = "disabled"
    project: str | None = None  # the W&B project; None: stats.experiment_name
    entity: str | None = None  # the W&B team or user; None: W&B's default
    tags: list[str] = []  # tags of the W&B run


class StatsConfig(_Strict, frozen=True):
    """Names of the run (its directory) and where metrics go."""

    experiment_name: str = "platoon"  # the run directory is <runs>/<experiment_name>/<trial_name>
    trial_name: str | None = None  # None: the UTC start time
    wandb: WandbConfig = field(default_factory=WandbConfig)  # Weights & Biases logging
    # warn (step line, live display, closing summary) when a step's sampler-trainer KL estimate
    # (`mismatch/kl`) passes this; None: never
    warn_mismatch_kl: NonNegativeFloat | None = 0.01
    # warn when the share of sampled tokens the loss clipped (`ratio/clipped_fraction`) passes this; None: never
    warn_clipped_fraction: Fraction | None = 0.2


class PluginConfig(_Strict, frozen=True):
    """An event-handler plugin: a handler with the events it takes, or a whole component."""

    handler: str | None = None  # module:attr or an entry-point name
    component: str | None = None  # module:attr or an entry-point name of a component class or factory
    events: list[str] = []  # event type names the handler receives; []: what it declares, else all
    options: dict[str, Any] = {}  # keyword arguments for a component's constructor


class GatewayConfig(_Strict, frozen=True):
    """The model gateway's HTTP listener; loopback unless asked otherwise."""

    host: str = "127.0.0.1"  # where the gateway listens; beyond loopback, agents on other hosts can reach it
    port: Port = 0  # 0: a free port chosen at start
    max_concurrent_samples: PositiveInt = 256  # model calls sampled at once; more wait
    # Model names agents may ask for besides the policy's and "platoon-policy"; others are a 404.
    model_aliases: list[str] = []
    # Samples of a reply that must be a tool call (tool_choice) or JSON (response_format) before
    # the call is refused, from a sampler that cannot constrain its decoding (the embedded one can).
    constraint_tries: PositiveInt = 3


class NatsTLS(_Strict, frozen=True):
    ca_file: FilePath | None = None  # the CA that signed the server's certificate
    cert_file: FilePath | None = None  # a client certificate, for servers that ask for one
    key_file: FilePath | None = None  # the client certificate's private key


class NatsConfig(_Strict, frozen=True):
    """The NATS bridge that spreads the bus over machines."""

    url: str = "nats://127.0.0.1:4222"  # the NATS server, or a list of servers; tls://... for TLS
    subject_prefix: str = "platoon"  # events travel on <prefix>.<run>.<event>
    run: str | None = None  # None: <experiment_name>-<trial_name>; trainer and workers must agree
    subjects: list[str] = []  # more event types (names or tags) mirrored between trainer and workers
    credentials_file: FilePath | None = None  # from `platoon nats init` (or a NATS .creds file)
    tls: NatsTLS | None = None  # TLS files for tls:// URLs
    # allow a server that lets anyone in (a worker refuses one, since anyone could steer it),
    # or one beyond loopback without credentials: only on a network nobody else reaches
    insecure: bool = False
    connect_timeout: PositiveFloat = 10.0  # s to reach the server at start before giving up
    # Failure handling (see platoon.train.distributed): an episode with no sign of life for
    # lease_timeout s is re-requested, at most max_attempts times in all.
    lease_timeout: PositiveFloat | None = None  # None: the rollout timeout + 30 s, else 600 s
    max_attempts: PositiveInt = 3  # tries per episode before it counts as failed
    announce_every: PositiveFloat = 5.0  # s between re-announcements of the current policy
    # A worker that has heard no announcement for this long takes the trainer for gone and
    # stops (None: 10 announcement periods, at least 30 s).
    trainer_timeout: PositiveFloat | None = None
    drain_timeout: NonNegativeFloat = 30.0  # s a stopping worker lets its episodes finish
    # s a worker has to claim an episode it was offered; unclaimed (the worker hangs), the
    # episode is offered to another worker
    offer_timeout: PositiveFloat = 5.0


# --- the whole file -------------------------------------------------------------------------------


class Config(_Strict, frozen=True):
    """A platoon config file, after ``extends:`` and overrides are applied."""

    extends: str | list[str] | None = None  # consumed by the loader; None once loaded
    environments: list[EnvironmentConfig] = []
    train: TrainConfig | None = None
    # several policies in one run, by name; None: train: is the one policy, named "default"
    policies: Annotated[dict[str, PolicyConfig], Meta(min_length=1)] | None = None
    eval: EvalConfig | None = None
    stats: StatsConfig = field(default_factory=StatsConfig)
    plugins: list[PluginConfig] = []
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    nats: NatsConfig | None = None
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    sft: SftConfig | None = None  # `platoon sft`'s settings; None: the defaults
    log_path: FilePath | None = None  # None: the site profile's runs
    # a self-hosted Tinker-API server for every Tinker client; None: $TINKER_BASE_URL or hosted
    tinker_base_url: str | None = None


def policy_names(config: Config) -> list[str]:
    """The run's policies, in config order: `policies:`'s names, else the one "default"."""
    return list(config.policies) if config.policies else ["default"]


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


def entry_names(config: Config) -> list[str]:
    """Each environment entry's name: its `name`, else its env or service, made unique."""
    names: list[str] = []
    for i, entry in enumerate(config.environments):
        name = entry.name or (entry.env or entry.service or f"env{i}").split("@")[0]
        if name in names:
            name = f"{name}-{i}"
        names.append(name)
    return names

"""The typed events that platoon's components exchange.

One class per fact that happened. Events are frozen, tagged msgspec Structs, so the same
object is what a handler receives in process, what the event log writes to disk and what the
NATS bridge carries between machines. The tag is the class name unless a class sets its own.

A plugin adds its own event types by subclassing `Event` and decorating the class with
`register_event`; the codec then round-trips it like the built-in ones.
"""

from __future__ import annotations

import hashlib
import os
import sys
from typing import Any, ClassVar, ForwardRef, Generic, Literal, TypeVar, get_args

import msgspec

from platoon.bus.chat import ChatMessage, SampledMessage

__all__ = [
    "AgentFinished",
    "AgentOpenRequested",
    "AgentOpened",
    "AgentProcessExited",
    "AgentProcessRequested",
    "AgentSpawned",
    "BatchReady",
    "BridgeDisconnected",
    "BridgeReconnected",
    "CallKind",
    "ChatReplied",
    "ChatRequested",
    "CheckpointSaved",
    "ComponentFailed",
    "Datum",
    "DatumsScored",
    "EpisodeAbandoned",
    "EpisodeFinished",
    "EpisodeGraded",
    "EpisodeRequested",
    "EpisodeSealed",
    "EpisodeStarted",
    "EpisodeStatus",
    "EvalFinished",
    "EvalRequested",
    "Evaluated",
    "Event",
    "ForkMode",
    "GradeRequested",
    "Graded",
    "GroupCompleted",
    "ModelCallFailed",
    "ModelCallFinished",
    "PolicyAnnounced",
    "PolicyStepFinished",
    "PolicyUpdated",
    "Reply",
    "Request",
    "RunFinished",
    "SessionOpenRequested",
    "SessionOpened",
    "StepRequested",
    "StepStarted",
    "TaskRef",
    "TasksListed",
    "TasksRequested",
    "ToolCalled",
    "ToolReturned",
    "ToolSpec",
    "TrainStepFinished",
    "WorkClaimed",
    "WorkerStatus",
    "derive_seed",
    "event_types",
    "new_id",
    "register_event",
    "step_number",
]

E = TypeVar("E", bound=type)

_REGISTRY: dict[str, type[Event]] = {}


def new_id() -> str:
    """A fresh random id (32 hex digits) for episodes, agents, calls and requests: 128 random
    bits, as a uuid4 has, at a quarter of its cost (every call and request takes some)."""
    return os.urandom(16).hex()


def derive_seed(*parts: object) -> int:
    """A sampling seed in [0, 2**30) that depends only on `parts` (a run's seed, a step, an
    index): the same parts give the same seed on every machine and in every process. 30 bits,
    so that every Tinker server takes it: skyrl-tx holds a seed in an int32 and adds the sample's
    index to it, which leaves room for 2**30 samples."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 34


class Event(msgspec.Struct, frozen=True, tag=True, kw_only=True):
    """Base class of every event. Subscribing to `Event` receives everything."""


R = TypeVar("R", bound="Reply")


class Request(Event, Generic[R], frozen=True, kw_only=True):
    """An event that expects exactly one reply, of type `R`, whose `reply_to` is this
    `request_id`. Each request type names its reply: `class ToolCalled(Request["ToolReturned"])`."""

    request_id: str = msgspec.field(default_factory=new_id)


class Reply(Event, frozen=True, kw_only=True):
    """The answer to a `Request`; `error` is set when the responder could not answer."""

    reply_to: str
    error: str | None = None


_REPLY_TYPES: dict[type, type[Reply]] = {}


def reply_type(request: type[Request[R]]) -> type[R]:
    """The reply type a request type names (`Request[R]`); `Reply` where it names none."""
    found = _REPLY_TYPES.get(request)
    if found is None:
        found = Reply
        for klass in request.__mro__:
            for base in getattr(klass, "__orig_bases__", ()):
                args = get_args(base)
                if getattr(base, "__origin__", None) is Request and args:
                    named = args[0]
                    if isinstance(named, ForwardRef):
                        named = vars(sys.modules[klass.__module__])[named.__forward_arg__]
                    if isinstance(named, type) and issubclass(named, Reply):
                        found = named
                        break
            if found is not Reply:
                break
        _REPLY_TYPES[request] = found
    return found  # type: ignore[return-value]  # R, as the request's class names it


def register_event(cls: E) -> E:
    """Register an event type so the codec and the event log know it.

    Tags must be unique: two classes with the same tag could not be told apart on the wire.
    """
    if not (isinstance(cls, type) and issubclass(cls, Event)):
        raise TypeError(f"register_event expects a subclass of platoon.bus.Event, got {cls!r}")
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    tag = str(info.tag)  # Event sets tag=True: the class name, a str
    existing = _REGISTRY.get(tag)
    if existing is not None and existing is not cls:
        raise ValueError(
            f"event tag {tag!r} is already used by {existing.__module__}.{existing.__qualname__}"
        )
    _REGISTRY[tag] = cls
    return cls


def event_types() -> tuple[type[Event], ...]:
    """Every registered event type, built-in and from plugins."""
    return tuple(_REGISTRY.values())


# --- episodes and agents ---------------------------------------------------------------------

EpisodeStatus = Literal["completed", "limit", "timeout", "error", "cancelled"]
CallKind = Literal["policy", "aux", "judge"]


class TaskRef(msgspec.Struct, frozen=True, kw_only=True):
    """Which task of which environment entry: `env` is the entry's name in the config."""

    env: str  # the environment entry's name
    split: str  # the split the task is from (train, test, eval, ...)
    task_id: str  # the task's id within its split
    index: int | None = None  # its position in the split when listed; a hint for a fast lookup


@register_event
class EpisodeRequested(Event, frozen=True, kw_only=True):
    """The scheduler asks for one rollout of a task; exactly one runner takes it."""

    episode_id: str  # a fresh id for this rollout
    group_id: str  # the task group: the group_size rollouts of one task in one step
    task: TaskRef
    # what the episode is for: training, evaluation, or a single rollout
    purpose: Literal["train", "eval", "rollout"] = "train"
    step: int = 0  # the training step that requested it
    policy_version: int = 0  # the policy version current when it was requested
    harness: str | None = None  # the harness drawn for this rollout (from a mixture); None: the entry's
    attempt: int = 0  # how many times this episode was requested before (a lost worker's lease)
    # several policies: each one's version current when it was requested (policy_version: the oldest)
    policy_versions: dict[str, int] = msgspec.field(default_factory=dict)
    # each model call of the episode samples with a seed derived from it (None: unseeded), so a
    # run with the same seed draws the same samples
    seed: int | None = None


@register_event
class EpisodeStarted(Event, frozen=True, kw_only=True):
    episode_id: str
    group_id: str
    task: TaskRef
    root_agent_id: str  # the id of the episode's first agent
    instruction: str  # the task's instruction as the root agent got it
    worker: str = ""  # the worker that plays it (distributed runs); empty in process


@register_event
class AgentSpawned(Event, frozen=True, kw_only=True):
    """An agent of an episode's tree began: the root (no parent) or a subagent."""

    episode_id: str
    agent_id: str
    parent_id: str | None  # the agent that spawned it; None for the root
    depth: int  # 0 for the root, 1 for its children, ...
    harness: str  # the harness that plays this agent
    instruction: str  # what this agent was asked
    policy: str = "default"  # the policy that plays it (see `policies:`)


@register_event
class AgentFinished(Event, frozen=True, kw_only=True):
    episode_id: str
    agent_id: str
    status: EpisodeStatus  # how the agent's harness ended
    final_message: str | None = None  # the harness's final answer
    reason: str | None = None  # why, when it did not complete
    reward: float | None = None  # the agent's own grade, when its program grades subagents


@register_event
class ModelCallFinished(Event, frozen=True, kw_only=True):
    """One sampled completion, with the exact tokens that training will use.

    `prompt_tokens` are the ids the sampler saw, `completion_tokens` and `logprobs` the ids it
    returned with their logprobs: never a re-tokenization of text.
    """

    call_id: str  # a fresh id for the call
    episode_id: str
    agent_id: str
    prompt_tokens: list[int]  # the token ids the sampler was given
    completion_tokens: list[int]  # the token ids it sampled
    logprobs: list[float]  # one per completion token
    stop_reason: str  # stop (a stop token or sequence) or length
    policy_version: int  # the version of the policy that sampled it
    kind: CallKind = "policy"  # policy and aux calls train; judge calls never do
    completion_text: str = ""  # the decoded completion, for people reading the log
    started_at: float = 0.0  # wall-clock time (Unix seconds) the call started
    duration_s: float = 0.0  # seconds the sampler took
    # The messages of a call that came over HTTP (a command-line agent), for people reading the
    # log; an in-process call's are in its `ChatRequested`.
    messages: list[ChatMessage] | None = None
    policy: str = "default"  # the policy that sampled it (see `policies:`)
    # What is wrong with the reply's tool calls, one line each (a call kept as text, a call to a
    # tool not declared, arguments that do not fit): an HTTP agent's reply carries no such field.
    parse_errors: list[str] = msgspec.field(default_factory=list)


@register_event
class ToolCalled(Request["ToolReturned"], frozen=True, kw_only=True):
    """An agent calls one of its environment's tools; the env session replies `ToolReturned`."""

    episode_id: str
    agent_id: str
    env: str
    name: str
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)


@register_event
class ToolReturned(Reply, frozen=True, kw_only=True):
    """A tool call's answer. `env_fault`: the environment failed (the tool raised, timed out or
    answered garbage), not the agent; such an episode ends as an error, never as a reward."""

    episode_id: str
    agent_id: str
    name: str
    output: str = ""
    reward: float | None = None
    finished: bool = False
    duration_s: float = 0.0
    env_fault: bool = False


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One tool of an environment session, with its JSON schema."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object", "properties": {}})
    terminal: bool = False


ForkMode = Literal["fresh", "copy", "shared"]


@register_event
class SessionOpenRequested(Request["SessionOpened"], frozen=True, kw_only=True):
    """Open an env session for an agent. A subagent's session forks its parent's (`fork_of`)."""

    episode_id: str
    agent_id: str
    task: TaskRef
    fork_of: str | None = None
    fork: ForkMode = "fresh"
    instruction: str | None = None


@register_event
class SessionOpened(Reply, frozen=True, kw_only=True):
    instruction: str = ""
    tools: list[ToolSpec] = msgspec.field(default_factory=list)
    steps: int = 1  # a multi-step task's steps: the agent plays each in turn (`StepRequested`)


@register_event
class StepRequested(Request["StepStarted"], frozen=True, kw_only=True):
    """An agent finished a step of a multi-step task: verify it and begin the next."""

    episode_id: str
    agent_id: str
    env: str


@register_event
class StepStarted(Reply, frozen=True, kw_only=True):
    """The next step's instruction, or None when the task is over (its last step was played,
    or a step's result ended it)."""

    instruction: str | None = None


@register_event
class AgentProcessRequested(Request["AgentProcessExited"], frozen=True, kw_only=True):
    """Run a command-line agent inside the agent's env session sandbox (see `platoon.sandbox.agent`).

    `payload` is JSON `{"argv", "env", "files"}`: it holds the agent's gateway key, so the event
    log writes it redacted. `forwards` map ports inside the sandbox to host endpoints (`host:port`);
    `toolchain` and `spec_dir` are host folders mounted read-only at `/opt/platoon/toolchain` and
    `/opt/platoon/spec`.
    """

    secret_fields: ClassVar[tuple[str, ...]] = ("payload",)

    episode_id: str
    agent_id: str
    env: str
    payload: str
    forwards: dict[int, str] = msgspec.field(default_factory=dict)
    toolchain: str | None = None
    spec_dir: str | None = None
    timeout: float | None = None
    output_cap: int = 65_536
    # the toolchain's Python installation, when it lives outside the sandbox's base: mounted
    # read-only at its own path (see `platoon.harness.toolchain`)
    interpreter: str | None = None


@register_event
class AgentProcessExited(Reply, frozen=True, kw_only=True):
    """How the agent process ended: `return_code` None means it never ran (`error` says why;
    `unsupported` when the env session has no sandbox to run it in). Output is the capped tail."""

    return_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    timed_out: bool = False
    # the task's own agent time limit stopped it (Harbor's `agent.timeout_sec`), not the agent's:
    # what it left in the sandbox is graded, as Harbor's runner grades it
    task_limit: bool = False
    unsupported: bool = False
    duration_s: float = 0.0


@register_event
class GradeRequested(Request["Graded"], frozen=True, kw_only=True):
    """Ask the env service for an agent's session grade (the root's grades the episode)."""

    episode_id: str
    agent_id: str
    env: str
    with_task: bool = False  # also answer the task's spec (for reward rules that read it)
    files: list[str] = msgspec.field(default_factory=list)  # sandbox files to read before grading (judges)


@register_event
class Graded(Reply, frozen=True, kw_only=True):
    """`reward is None` with a `reason` when the session cannot be graded."""

    reward: float | None = None
    rewards: dict[str, float] = msgspec.field(default_factory=dict)
    reason: str | None = None
    task: dict[str, Any] | None = None  # the task's spec, when the request asked `with_task`
    # the files the request named, as text (cut at 64 KiB), read before the grade; a file that
    # could not be read holds why, in brackets
    files: dict[str, str] = msgspec.field(default_factory=dict)


@register_event
class TasksRequested(Request["TasksListed"], frozen=True, kw_only=True):
    env: str
    split: str


@register_event
class TasksListed(Reply, frozen=True, kw_only=True):
    tasks: list[TaskRef] = msgspec.field(default_factory=list)


@register_event
class AgentOpenRequested(Request["AgentOpened"], frozen=True, kw_only=True):
    """Ask the gateway to admit an agent: it answers with the agent's own key.

    Agents that share a `budget_id` draw on one budget of model calls and tokens; the first
    request for a `budget_id` sets its limits (None: no limit).
    """

    episode_id: str
    agent_id: str
    parent_id: str | None = None
    depth: int = 0
    budget_id: str = ""
    max_model_calls: int | None = None
    max_tokens: int | None = None
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    policy_version: int = 0  # the oldest policy the agent may sample: its episode's
    policy: str = "default"  # the policy that plays it, chosen by the runner from the config
    role: str = ""  # the role its program gave it, if any (how `by: role` chose the policy)
    # its calls' sampling seeds derive from it; None: a subagent's derives from its parent's
    seed: int | None = None
    # the agent checks its tool calls itself (its harness's `checks_tool_calls`): calls the tools'
    # schemas do not fit reach it as calls, for it to answer, instead of staying text
    checks_tool_calls: bool = False


@register_event
class AgentOpened(Reply, frozen=True, kw_only=True):
    """`key` authenticates the agent's HTTP calls; `base_url` is the gateway's `/v1` root.

    The key is a secret: the event log writes it redacted (`secret_fields`).
    """

    secret_fields: ClassVar[tuple[str, ...]] = ("key",)

    key: str = ""
    base_url: str | None = None
    policy: str = "default"  # the policy the gateway samples for this agent


@register_event
class ChatRequested(Request["ChatReplied"], frozen=True, kw_only=True):
    """A function harness's `ctx.chat`: OpenAI-style messages for the gateway to sample."""

    episode_id: str
    agent_id: str
    messages: list[ChatMessage]
    tools: list[dict[str, Any]] | None = None  # the JSON the harness sent: see `platoon.bus.chat`
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    kind: CallKind = "policy"


@register_event
class ChatReplied(Reply, frozen=True, kw_only=True):
    """The parsed assistant message and the id of the `ModelCallFinished` that recorded it."""

    message: SampledMessage = msgspec.field(default_factory=SampledMessage)
    call_id: str = ""
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    parse_errors: list[str] = msgspec.field(default_factory=list)
    error_kind: Literal["budget", "context_length", "bad_request", "auth", "sampler"] | None = None
    budget_remaining: int | None = None


@register_event
class ModelCallFailed(Event, frozen=True, kw_only=True):
    """The policy's sampler could not answer an agent's model call (it raised, or the policy
    version the episode asked for never came). A failure of the system, not of the policy: the
    episode ends as an error and is never graded, whatever its harness made of the failure."""

    episode_id: str
    agent_id: str
    error: str
    policy: str = "default"


@register_event
class EpisodeFinished(Event, frozen=True, kw_only=True):
    """The harness of an episode's root agent ended; `reason` says why when it did not complete."""

    episode_id: str
    group_id: str
    task: TaskRef
    status: EpisodeStatus  # completed, limit (out of budget), timeout, error or cancelled
    reason: str | None = None
    final_message: str | None = None  # the root agent's final answer
    root_agent_id: str = ""  # the id of the episode's first agent
    num_model_calls: int = 0  # the root agent's own; its subagents' are in their ModelCallFinished
    duration_s: float = 0.0  # wall-clock seconds of the episode
    purpose: Literal["train", "eval", "rollout"] = "train"
    step: int = 0
    policy_version: int = 0


@register_event
class EpisodeGraded(Event, frozen=True, kw_only=True):
    """The grade of an episode. `reward is None` means it cannot train (an infrastructure
    failure is never a reward of 0); `reason` then says why."""

    episode_id: str
    group_id: str
    task: TaskRef
    reward: float | None  # the reward that trains; None: not graded (see reason)
    # named components the environment reported (and `processed`)
    rewards: dict[str, float] = msgspec.field(default_factory=dict)
    # each subagent's own grade, by agent id
    agent_rewards: dict[str, float] = msgspec.field(default_factory=dict)
    # rewards that arrived mid-episode (tool results), by agent id: one sum per model call of the
    # agent (judge calls not counted), for the rewards that came after that call and before the next
    turn_rewards: dict[str, list[float]] = msgspec.field(default_factory=dict)
    # explanations of reward parts, by part name: a judge's reasoning
    notes: dict[str, str] = msgspec.field(default_factory=dict)
    status: EpisodeStatus = "completed"  # the episode's status when it finished
    reason: str | None = None
    purpose: Literal["train", "eval", "rollout"] = "train"
    step: int = 0
    policy_version: int = 0


@register_event
class GroupCompleted(Event, frozen=True, kw_only=True):
    """All rollouts of one task group are in (or the straggler timeout closed it)."""

    group_id: str
    step: int
    episode_ids: list[str]  # the rollouts of the group
    rewards: list[float | None]  # their rewards, in the same order; None: not graded
    purpose: Literal["train", "eval", "rollout"] = "train"


# --- training ---------------------------------------------------------------------------------


class Datum(msgspec.Struct, frozen=True, kw_only=True):
    """One training sequence in Tinker's layout, and where it came from.

    For the full token sequence `s`: `model_input = s[:-1]`, `target_tokens = s[1:]`;
    `logprobs`, `advantages` and `weights` are aligned with the targets and zero where the
    token was not sampled. `policy_version` is the oldest version among the merged calls, so
    staleness is never underestimated.
    """

    model_input: list[int]  # s[:-1] of the token sequence s
    target_tokens: list[int]  # s[1:]
    logprobs: list[float]  # the sampler's logprobs of the targets; 0 where not sampled
    advantages: list[float]  # per target token; 0 on prompts and tool results
    weights: list[float]  # 1 where the target was sampled, else 0
    episode_id: str = ""  # the episode it came from
    group_id: str = ""  # its task group
    agent_id: str = ""  # the agent whose calls it holds
    depth: int = 0  # that agent's depth in the tree
    policy_version: int = 0
    num_trained_tokens: int = 0  # targets with a nonzero weight

    def __post_init__(self) -> None:
        n = len(self.model_input)
        lengths = (len(self.target_tokens), len(self.logprobs), len(self.advantages), len(self.weights))
        if any(length != n for length in lengths):
            raise ValueError(
                f"datum arrays differ in length: model_input {n}, target_tokens/logprobs/"
                f"advantages/weights {'/'.join(map(str, lengths))}"
            )


@register_event
class BatchReady(Event, frozen=True, kw_only=True):
    step: int  # the training step these datums are for
    datums: list[Datum]  # the training sequences of the step's complete groups
    # credit statistics (by depth, dropped groups, ...)
    stats: dict[str, float] = msgspec.field(default_factory=dict)
    policy: str = "default"  # the policy these datums train


@register_event
class DatumsScored(Event, frozen=True, kw_only=True):
    """The trainer's own logprob of every target of a step's datums (its `forward_backward`,
    before the step's update), one row per datum of the step's `BatchReady` in its order (empty
    for one it did not train, a stale one): set against the sampler's recorded logprobs, where
    the two disagree, token by token."""

    step: int
    policy: str = "default"
    logprobs: list[list[float]] = msgspec.field(default_factory=list)


def step_number(step: int, purpose: str = "train") -> int:
    """The step a user reads for an event's `step`, the one convention of everything shown.

    Events count training steps from 0 (`BatchReady`, `TrainStepFinished`, `CheckpointSaved`
    and a training episode's `step` are the step's index). What a user reads (the terminal,
    metrics.jsonl, checkpoints.jsonl, logs, the viewer) counts from 1: step N is the Nth
    optimizer step. An evaluation's step (`EvalRequested`, `EvalFinished`, an eval episode's)
    is already the number of steps trained before it, so an eval at step N evaluates the policy
    step N made, and step 0 is the base model."""
    return step + 1 if purpose == "train" else step


@register_event
class TrainStepFinished(Event, frozen=True, kw_only=True):
    step: int  # the index of the step that finished, from 0 (users read `step_number`)
    metrics: dict[str, float]  # the step's metrics, as written to metrics.jsonl


@register_event
class PolicyStepFinished(Event, frozen=True, kw_only=True):
    """One policy of a several-policy run trained its batch of a step. Once every trained
    policy has, the step's one `TrainStepFinished` follows with all their metrics."""

    step: int
    policy: str
    metrics: dict[str, float]  # its metrics, each key prefixed with the policy's name


@register_event
class PolicyUpdated(Event, frozen=True, kw_only=True):
    """New sampler weights: samplers switch to `sampler_path` (a `tinker://` path) at `version`."""

    version: int  # the new policy version (one per optimizer step)
    sampler_path: str  # a tinker:// path to the sampler weights
    base_model: str = ""  # the model the weights are an adapter of
    base_url: str | None = None  # the training service that holds them; None: hosted Tinker
    policy: str = "default"  # the policy whose weights these are


@register_event
class CheckpointSaved(Event, frozen=True, kw_only=True):
    step: int  # the step the checkpoint was taken after
    state_path: str  # weights and optimizer state, to resume from
    sampler_path: str  # the sampler weights of the same step
    policy_version: int  # the policy version at that step
    task_cursor: int = 0  # how far through the training tasks the run was
    policy: str = "default"  # the policy whose state this is


@register_event
class EvalRequested(Request["Evaluated"], frozen=True, kw_only=True):
    """Ask the evaluator for an evaluation at `step` (the scheduler's, every `eval.every` steps)."""

    step: int  # the training step the evaluation is taken at
    policy_version: int = 0  # the policy version current when it was asked for


@register_event
class Evaluated(Reply, frozen=True, kw_only=True):
    """The evaluation is done and its report written (None: there were no tasks to evaluate)."""

    step: int
    report_path: str | None = None


@register_event
class EvalFinished(Event, frozen=True, kw_only=True):
    step: int  # the training step the evaluation was taken at
    metrics: dict[str, float]  # eval/... metrics of the report


# --- the run and its infrastructure -----------------------------------------------------------


@register_event
class ComponentFailed(Event, frozen=True, kw_only=True):
    """A handler or component raised. The bus and the other subscribers carry on."""

    component: str
    error: str
    event_type: str | None = None
    traceback: str = ""


@register_event
class RunFinished(Event, frozen=True, kw_only=True):
    status: Literal["completed", "failed", "cancelled"]  # how the run ended
    reason: str | None = None  # why, when it did not complete


@register_event
class BridgeDisconnected(Event, frozen=True, kw_only=True):
    url: str
    reason: str = ""


@register_event
class BridgeReconnected(Event, frozen=True, kw_only=True):
    url: str
    buffered: int = 0


@register_event
class WorkClaimed(Event, frozen=True, kw_only=True):
    """A consumer claimed work (an episode's request) that this bus's NATS bridge offered.

    Published by the offering bridge itself, once the claim proved it holds the offer; never
    carried over NATS, so no peer can forge it. The trainer's lease of the episode starts here:
    before a claim an episode waits in the offer protocol, not in a worker."""

    episode_id: str
    attempt: int = 0


# --- rollout workers over NATS (platoon.train.distributed) ------------------------------------


@register_event
class PolicyAnnounced(Event, frozen=True, kw_only=True):
    """The trainer's current policy, re-sent periodically so that late workers learn it.

    `trainer` changes when a new trainer process starts, so a worker accepts its version
    numbers even if they are lower than the last trainer's. An empty `sampler_path` means
    the base model."""

    trainer: str
    version: int
    sampler_path: str = ""
    base_model: str = ""
    base_url: str | None = None
    identity: dict[str, str] = msgspec.field(
        default_factory=dict
    )  # what shapes episodes, see worker_identity
    name: str = "default"  # the policy the fields above describe (the run's first)
    # several policies (RFC 0001): every other policy of the run, each named by its `policy`.
    # One announcement carries them all, so the one a late worker reads from the run's state
    # tells it every policy at once.
    others: list[PolicyUpdated] = msgspec.field(default_factory=list)

    def policy(self) -> PolicyUpdated:
        return PolicyUpdated(
            version=self.version,
            sampler_path=self.sampler_path,
            base_model=self.base_model,
            base_url=self.base_url,
            policy=self.name,
        )

    def policies(self) -> dict[str, PolicyUpdated]:
        """Every policy announced, by name, the first one first."""
        return {self.name: self.policy(), **{p.policy: p for p in self.others}}


@register_event
class EpisodeSealed(Event, frozen=True, kw_only=True):
    """A worker sent every result of an episode: these counts, then its grade."""

    episode_id: str
    group_id: str
    worker: str = ""
    calls: int = 0
    agents: int = 0
    agents_finished: int = 0


@register_event
class EpisodeAbandoned(Event, frozen=True, kw_only=True):
    """The trainer stopped waiting for an episode; `replaced_by` is its new id, or None if
    the lease keeper gave up after `attempt + 1` tries (the episode then counts as failed)."""

    episode_id: str
    group_id: str
    task: TaskRef
    purpose: Literal["train", "eval", "rollout"] = "train"
    step: int = 0
    attempt: int = 0
    replaced_by: str | None = None
    reason: str = ""


@register_event
class WorkerStatus(Event, frozen=True, kw_only=True):
    """A worker's heartbeat, sent once it takes work and every `nats.announce_every` s; or,
    once, with `refused` saying why it takes no work from this trainer."""

    worker: str
    in_flight: int = 0
    episodes: int = 0  # sealed since it started
    policy_version: int | None = None
    refused: str | None = None

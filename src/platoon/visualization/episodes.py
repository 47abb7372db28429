"""An episode's events as the page shows them: the agent tree, each agent's turns, and a model
call's sampled tokens next to the datum values they trained on.

Pure functions over events, so that they test without a server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NotRequired, Protocol, TypedDict

import msgspec

from platoon.bus.eventlog import Record
from platoon.bus.events import (
    AgentFinished,
    AgentProcessExited,
    AgentProcessRequested,
    AgentSpawned,
    ChatReplied,
    ChatRequested,
    Datum,
    EpisodeAbandoned,
    EpisodeFinished,
    EpisodeGraded,
    EpisodeRequested,
    EpisodeStarted,
    Event,
    Graded,
    GradeRequested,
    ModelCallFinished,
    SessionOpened,
    SessionOpenRequested,
    ToolCalled,
    ToolReturned,
)
from platoon.visualization.index import EpisodeRow, StoredDatum

__all__ = ["AgentView", "Decoder", "EpisodeView", "call_tokens", "episode_view", "locate_in_datum"]

_MAX_TEXT = 200_000  # characters of one tool output or message shown; the rest is cut, saying so


def _cut(text: str | None) -> str | None:
    if text is None or len(text) <= _MAX_TEXT:
        return text
    return text[:_MAX_TEXT] + f"\n... [{len(text) - _MAX_TEXT} more characters]"


class Decoder(Protocol):
    """What the page asks of a tokenizer (a `tokenizers` one, a `transformers` one): ids to text."""

    def decode(self, ids: list[int], /, *, skip_special_tokens: bool = ...) -> str: ...


class Fork(TypedDict):
    of: str  # the session forked
    mode: str


class AgentView(TypedDict):
    """An agent of the episode's tree, with its turns (`items`) in order."""

    agent_id: str
    parent_id: str | None
    depth: int
    harness: str | None
    policy: str | None
    instruction: str | None
    status: str | None
    reason: str | None
    final_message: str | None
    reward: float | None
    fork: Fork | None
    items: list[dict[str, object]]  # model calls, tool calls, sessions, processes, grades
    children: list[str]
    started: NotRequired[float]
    finished: NotRequired[float]


class EpisodeView(TypedDict):
    """The episode page's data: its row, its events as plain data (each with its `time`), the
    agents in the order they appeared and the roots of their tree."""

    episode: EpisodeRow | None
    requested: dict[str, object] | None
    started: dict[str, object] | None
    finished: dict[str, object] | None
    graded: dict[str, object] | None
    abandoned: list[dict[str, object]]
    agents: list[AgentView]
    roots: list[str]


def _plain(event: Event) -> dict[str, object]:
    plain: dict[str, object] = msgspec.to_builtins(event)
    return plain


def episode_view(row: EpisodeRow | None, records: Sequence[Record]) -> EpisodeView:
    """The episode page's data: its row, the agent tree with each agent's turns in order."""
    agents: dict[str, AgentView] = {}
    order: list[str] = []
    chats: dict[str, dict[str, object]] = {}  # request_id -> model call item
    by_call: dict[str, dict[str, object]] = {}  # call_id -> model call item
    tools: dict[str, dict[str, object]] = {}
    sessions: dict[str, dict[str, object]] = {}
    processes: dict[str, dict[str, object]] = {}
    grades: dict[str, dict[str, object]] = {}
    item: dict[str, object] | None
    previous_tokens: dict[str, list[int]] = {}  # per agent: the last prompt + completion
    out: EpisodeView = {
        "episode": row,
        "requested": None,
        "started": None,
        "finished": None,
        "graded": None,
        "abandoned": [],
        "agents": [],
        "roots": [],
    }
    graded: EpisodeGraded | None = None

    def agent(agent_id: str) -> AgentView:
        if agent_id not in agents:
            agents[agent_id] = {
                "agent_id": agent_id,
                "parent_id": None,
                "depth": 0,
                "harness": None,
                "policy": None,
                "instruction": None,
                "status": None,
                "reason": None,
                "final_message": None,
                "reward": None,
                "fork": None,
                "items": [],
                "children": [],
            }
            order.append(agent_id)
        return agents[agent_id]

    for record in records:
        event, at = record.event, record.time
        if isinstance(event, EpisodeRequested):
            out["requested"] = _plain(event) | {"time": at}
        elif isinstance(event, EpisodeStarted):
            out["started"] = _plain(event) | {"time": at}
        elif isinstance(event, AgentSpawned):
            a = agent(event.agent_id)
            a.update({"parent_id": event.parent_id, "depth": event.depth, "harness": event.harness})
            a.update({"policy": event.policy, "instruction": _cut(event.instruction), "started": at})
        elif isinstance(event, AgentFinished):
            a = agent(event.agent_id)
            a.update(
                {"status": event.status, "reason": event.reason, "final_message": _cut(event.final_message)}
            )
            a.update({"reward": event.reward, "finished": at})
        elif isinstance(event, SessionOpenRequested):
            item = {"kind": "session", "time": at, "fork_of": event.fork_of, "fork": event.fork}
            agent(event.agent_id)["items"].append(item)
            if event.fork_of:
                agent(event.agent_id)["fork"] = {"of": event.fork_of, "mode": event.fork}
            sessions[event.request_id] = item
        elif isinstance(event, SessionOpened):
            item = sessions.get(event.reply_to)
            if item is not None:
                item.update(instruction=_cut(event.instruction), error=event.error)
                item["tools"] = [{"name": t.name, "description": t.description} for t in event.tools]
        elif isinstance(event, ChatRequested):
            item = {
                "kind": "model_call",
                "time": at,
                "messages": [_message(m) for m in event.messages],
                "tools": [t.get("function", t).get("name") for t in event.tools or [] if isinstance(t, dict)],
                "call_kind": event.kind,
                "call_id": None,
            }
            agent(event.agent_id)["items"].append(item)
            chats[event.request_id] = item
        elif isinstance(event, ModelCallFinished):
            item = _pending_chat(agents.get(event.agent_id))
            if item is None:  # a call over HTTP: its messages, if any, came with it
                messages = [_message(m) for m in event.messages] if event.messages is not None else None
                item = {"kind": "model_call", "time": at, "messages": messages, "call_kind": event.kind}
                agent(event.agent_id)["items"].append(item)
            prompt, completion = event.prompt_tokens, event.completion_tokens
            before = previous_tokens.get(event.agent_id)
            item.update(
                call_id=event.call_id,
                prompt_tokens=len(prompt),
                completion_tokens=len(completion),
                completion_text=_cut(event.completion_text),
                stop_reason=event.stop_reason,
                policy_version=event.policy_version,
                duration_s=event.duration_s,
                parse_errors=list(event.parse_errors),
                logprob_mean=(sum(event.logprobs) / len(event.logprobs)) if event.logprobs else None,
                # The prompt does not extend the last call's tokens: a new datum (compaction,
                # truncation, a re-rendered history).
                context_reset=before is not None and prompt[: len(before)] != before,
            )
            previous_tokens[event.agent_id] = [*prompt, *completion]
            by_call[event.call_id] = item
        elif isinstance(event, ChatReplied):
            item = chats.get(event.reply_to)
            if item is None:
                continue
            item.update(reply=_message(event.message), finish_reason=event.finish_reason)
            item.update(parse_errors=list(event.parse_errors), error=event.error, error_kind=event.error_kind)
            if event.call_id and item.get("call_id") is None:
                item["call_id"] = event.call_id
        elif isinstance(event, ToolCalled):
            item = {
                "kind": "tool",
                "time": at,
                "name": event.name,
                "arguments": event.arguments,
                "env": event.env,
            }
            agent(event.agent_id)["items"].append(item)
            tools[event.request_id] = item
        elif isinstance(event, ToolReturned):
            item = tools.get(event.reply_to)
            if item is None:
                item = {"kind": "tool", "time": at, "name": event.name, "arguments": None}
                agent(event.agent_id)["items"].append(item)
            item.update(
                output=_cut(event.output),
                reward=event.reward,
                finished=event.finished,
                env_fault=event.env_fault,
                error=event.error,
                duration_s=event.duration_s,
            )
        elif isinstance(event, AgentProcessRequested):
            item = {"kind": "process", "time": at, "env": event.env, "timeout": event.timeout}
            agent(event.agent_id)["items"].append(item)
            processes[event.request_id] = item
        elif isinstance(event, AgentProcessExited):
            item = processes.get(event.reply_to)
            if item is not None:
                item.update(
                    return_code=event.return_code,
                    stdout=_cut(event.stdout),
                    stderr=_cut(event.stderr),
                    stdout_bytes=event.stdout_bytes,
                    stderr_bytes=event.stderr_bytes,
                    timed_out=event.timed_out,
                    unsupported=event.unsupported,
                    error=event.error,
                    duration_s=event.duration_s,
                )
        elif isinstance(event, GradeRequested):
            item = {"kind": "grade", "time": at, "env": event.env}
            agent(event.agent_id)["items"].append(item)
            grades[event.request_id] = item
        elif isinstance(event, Graded):
            item = grades.get(event.reply_to)
            if item is not None:
                item.update(
                    reward=event.reward, rewards=event.rewards, reason=event.reason, error=event.error
                )
        elif isinstance(event, EpisodeFinished):
            out["finished"] = _plain(event) | {"time": at}
        elif isinstance(event, EpisodeGraded):
            out["graded"] = _plain(event) | {"time": at}
            graded = event
        elif isinstance(event, EpisodeAbandoned):
            out["abandoned"].append(_plain(event) | {"time": at})
    for a in agents.values():
        a["items"] = [{k: v for k, v in item.items() if not k.startswith("_")} for item in a["items"]]
        parent = agents.get(a["parent_id"]) if a["parent_id"] else None
        if parent is not None:
            parent["children"].append(a["agent_id"])
    for agent_id, reward in (graded.agent_rewards if graded is not None else {}).items():
        if agent_id in agents and agents[agent_id]["reward"] is None:
            agents[agent_id]["reward"] = reward
    roots = [a for a in order if not agents[a]["parent_id"] or agents[a]["parent_id"] not in agents]
    out["agents"] = [agents[a] for a in order]
    out["roots"] = roots
    return out


def _pending_chat(agent: AgentView | None) -> dict[str, object] | None:
    """The agent's model call asked over the bus (`ChatRequested`) whose tokens have not come:
    the `ModelCallFinished` that follows is its record."""
    if agent is None:
        return None
    for item in reversed(agent["items"]):
        if item["kind"] == "model_call" and "prompt_tokens" not in item and item.get("messages") is not None:
            return item
    return None


def _message(message: Mapping[str, object]) -> dict[str, object]:
    """An OpenAI-style message, its content as text (parts joined) for the page."""
    out = dict(message)
    content = out.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(str(part.get("text", part.get("type", ""))))
            else:
                parts.append(str(part))
        out["content"] = "".join(parts)
    if isinstance(text := out.get("content"), str):
        out["content"] = _cut(text)
    return out


def locate_in_datum(
    prompt: Sequence[int], completion: Sequence[int], datums: Sequence[Datum]
) -> tuple[int, int] | None:
    """(which datum, at which target position) holds this call's completion, or None.

    A datum's sequence is `model_input + [last target]`; the call is in it when the sequence
    starts with the call's prompt followed by its completion, and then completion token `j`
    is target position `len(prompt) + j - 1` (prefix merging keeps a call's prompt as a prefix).
    """
    n, m = len(prompt), len(completion)
    for i, datum in enumerate(datums):
        length = len(datum.model_input) + 1
        if length < n + m:
            continue
        if datum.model_input[:n] != list(prompt):
            continue
        if n == 0:  # s[0] is the first input, s[k] = target[k - 1] after it
            sequence_tail = [*datum.model_input[:1], *datum.target_tokens[: m - 1]] if m else []
        else:
            sequence_tail = datum.target_tokens[n - 1 : n - 1 + m]
        if sequence_tail == list(completion):
            return i, n - 1
    return None


def call_tokens(
    call: ModelCallFinished,
    datums: Sequence[StoredDatum],
    tokenizer: Decoder | None = None,
    *,
    normalization: str | None = None,
) -> dict[str, object]:
    """A model call's sampled tokens, each with its sampler logprob and, when it trained, the
    datum's logprob, weight and advantage at its position and the trainer's own logprob of it
    (`trainer_logprob`, where the trainer reported one: `DatumsScored`); the prompt as ids and text.

    A datum holds the advantage as the loss used it: the rollout's advantage times its depth's
    weight and, under `normalization` `token_mean` (the run's `train.loss_normalization`),
    divided by the trained tokens of the step's batch. Each token shows the rollout's advantage
    (`advantage`) and the value trained (`trained_advantage`); the datum says what scaled it."""
    agent_datums = [stored for stored in datums if stored.datum.agent_id == call.agent_id]
    found = locate_in_datum(call.prompt_tokens, call.completion_tokens, [s.datum for s in agent_datums])
    stored = agent_datums[found[0]] if found else None
    datum = stored.datum if stored is not None else None
    scale = _advantage_scale(stored, normalization) if stored is not None else 1.0
    tokens = []
    for j, token in enumerate(call.completion_tokens):
        entry: dict[str, object] = {
            "id": token,
            "logprob": call.logprobs[j] if j < len(call.logprobs) else None,
        }
        if datum is not None and found is not None:
            position = found[1] + j
            if position >= 0:
                entry.update(
                    position=position,
                    weight=datum.weights[position],
                    advantage=datum.advantages[position] / scale,
                    trained_advantage=datum.advantages[position],
                    datum_logprob=datum.logprobs[position],
                )
                scored = stored.scored if stored is not None else None
                if scored is not None and position < len(scored) and datum.weights[position]:
                    # the trainer's logprob of the token, before the step's update
                    entry["trainer_logprob"] = scored[position]
            else:  # the first token of a sequence is never a target
                entry.update(
                    position=None, weight=0.0, advantage=0.0, trained_advantage=0.0, datum_logprob=None
                )
        tokens.append(entry)
    texts = _decode_each(tokenizer, call.completion_tokens)
    for entry, text in zip(tokens, texts, strict=False):
        entry["text"] = text
    out: dict[str, object] = {
        "call_id": call.call_id,
        "agent_id": call.agent_id,
        "episode_id": call.episode_id,
        "kind": call.kind,
        "stop_reason": call.stop_reason,
        "policy_version": call.policy_version,
        "prompt_ids": list(call.prompt_tokens),
        "prompt_text": _decode(tokenizer, call.prompt_tokens),
        "completion_text": call.completion_text,
        "tokens": tokens,
        "trained_tokens": sum(1 for t in tokens if t.get("weight")),
        "datum": None,
    }
    if stored is not None and found is not None:
        d = stored.datum
        trained = sorted({a for a, w in zip(d.advantages, d.weights, strict=True) if w})
        out["datum"] = {
            "step": stored.step,
            "index": found[0],
            "length": len(d.model_input),
            "num_trained_tokens": d.num_trained_tokens,
            "policy_version": d.policy_version,
            "depth": d.depth,
            "advantages": [a / scale for a in trained],  # the rollout's (per turn: each turn's)
            "trained_advantages": trained,
            "normalization": normalization,  # None: the run's config does not say
            "batch_tokens": stored.batch_tokens,
            "depth_weight": stored.depth_weight,
            "scale": scale,
            "offset": found[1],
        }
    else:
        out["untrained_reason"] = (
            "no datum of this run holds this call: it was not trained on (an eval or rollout episode, "
            "a group dropped as constant or stale, a judge call, or a step not yet trained)"
            if call.kind != "judge"
            else "a judge call: never trained on"
        )
    return out


def _advantage_scale(stored: StoredDatum, normalization: str | None) -> float:
    """What credit multiplied the rollout's advantage by to make the datum's (never 0)."""
    scale = stored.depth_weight
    if normalization == "token_mean" and stored.batch_tokens:
        scale /= stored.batch_tokens
    return scale or 1.0


def _decode(tokenizer: Decoder | None, ids: Sequence[int]) -> str | None:
    if tokenizer is None:
        return None
    try:
        return tokenizer.decode(list(ids), skip_special_tokens=False)
    except Exception:
        return None


def _decode_each(tokenizer: Decoder | None, ids: Sequence[int]) -> list[str | None]:
    if tokenizer is None:
        return [None] * len(ids)
    try:
        return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]
    except Exception:
        return [None] * len(ids)

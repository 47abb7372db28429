"""An episode's events as the page shows them: the agent tree, each agent's turns, and a model
call's sampled tokens next to the datum values they trained on.

Pure functions over events, so that they test without a server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NotRequired, Protocol, TypedDict

import msgspec

from platoon.bus.chat import message_dict
from platoon.bus.episodes import (
    AgentLog,
    EpisodeLog,
    GradeTurn,
    ModelTurn,
    ProcessTurn,
    SessionTurn,
    Stamped,
    ToolTurn,
)
from platoon.bus.eventlog import Record
from platoon.bus.events import ChatReplied, Datum, Event, ModelCallFinished
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


def _plain(stamped: Stamped[Event] | None) -> dict[str, object] | None:
    if stamped is None:
        return None
    plain: dict[str, object] = msgspec.to_builtins(stamped.event)
    return plain | {"time": stamped.time}


def episode_view(row: EpisodeRow | None, records: Sequence[Record]) -> EpisodeView:
    """The episode page's data: its row, the agent tree with each agent's turns in order."""
    log = EpisodeLog(row["episode_id"] if row else "")
    for record in records:
        log.add(record.event, record.time)
    graded = log.grades[-1] if log.grades else None
    agents = [_agent_view(log, agent) for agent in log.agents.values()]
    for agent_id, reward in (graded.event.agent_rewards if graded is not None else {}).items():
        for view in agents:
            if view["agent_id"] == agent_id and view["reward"] is None:
                view["reward"] = reward
    return {
        "episode": row,
        "requested": _plain(log.requested),
        "started": _plain(log.started),
        "finished": _plain(log.finished),
        "graded": _plain(graded),
        "abandoned": [p for p in map(_plain, log.abandoned) if p is not None],
        "agents": agents,
        "roots": [
            a.agent_id for a in log.agents.values() if not a.parent_id or a.parent_id not in log.agents
        ],
    }


def _agent_view(log: EpisodeLog, agent: AgentLog) -> AgentView:
    spawned = agent.spawned.event if agent.spawned is not None else None
    end = agent.finished.event if agent.finished is not None else None
    forks = [t.request for t in agent.turns if isinstance(t, SessionTurn) and t.request.fork_of]
    view: AgentView = {
        "agent_id": agent.agent_id,
        "parent_id": spawned.parent_id if spawned else None,
        "depth": spawned.depth if spawned else 0,
        "harness": spawned.harness if spawned else None,
        "policy": spawned.policy if spawned else None,
        "instruction": _cut(spawned.instruction) if spawned else None,
        "status": end.status if end else None,
        "reason": end.reason if end else None,
        "final_message": _cut(end.final_message) if end else None,
        "reward": end.reward if end else None,
        "fork": {"of": forks[-1].fork_of or "", "mode": forks[-1].fork} if forks else None,
        "items": _items(agent),
        "children": log.children_of(agent.agent_id),
    }
    if agent.spawned is not None:
        view["started"] = agent.spawned.time
    if agent.finished is not None:
        view["finished"] = agent.finished.time
    return view


def _items(agent: AgentLog) -> list[dict[str, object]]:
    """The agent's turns as the page lists them; a model call's `context_reset` says its prompt
    does not extend the agent's last call's tokens (a new datum: compaction, truncation, a
    re-rendered history)."""
    items: list[dict[str, object]] = []
    before: list[int] | None = None
    resets: dict[int, bool] = {}
    for call in agent.calls():
        resets[id(call)] = before is not None and call.prompt_tokens[: len(before)] != before
        before = [*call.prompt_tokens, *call.completion_tokens]
    for turn in agent.turns:
        match turn:
            case SessionTurn():
                items.append(_session_item(turn))
            case ModelTurn():
                items.append(_model_item(turn, resets))
            case ToolTurn():
                items.append(_tool_item(turn))
            case ProcessTurn():
                items.append(_process_item(turn))
            case GradeTurn():
                item: dict[str, object] = {"kind": "grade", "time": turn.time, "env": turn.request.env}
                if (graded := turn.reply) is not None:
                    item.update(reward=graded.reward, rewards=graded.rewards, reason=graded.reason)
                    item["error"] = graded.error
                items.append(item)
    return items


def _session_item(turn: SessionTurn) -> dict[str, object]:
    asked, opened = turn.request, turn.reply
    item: dict[str, object] = {
        "kind": "session",
        "time": turn.time,
        "fork_of": asked.fork_of,
        "fork": asked.fork,
    }
    if opened is not None:
        item.update(instruction=_cut(opened.instruction), error=opened.error)
        item["tools"] = [{"name": t.name, "description": t.description} for t in opened.tools]
    return item


def _model_item(turn: ModelTurn, resets: dict[int, bool]) -> dict[str, object]:
    """A model call asked over the bus (its messages and tools as asked, then its record and its
    reply in the order they came) or over HTTP (its messages, if any, came with its record)."""
    item: dict[str, object] = {"kind": "model_call", "time": turn.time}
    if (asked := turn.request) is not None:
        item["messages"] = [_message(message_dict(m)) for m in asked.messages]
        item["tools"] = [t.get("function", t).get("name") for t in asked.tools or [] if isinstance(t, dict)]
        item.update(call_kind=asked.kind, call_id=None)
    elif turn.call is not None:
        messages = turn.call.messages
        item["messages"] = [_message(message_dict(m)) for m in messages] if messages is not None else None
        item["call_kind"] = turn.call.kind
    updates = [
        (turn.recorded_at, _call_fields(turn.call, resets)),
        (turn.replied_at, _reply_fields(turn.reply)),
    ]
    for _, fields in sorted((u for u in updates if u[0] is not None), key=lambda u: u[0] or 0):
        call_id = fields.pop("reply_call_id", None)
        item.update(fields)
        if call_id and item.get("call_id") is None:
            item["call_id"] = call_id
    return item


def _call_fields(call: ModelCallFinished | None, resets: dict[int, bool]) -> dict[str, object]:
    if call is None:
        return {}
    logprobs = call.logprobs
    return {
        "call_id": call.call_id,
        "prompt_tokens": len(call.prompt_tokens),
        "completion_tokens": len(call.completion_tokens),
        "completion_text": _cut(call.completion_text),
        "stop_reason": call.stop_reason,
        "policy_version": call.policy_version,
        "duration_s": call.duration_s,
        "parse_errors": list(call.parse_errors),
        "logprob_mean": (sum(logprobs) / len(logprobs)) if logprobs else None,
        "context_reset": resets[id(call)],
    }


def _reply_fields(reply: ChatReplied | None) -> dict[str, object]:
    if reply is None:
        return {}
    reply_message = _message(message_dict(reply.message)) if reply.error is None else {}
    fields: dict[str, object] = {"reply": reply_message, "finish_reason": reply.finish_reason}
    fields.update(parse_errors=list(reply.parse_errors), error=reply.error, error_kind=reply.error_kind)
    return fields | {"reply_call_id": reply.call_id}


def _tool_item(turn: ToolTurn) -> dict[str, object]:
    asked, returned = turn.request, turn.reply
    item: dict[str, object] = {"kind": "tool", "time": turn.time}
    if asked is not None:
        item.update(name=asked.name, arguments=asked.arguments, env=asked.env)
    elif returned is not None:
        item.update(name=returned.name, arguments=None)
    if returned is not None:
        item.update(output=_cut(returned.output), reward=returned.reward, finished=returned.finished)
        item.update(env_fault=returned.env_fault, error=returned.error, duration_s=returned.duration_s)
    return item


def _process_item(turn: ProcessTurn) -> dict[str, object]:
    asked, exited = turn.request, turn.reply
    item: dict[str, object] = {
        "kind": "process",
        "time": turn.time,
        "env": asked.env,
        "timeout": asked.timeout,
    }
    if exited is not None:
        item.update(return_code=exited.return_code, stdout=_cut(exited.stdout), stderr=_cut(exited.stderr))
        item.update(stdout_bytes=exited.stdout_bytes, stderr_bytes=exited.stderr_bytes)
        item.update(timed_out=exited.timed_out, unsupported=exited.unsupported, error=exited.error)
        item["duration_s"] = exited.duration_s
    return item


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
    scale = _advantage_scale(stored, normalization) if stored is not None else 1.0
    offset = found[1] if found is not None else None
    tokens = [_token_entry(call, j, stored, offset, scale) for j in range(len(call.completion_tokens))]
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


def _token_entry(
    call: ModelCallFinished, j: int, stored: StoredDatum | None, offset: int | None, scale: float
) -> dict[str, object]:
    """The call's `j`th sampled token, and where it trained (`offset`: the call's position in
    `stored`'s datum), the datum's logprob, weight and advantages there and the trainer's logprob."""
    entry: dict[str, object] = {
        "id": call.completion_tokens[j],
        "logprob": call.logprobs[j] if j < len(call.logprobs) else None,
    }
    if stored is None or offset is None:
        return entry
    datum = stored.datum
    position = offset + j
    if position < 0:  # the first token of a sequence is never a target
        entry.update(position=None, weight=0.0, advantage=0.0, trained_advantage=0.0, datum_logprob=None)
        return entry
    entry.update(
        position=position,
        weight=datum.weights[position],
        advantage=datum.advantages[position] / scale,
        trained_advantage=datum.advantages[position],
        datum_logprob=datum.logprobs[position],
    )
    scored = stored.scored
    if scored is not None and position < len(scored) and datum.weights[position]:
        entry["trainer_logprob"] = scored[position]  # the trainer's, before the step's update
    return entry


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

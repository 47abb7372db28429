"""What the gateway knows of each agent: its key, its budget, and the turns sampled for it.

Token-exact history rests on `turn_key`: an assistant turn a harness sends back is known by its
text and calls whatever shape the harness echoes them in, so the tokens sampled for it can
stand in for its re-rendered text.
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from platoon.gateway.errors import GatewayError
from platoon.gateway.memo import Compared, MessageMemo, RecordMemo, RenderMemo, encoded, same_written
from platoon.gateway.shapes import AssistantMessage, Message, ResponsesReply
from platoon.policy.base import TopLogprobs

__all__ = ["AgentSession", "Budget", "Completion", "TurnKey", "TurnsRead", "sampled_turns", "turn_key"]

TurnKey = tuple[str, tuple[tuple[str, str], ...]]  # an assistant turn's text and (name, arguments) calls


@dataclass
class Budget:
    """Model calls and completion tokens shared by the agents with one `budget_id`."""

    max_calls: int | None
    max_tokens: int | None
    calls: int = 0
    tokens: int = 0

    def check(self) -> None:
        if self.max_calls is not None and self.calls >= self.max_calls:
            raise GatewayError("budget", f"budget exhausted: all {self.max_calls} model calls are used")
        if self.max_tokens is not None and self.tokens >= self.max_tokens:
            raise GatewayError("budget", f"budget exhausted: all {self.max_tokens} tokens are used")

    def remaining(self) -> int | None:
        return None if self.max_calls is None else max(self.max_calls - self.calls, 0)


@dataclass(slots=True)
class TurnsRead:
    """What `sampled_turns` read of an agent's call, for its next call, which usually repeats
    that call's messages and adds to them."""

    written: Sequence[bytes | None] | None = None  # the messages, as `memo.encoded` writes them
    keys: dict[int, tuple[bytes, TurnKey | None]] = field(default_factory=dict)  # its turns' keys, by place
    completions: dict[int, list[int]] = field(default_factory=dict)  # what it found
    seen: dict[TurnKey, int] = field(default_factory=dict)  # each sampled turn's last occurrence, from 0
    unsampled: set[TurnKey] = field(default_factory=set)  # turns of which none was sampled then


@dataclass
class AgentSession:
    """One agent as the gateway knows it: its key, budget and the turns sampled for it."""

    episode_id: str
    agent_id: str
    key: str
    budget: Budget
    depth: int = 0
    params: dict[str, object] = field(default_factory=dict)
    min_version: int = 0
    # The tokens sampled for each turn, in the order sampled (written by `remember`).
    sampled: dict[TurnKey, list[list[int]]] = field(default_factory=dict)
    calls: int = 0
    # Its calls' sampling seeds derive from `seed` and a count of its draws (None: unseeded);
    # its subagents' seeds from `seed` and a count of its children.
    seed: int | None = None
    draws: int = 0
    children: int = 0
    closed: bool = False
    in_flight: int = 0  # HTTP calls being answered
    policy: str = "default"  # the policy sampled for this agent
    checks_tool_calls: bool = False  # its client checks its tool calls: no schema check here
    # Responses kept for `previous_response_id` (Responses API, `store`): id -> (the
    # conversation without instructions, reply included; the response object). Bounded.
    responses: OrderedDict[str, tuple[list[Message], ResponsesReply]] = field(default_factory=OrderedDict)
    prompt: RenderMemo = field(default_factory=RenderMemo)  # its last prompt, for the next render
    sent: MessageMemo = field(default_factory=MessageMemo)  # its last messages over the bus
    recorded: RecordMemo = field(default_factory=RecordMemo)  # its last HTTP call's, recorded
    turns: TurnsRead = field(default_factory=TurnsRead)  # `sampled_turns` of its last call
    fresh: list[TurnKey] = field(default_factory=list)  # turns sampled since then

    def remember(self, key: TurnKey, tokens: list[int]) -> None:
        """Keep the tokens sampled for a turn: its next prompts that hold it splice them."""
        self.sampled.setdefault(key, []).append(tokens)
        self.fresh.append(key)


@dataclass
class Completion:
    """One answered call: the assistant message and what was recorded."""

    message: AssistantMessage
    call_id: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    parse_errors: list[str]
    budget_remaining: int | None
    tokens: list[int]
    logprobs: list[float]
    stop_sequence: str | None = None  # the client's stop sequence that ended the reply
    top_logprobs: TopLogprobs | None = None  # per token, when the call asked for them
    streamed: str = ""  # the content sent as deltas while sampling


def sampled_turns(
    session: AgentSession,
    messages: Sequence[Message],
    written: Sequence[bytes | None] | None = None,
    compared: Compared | None = None,
) -> dict[int, list[int]]:
    """The tokens sampled for those assistant turns in `messages` that this agent was sampled
    (`written`: each message's `memo.encoded`, where the caller has them; `compared`: the agent's
    `RenderMemo.compared`, taken where it compared the same two lists).

    A text sampled twice (two identical tool calls, say) may have been sampled as different
    tokens, so the n-th occurrence of a turn gets the n-th sampling of it.

    A call that repeats the last one's messages and adds to them (an agent's, usually) reads
    only what it adds, where what was sampled since leaves the last call's reading as it was.
    """
    if not session.sampled:
        return {}
    last, fresh = session.turns, session.fresh
    session.fresh = []
    read = TurnsRead(written=written)
    start = 0
    if (
        written is not None
        and last.written is not None
        and len(last.written) <= len(written)
        and _still_read(last, fresh, session.sampled)
        and same_written(written, last.written, compared) == len(last.written)
    ):
        start = len(last.written)
        read.keys, read.completions = dict(last.keys), dict(last.completions)
        read.seen, read.unsampled = dict(last.seen), set(last.unsampled)
    # An agent's history repeats: a turn written as the one at its place last call has its key.
    for i in range(start, len(messages)):
        message = messages[i]
        if not (type(message) is dict or isinstance(message, Mapping)) or message.get("role") != "assistant":
            continue
        now = encoded(message) if written is None else written[i]
        before = last.keys.get(i)
        if before is not None and now is not None and before[0] == now:
            key = before[1]
        else:
            key = turn_key(message)
        if now is not None:
            read.keys[i] = (now, key)
        if key is None:
            continue
        samplings = session.sampled.get(key)
        if samplings:
            n = read.seen[key] = read.seen.get(key, -1) + 1
            read.completions[i] = samplings[min(n, len(samplings) - 1)]
        else:
            read.unsampled.add(key)
    session.turns = read
    return read.completions


def _still_read(last: TurnsRead, fresh: list[TurnKey], sampled: dict[TurnKey, list[list[int]]]) -> bool:
    """Whether the turns sampled since `last` leave what it read of its messages as it was: a
    turn none of whose kind was sampled then would now be spliced, and one that occurs more
    often than it had been sampled would now get a later sampling."""
    for key in fresh:
        if key in last.unsampled:
            return False
        last_seen = last.seen.get(key)  # its last occurrence, counted from 0
        if last_seen is not None and last_seen >= len(sampled[key]) - fresh.count(key):
            return False
    return True


def turn_key(message: Message) -> TurnKey | None:
    """What identifies an assistant turn across requests: its text and its calls.

    Harnesses echo replies back in different shapes (None or "" content, arguments as a JSON
    string or an object, their own call ids), so the key ignores those differences. A
    malformed turn has no key (the renderer then says what is wrong with it).
    """
    content = message.get("content")
    if isinstance(content, list):
        texts = [p.get("text", "") if isinstance(p, Mapping) else p for p in content]
        content = "\n".join(texts) if all(isinstance(t, str) for t in texts) else None
    elif content is not None and not isinstance(content, str):
        return None
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        return None
    calls = []
    for call in raw_calls:
        function = call.get("function", call) if type(call) is dict or isinstance(call, Mapping) else None
        if not (type(function) is dict or isinstance(function, Mapping)) or not isinstance(
            function.get("name"), str
        ):
            return None
        calls.append((function["name"], _arguments_key(function.get("arguments"))))
    return (content or "").strip(), tuple(calls)


def _arguments_key(arguments: object) -> str:
    """Tool call arguments as canonical JSON, whether sent as a JSON string or an object."""
    if not isinstance(arguments, str):
        try:
            return json.dumps(arguments, sort_keys=True, ensure_ascii=False)
        except (TypeError, ValueError):
            return repr(arguments)
    # An agent's history repeats its calls on every request, so short ones are memoized.
    return _canonical_json(arguments) if len(arguments) <= 4096 else _canonical_json.__wrapped__(arguments)


@functools.lru_cache(maxsize=4096)
def _canonical_json(text: str) -> str:
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        value = text
    return json.dumps(value, sort_keys=True, ensure_ascii=False)

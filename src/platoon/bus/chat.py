"""The chat messages the bus carries (`ChatRequested`, `ChatReplied`, `ModelCallFinished`):
OpenAI-style messages as structs, the schema both the harness's `ctx.chat` and the gateway's
HTTP dialects read them by (`platoon.gateway.bodies` takes them from here).

A message keeps the fields a renderer reads: role, content (text, or text parts), tool calls,
the tool call a result answers (`tool_call_id`), `name` and a reasoning model's reasoning.
Other keys a harness puts in a message (cache hints, ids, statuses) are dropped when it is
read: they never reached the prompt, and now they do not reach the log either. Unset fields
stay unset (`omit_defaults`), so a message turned back into a dict (`message_dict`) renders as
the one that was sent: a call without arguments is rendered `{}`, as before, not `null`.

They are frozen, as the events that carry them are: the gateway keeps an agent's last messages
to compare its next call's with (`platoon.gateway.memo.MessageMemo`).

Tools stay the JSON their harness sent: a renderer writes each tool into the prompt as that
JSON, its keys in the harness's order, flat `{"name", "parameters"}` tools included, so a struct
(which orders and drops keys) would change the prompt.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
from msgspec import Struct

__all__ = [
    "ChatFunctionCall",
    "ChatMessage",
    "ChatPart",
    "ChatToolCall",
    "MessageReader",
    "SampledMessage",
    "exact_from",
    "message_dict",
    "message_dicts",
    "messages_of",
    "same_leading",
]


class ChatPart(Struct, frozen=True):
    """A content part. Only text is read; the renderer names and refuses another `type`."""

    type: str = "text"
    text: str | None = None


class ChatFunctionCall(Struct, frozen=True, omit_defaults=True):
    name: str
    arguments: str | dict[str, Any] | None = None  # a JSON string; some harnesses echo the object


class ChatToolCall(Struct, frozen=True, kw_only=True, omit_defaults=True):
    id: str | None = None
    type: str | None = None
    function: ChatFunctionCall


class ChatMessage(Struct, frozen=True, omit_defaults=True):
    """A message of any role: the renderer names a role it does not know (developer is read as
    system). Its own fields reach the renderer as the client sent them."""

    role: str
    content: str | list[str | ChatPart] | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None  # a reasoning model's turn, echoed back
    reasoning: str | None = None
    thinking: str | None = None


class SampledMessage(ChatMessage, frozen=True, omit_defaults=True):
    """The assistant message the gateway sampled; a reply that failed carries an empty one."""

    role: str = "assistant"


_FORM = "a message is OpenAI's chat form: role, content, tool calls, tool_call_id, name"


def messages_of(messages: Iterable[object], where: str = "messages") -> list[ChatMessage]:
    """Messages as structs, from dicts (or structs, or objects with their fields as attributes);
    one that does not fit is a `ValueError` that names it and its field (`messages.0.content:
    Expected ...`)."""
    listed = messages if type(messages) is list else list(messages)
    try:
        return msgspec.convert(listed, list[ChatMessage])
    except msgspec.ValidationError:
        pass  # objects read by their attributes: a seventh slower, so only where dicts do not fit
    try:
        return msgspec.convert(listed, list[ChatMessage], from_attributes=True)
    except msgspec.ValidationError as exc:
        text = str(exc)
        problem, _, path = text.rpartition(" - at `$")
        if not problem:
            raise ValueError(f"{where}: {text} ({_FORM})") from None
        place = where + "".join(f".{p}" for p in path.rstrip("`").replace("]", "").split("[") if p)
        raise ValueError(f"{place}: {problem} ({_FORM})") from None


def message_dict(message: ChatMessage) -> dict[str, Any]:
    """The message as the OpenAI-style dict renderers and harnesses read: `role` and `content`
    always (content None when there is none), the other fields where they are set."""
    found: dict[str, object] = msgspec.to_builtins(message)
    if "role" not in found:  # a SampledMessage's, its default
        found = {"role": message.role, **found}
    found.setdefault("content", None)
    return found


def message_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, object]]:
    """`message_dict` of each, in one pass: the gateway reads a conversation's every call."""
    found: list[dict[str, object]] = msgspec.to_builtins(messages)
    for i, (message, fields) in enumerate(zip(messages, found, strict=True)):
        if "role" not in fields:  # a SampledMessage's, its default
            found[i] = fields = {"role": message.role, **fields}
        fields.setdefault("content", None)
    return found


def same_leading(now: Sequence[object], before: Sequence[object]) -> int:
    """How many leading items of `now` equal `before`'s: one comparison in C where `now`
    repeats all of `before`, as an agent's next call usually does."""
    n = len(before)
    if n <= len(now) and (now == before if n == len(now) else now[:n] == before):
        return n
    same, most = 0, min(n, len(now))
    while same < most and now[same] == before[same]:
        same += 1
    return same


def exact_from(messages: Sequence[ChatMessage], start: int) -> int:
    """How many of the messages from `start` on their equality tells apart from any other.

    Python's equality holds 1, 1.0 and true the same; of a message's fields only tool call
    arguments sent as an object can hold numbers, so a message with those ends the run: a memo
    never stands one in for another that only equals it."""
    for n in range(start, len(messages)):
        for call in messages[n].tool_calls or ():
            if type(call.function.arguments) is dict:
                return n - start
    return len(messages) - start


class MessageReader:
    """`messages_of` for one agent's calls (`ctx.chat`), which repeat its history: the leading
    messages a call writes as the structs of the last call read back (`message_dicts`), key for
    key, are those structs; only what a call adds is read anew.

    A message is compared as it is now with the dict its struct reads back as, never with the
    caller's own object, which the caller may have changed in place since. One with other keys
    (dropped when read) is simply read again."""

    __slots__ = ("_dicts", "_typed")

    def __init__(self) -> None:
        self._typed: list[ChatMessage] = []  # the last call's exact leading messages
        self._dicts: list[dict[str, object]] = []  # and them read back

    def read(self, messages: Iterable[object]) -> list[ChatMessage]:
        """`messages_of(messages)`; a message that does not fit is a `ValueError` naming it."""
        listed = messages if type(messages) is list else list(messages)
        last = self._dicts
        same = same_leading(listed, last)
        if same == len(listed):  # nothing added (msgspec's every call costs a microsecond)
            return self._typed[:same]
        try:
            added = messages_of(listed[same:])
        except ValueError:
            added = messages_of(listed)  # raises again, naming the message by its place
        typed = self._typed[:same] + added
        exact = same + exact_from(typed, same)
        self._typed = typed[:exact]
        self._dicts = last[:same] + message_dicts(added[: exact - same])
        return typed

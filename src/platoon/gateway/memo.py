"""An agent's last prompt, kept so that its next one renders and tokenizes only what changed.

A renderer's prompt is the concatenation of its chunks' tokens, each chunk tokenized on its own
(or, for an assistant turn sampled before, its sampled tokens). So where a call's leading chunks
are the previous call's (the same text, the same sampled tokens), their tokens are the previous
prompt's chunks' tokens, taken as they are: what a full render gives, token for token, by
construction. An agent's calls usually repeat its history, so most of each prompt is reused.

The chunks' texts are kept too. A renderer that says how far its chunks depend on later
messages (`Renderer._unchanged`, defined on its own class) has the chunks of the leading
messages a call repeats taken from the last call, and writes only the rest (`_texts_from`).
A message is repeated when it is written the same (`encoded`: exact where Python's equality is
not, 1, 1.0 and true apart; and a copy, whatever the caller changes in its messages since), and
so are the tools.

An agent's messages come over the bus as structs, and the renderer reads dicts: `MessageMemo`
keeps the last call's, so that a call makes the dicts and encodings of the messages it adds,
not of the whole history again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec

from platoon.bus.chat import ChatMessage, exact_from, message_dicts, messages_of, same_leading
from platoon.gateway.shapes import Message, Messages, Tool

__all__ = [
    "Chunk",
    "Compared",
    "MessageMemo",
    "RecordMemo",
    "RenderMemo",
    "Texts",
    "encoded",
    "encoded_each",
    "leading",
    "same_written",
]

# Two lists of encodings compared (`same_written`): (the one before, the one now, how many lead alike)
Compared = tuple[Sequence[bytes | None], Sequence[bytes | None], int]
Chunk = tuple[str, Sequence[int] | None]  # a chunk's text, and the tokens sampled for it (or None)
Texts = list[tuple[int | None, str, str]]  # (message index or None, role, text) per chunk


class _Writer(Protocol):
    """What a renderer gives the memo (see `Renderer`)."""

    def _texts(
        self, messages: list[Message], tools: list[Tool] | None, add_generation_prompt: bool
    ) -> Texts: ...

    def _texts_from(
        self, messages: list[Message], tools: list[Tool] | None, add_generation_prompt: bool, start: int
    ) -> Texts: ...

    def _context(self, messages: list[Message]) -> object: ...

    def _unchanged(self, before: object, after: object, same: int) -> int: ...


class RenderMemo:
    """The last prompt rendered for one agent: its messages and chunks, and their tokens.

    Each render replaces each record at once, so renders on worker threads may interleave (each
    reads whole records, and checks what it reuses).
    """

    __slots__ = ("_last", "_written", "compared")

    def __init__(self) -> None:
        # (the renderer, its chunks, each chunk's tokens)
        self._last: tuple[object, list[Chunk], list[Sequence[int]]] | None = None
        # (the renderer, its messages' and tools' encodings, its context, the chunks' texts)
        self._written: tuple[object, list[bytes | None], bytes | None, object, Texts] | None = None
        # Its last comparison (`repeated`): (the last messages' encodings, the call's, how many lead
        # alike), for the call's other readers (`sampled_turns`, `RecordMemo`) that hold the same
        # two lists not to compare them again.
        self.compared: Compared | None = None

    def repeated(self, owner: object, now: list[bytes | None]) -> int:
        """How many of a call's leading messages (`now`: `encoded_each` of them) are the ones
        `owner` last rendered for this agent, written the same: those were checked then."""
        written = self._written
        if written is None or written[0] is not owner:
            return 0
        same = same_written(now, written[1], self.compared)  # asked before the render, usually
        self.compared = (written[1], now, same)
        return same

    def texts(
        self,
        owner: _Writer,
        messages: list[Message],
        tools: list[Tool] | None,
        add_generation_prompt: bool,
        now: list[bytes | None],
        same: int,
    ) -> Texts:
        """`owner._texts(...)`, with the chunks of the leading messages the last call repeated
        taken from it where `owner` can tell which those are; `now`: `encoded_each(messages)`,
        `same`: `repeated(owner, now)`."""
        if not _reuses(owner):
            return owner._texts(messages, tools, add_generation_prompt)
        written = self._written
        key = encoded(tools)
        context = owner._context(messages)
        texts: Texts | None = None
        if written is not None and written[0] is owner and key is not None and written[2] == key:
            keep = owner._unchanged(written[3], context, same) if same > 1 else 0
            if keep > 0:
                # The chunks of the messages before `keep`, and a preamble of none, as written.
                old = written[4]
                texts = old[: leading(old, keep)] + owner._texts_from(
                    messages, tools, add_generation_prompt, keep
                )
        if texts is None:
            texts = owner._texts(messages, tools, add_generation_prompt)
        self._written = (owner, now, key, context, texts)
        return texts

    def tokens(
        self,
        owner: object,
        chunks: list[Chunk],
        encode: Callable[[str], Sequence[int]],
        segment: Callable[[Sequence[int]], Sequence[int]],
    ) -> list[int]:
        """The prompt of `chunks` as `owner` (a renderer) tokenizes them: `encode` for a text,
        `segment` for sampled tokens; the leading chunks the last render shared are not redone."""
        last = self._last
        kept = same_leading(chunks, last[1]) if last is not None and last[0] is owner else 0
        # Each chunk's own tokens, kept as they came (a cached text's are shared, not copied: a
        # copy of every agent's whole prompt, kept, is what the garbage collector walks).
        parts = last[2][:kept] if last is not None else []
        parts += [encode(text) if sampled is None else segment(sampled) for text, sampled in chunks[kept:]]
        self._last = (owner, chunks, parts)
        tokens: list[int] = []
        for part in parts:
            tokens += part
        return tokens


class MessageMemo:
    """One agent's last call's messages as the bus carried them (checked structs), with the
    dicts the renderer read and their encodings: the messages a call repeats keep theirs.

    A message is repeated when it equals the last call's at its place and that one is exact:
    Python's equality holds 1, 1.0 and true the same, which only tool call arguments sent as an
    object can hold (`exact_from`), so a message with those is never reused.
    """

    __slots__ = ("_dicts", "_typed", "_written")

    def __init__(self) -> None:
        self._typed: list[ChatMessage] = []  # the last call's exact leading messages
        self._dicts: list[dict[str, object]] = []
        self._written: list[bytes | None] = []

    def read(self, typed: list[ChatMessage]) -> Messages:
        """`typed` as a call reads it. A `ChatRequested` published by other code than `ctx.chat`
        may hold dicts: its new messages are read as `ctx.chat` reads its own, and one that does
        not fit is a `ValueError` that names it."""
        same = same_leading(typed, self._typed)  # an agent's history, usually, and more
        if same == len(typed):  # nothing added (msgspec's every call costs a microsecond)
            return Messages(self._dicts[:same], self._written[:same], typed)
        if not all(type(m) is ChatMessage for m in typed[same:]):  # `ctx.chat`'s are read already
            typed = messages_of(typed)
        added = message_dicts(typed[same:])
        dicts = self._dicts[:same] + added
        written = self._written[:same] + encoded_each(added)
        exact = same + exact_from(typed, same)
        self._typed, self._dicts, self._written = typed[:exact], dicts[:exact], written[:exact]
        return Messages(dicts, written, typed)


class RecordMemo:
    """One HTTP agent's last call's messages as its record carries them (structs), with the
    encodings of the dicts they were read from: a call's leading messages written as the last
    call's were (exact: `encoded`) are recorded as those structs; only what it adds is read."""

    __slots__ = ("_typed", "_written")

    def __init__(self) -> None:
        self._typed: list[ChatMessage] = []
        self._written: list[bytes | None] = []

    def read(self, messages: Messages, compared: Compared | None = None) -> list[ChatMessage]:
        """`messages_of(messages.dicts)`, its `written` given; one that does not fit is a
        `ValueError` that names it. `compared`: the agent's `RenderMemo.compared`, taken where it
        compared the same two lists."""
        dicts, written = messages.dicts, messages.written
        if written is None or len(written) != len(dicts):
            return messages_of(dicts)
        same = same_written(written, self._written, compared)
        try:
            typed = self._typed[:same] + (messages_of(dicts[same:]) if same < len(dicts) else [])
        except ValueError:
            messages_of(dicts)  # raises again, naming the message by its place
            raise
        self._typed, self._written = typed, written
        return typed


def same_written(
    now: Sequence[bytes | None], before: Sequence[bytes | None], compared: Compared | None = None
) -> int:
    """`same_leading` of two lists of encodings (`encoded_each`), where a message that could not
    be written (None) is never the same as any; taken from `compared` where it compared these
    two very lists (a call's render, sampled turns and record ask the same question)."""
    if compared is not None and compared[0] is before and compared[1] is now:
        return compared[2]
    same = same_leading(now, before)
    if same and None in before:
        same = min(same, before.index(None))
    return same


def leading(texts: Texts, start: int) -> int:
    """How many of `texts`' first chunks belong to its first `start` messages: theirs, and a
    preamble (a first chunk no message owns)."""
    n = 0
    while n < len(texts) and (((m := texts[n][0]) is None and n == 0) or (m is not None and m < start)):
        n += 1
    return n


_KEYS = msgspec.msgpack.Encoder()  # exact: key order, ints apart from floats and bools


def encoded(value: object) -> bytes | None:
    """`value` as msgpack (exact: key order, ints apart from floats and bools); None when it is
    not plain data (then never the same as anything)."""
    try:
        return _KEYS.encode(value)
    except (TypeError, ValueError, OverflowError):
        return None


def encoded_each(values: Sequence[object]) -> list[bytes | None]:
    """`encoded` of each value."""
    try:
        return [_ENCODE(value) for value in values]  # the encoder itself: this runs on every call
    except (TypeError, ValueError, OverflowError):
        return [encoded(value) for value in values]


_ENCODE = _KEYS.encode
_REUSES: dict[type, bool] = {}


def _reuses(owner: object) -> bool:
    """Whether `owner`'s own class defines `_unchanged`: a subclass that does not (it may write
    its chunks otherwise) renders them all."""
    kind = type(owner)
    known = _REUSES.get(kind)
    if known is None:
        known = _REUSES[kind] = "_unchanged" in vars(kind)
    return known

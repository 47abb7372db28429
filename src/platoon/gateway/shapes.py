"""The JSON shapes the gateway passes around, typed as what the code does with them.

What clients send (messages, tools, parameters) is read, never written, and may hold anything:
`Mapping[str, object]`, checked where it is read. What the gateway writes (assistant messages
and their tool calls) has a fixed form: `TypedDict`s. Response bodies it builds and hands to
the JSON encoder are `JsonObject`s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, NotRequired, Protocol, TypedDict

__all__ = [
    "AssistantMessage",
    "FunctionCall",
    "JsonObject",
    "Message",
    "Params",
    "Tokenizer",
    "Tool",
    "ToolCall",
]

Message = Mapping[str, object]  # a chat message as a client sent it
Tool = Mapping[str, object]  # a tool as a client sent it: its JSON is part of the prompt
Params = Mapping[str, object]  # a call's sampling parameters and reply controls, as requested
JsonObject = dict[str, object]  # a response body on its way to the encoder


class FunctionCall(TypedDict):
    name: str
    arguments: str  # a JSON object, as text


class ToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(TypedDict):
    """A sampled reply as an OpenAI chat message (content None when there are only calls)."""

    role: Literal["assistant"]
    content: str | None
    tool_calls: NotRequired[list[ToolCall]]
    reasoning_content: NotRequired[str]


class Tokenizer(Protocol):
    """What the gateway uses of a (transformers) tokenizer."""

    def encode(self, text: str, *, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = ...) -> str: ...

    def convert_tokens_to_ids(self, token: str) -> int | None: ...

    def convert_ids_to_tokens(self, token_id: int) -> str | None: ...

    def get_vocab(self) -> dict[str, int]: ...

    @property
    def bos_token(self) -> str | None: ...

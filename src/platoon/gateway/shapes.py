"""The JSON shapes the gateway passes around, typed as what the code does with them.

What clients send (messages, tools, parameters) is read, never written, and may hold anything:
`Mapping[str, object]`, checked where it is read. What the gateway writes (assistant messages
and their tool calls) has a fixed form: `TypedDict`s. Response bodies it builds and hands to
the JSON encoder are `JsonObject`s, or, where the gateway reads them back (to stream a finished
reply, to keep a response for `previous_response_id`), the `TypedDict` of their dialect.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, NamedTuple, NotRequired, Protocol, TypedDict

import msgspec

from platoon.bus.chat import ChatMessage

__all__ = [
    "AnthropicBlock",
    "AnthropicReply",
    "AssistantMessage",
    "ChatChoice",
    "ChatCompletion",
    "FunctionCall",
    "JsonObject",
    "Message",
    "Messages",
    "Params",
    "ParsedMessage",
    "ResponsesItem",
    "ResponsesReply",
    "Tokenizer",
    "Tool",
    "ToolCall",
    "decoder",
]

Message = Mapping[str, object]  # a chat message as a client sent it
Tool = Mapping[str, object]  # a tool as a client sent it: its JSON is part of the prompt
Params = Mapping[str, object]  # a call's sampling parameters and reply controls, as requested
JsonObject = dict[str, object]  # a response body on its way to the encoder


class Messages(NamedTuple):
    """A call's messages in each form the call reads them: as the renderer does (`dicts`), each
    one as the memo knows it (`written`, `memo.encoded`; None: encoded where rendered) and as
    its record carries them (`typed`; None: read from `dicts` where the call is recorded)."""

    dicts: Sequence[Message]
    written: list[bytes | None] | None = None
    typed: list[ChatMessage] | None = None


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


class ChatChoice(TypedDict):
    index: int
    message: AssistantMessage
    logprobs: JsonObject | None
    finish_reason: str


class ChatCompletion(TypedDict):
    """A chat.completion object (OpenAI Chat Completions)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: dict[str, int]


class ResponsesText(TypedDict):
    type: Literal["output_text"]
    text: str
    annotations: list[object]
    logprobs: NotRequired[list[JsonObject]]  # when the body includes message.output_text.logprobs


class ResponsesReasoning(TypedDict):
    type: Literal["reasoning"]
    id: str
    summary: list[object]
    content: list[JsonObject]


class ResponsesMessage(TypedDict):
    type: Literal["message"]
    id: str
    status: str
    role: Literal["assistant"]
    content: list[ResponsesText]


class ResponsesFunctionCall(TypedDict):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: str


ResponsesItem = ResponsesReasoning | ResponsesMessage | ResponsesFunctionCall


class ResponsesReply(TypedDict):
    """A response object (OpenAI Responses)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["completed", "incomplete"]
    incomplete_details: dict[str, str] | None
    model: str
    output: list[ResponsesItem]
    parallel_tool_calls: bool
    tool_choice: str
    tools: list[object]
    usage: JsonObject


class AnthropicText(TypedDict):
    type: Literal["text"]
    text: str


class AnthropicThinking(TypedDict):
    type: Literal["thinking"]
    thinking: str
    signature: str


class AnthropicToolUse(TypedDict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: object  # the call's arguments, as decoded


AnthropicBlock = AnthropicText | AnthropicThinking | AnthropicToolUse


class AnthropicReply(TypedDict):
    """A message object (Anthropic Messages)."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[AnthropicBlock]
    stop_reason: str
    stop_sequence: str | None
    usage: dict[str, int]


class Tokenizer(Protocol):
    """What the gateway uses of a (transformers) tokenizer."""

    def encode(self, text: str, *, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = ...) -> str: ...

    def convert_tokens_to_ids(self, token: str) -> int | None: ...

    def convert_ids_to_tokens(self, token_id: int) -> str | None: ...

    def get_vocab(self) -> dict[str, int]: ...

    @property
    def bos_token(self) -> str | None: ...


def decoder(tokenizer: Tokenizer) -> Callable[[list[int]], str]:
    """`tokenizer.decode(tokens, skip_special_tokens=False)` as one function, made once per
    tokenizer (every reply and every streamed chunk is decoded). A transformers fast tokenizer
    that keeps its library's decoding and cleans up no spaces decodes in its Rust backend
    directly: the same text, without the wrapper's checks of its argument on each call
    (5.3 -> 1.9 us for a 20-token reply)."""
    transformers = sys.modules.get("transformers")
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if transformers is not None and backend is not None:
        fast, kind = transformers.PreTrainedTokenizerFast, type(tokenizer)
        if (
            kind.decode is fast.decode
            and getattr(kind, "_decode", None) is fast._decode
            and not getattr(tokenizer, "clean_up_tokenization_spaces", True)
        ):
            return functools.partial(backend.decode, skip_special_tokens=False)
    return functools.partial(tokenizer.decode, skip_special_tokens=False)


class ParsedMessage(msgspec.Struct):
    """An assistant reply read back from sampled tokens.

    `finish_reason` is "length" when no stop token was sampled, "tool_calls" when the reply
    carries calls, else "stop". `errors` holds one line per call that is wrong: one that
    cannot be a call stays in `content` as the model wrote it; one to a tool not declared, or
    whose arguments do not fit its schema, is a call all the same (`toolcalls`).
    """

    content: str
    reasoning: str | None = None
    tool_calls: list[ToolCall] = []
    errors: list[str] = []
    finish_reason: Literal["stop", "length", "tool_calls"] = "stop"

    def to_openai(self) -> AssistantMessage:
        """The reply as an OpenAI chat message (content None when there is only tool calls)."""
        message: AssistantMessage = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
            if not self.content:
                message["content"] = None
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        return message

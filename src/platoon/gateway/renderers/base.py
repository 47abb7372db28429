"""The renderer base: what every chat format shares (checking messages, tokenizing chunks and
caching them, splicing sampled tokens back into a history, parsing a reply), the helpers a format
reads messages with, and the registry of formats by name.

A format subclasses `Renderer` and gives `_texts` (its chunks) and `_generation_text`; the
built-in ones are in `chatml`, `llama3` and `role_colon`, registered by the package.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, Literal

import msgspec

from platoon.gateway import jsontext
from platoon.gateway.memo import RenderMemo, Texts, encoded_each, leading
from platoon.gateway.shapes import Message, ParsedMessage, Tokenizer, Tool, ToolCall, decoder
from platoon.gateway.toolcalls import ToolCallParser, get_tool_call_parser
from platoon.naming import unknown_name

__all__ = [
    "ParsedMessage",
    "Renderer",
    "RendererError",
    "Segment",
    "UnknownRendererError",
    "arguments_object",
    "calls_of",
    "check_messages",
    "flat_text",
    "function_at",
    "function_of",
    "get_renderer",
    "message_text",
    "reasoning_of",
    "register_renderer",
    "renderer_names",
    "role_of",
    "tojson",
]


class RendererError(ValueError):
    """The messages cannot be rendered in this format (bad shape, or a feature the format lacks)."""


class UnknownRendererError(KeyError):
    """No renderer is registered under the requested name."""

    def __str__(self) -> str:
        return str(self.args[0])


class Segment(msgspec.Struct, frozen=True):
    """One chunk of a prompt: the tokens of one message, of a preamble, or of the generation prompt.

    `message` is the index into the rendered messages, or None for chunks no message owns (the
    tools preamble when there is no system message, and the generation prompt).
    """

    message: int | None
    role: str
    tokens: list[int]


_ROLES = frozenset({"system", "user", "assistant", "tool"})
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def flat_text(content: object, where: str) -> str:
    """Flatten message content to text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif (
                isinstance(part, Mapping)
                and part.get("type", "text") == "text"
                and isinstance(part.get("text"), str)
            ):
                texts.append(part["text"])
            else:
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise RendererError(f"{where}: content part of type {kind!r} is not supported (text only)")
        return "\n".join(texts)
    raise RendererError(
        f"{where}: content must be a string, a list of parts or null, not {type(content).__name__}"
    )


def message_text(message: Message, i: int) -> str:
    """The text of message `i` (`flat_text`, its place named only when it is wrong)."""
    content = message.get("content")
    return content if type(content) is str else flat_text(content, f"messages.{i}.content")


def reasoning_of(message: Message) -> object:
    return next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)


def function_of(call: object, where: str) -> tuple[str, object]:
    """(name, arguments) of a tool call in OpenAI (`{"function": {...}}`) or flat form."""
    function = call.get("function", call) if type(call) is dict or isinstance(call, Mapping) else None
    if not (type(function) is dict or isinstance(function, Mapping)) or not isinstance(
        function.get("name"), str
    ):
        raise RendererError(f"{where}: a tool call needs function.name")
    return function["name"], function.get("arguments", {})


def function_at(call: object, i: int, n: int) -> tuple[str, object]:
    """`function_of` of call `n` of message `i` (its place named only when it is wrong)."""
    function = call.get("function", call) if type(call) is dict else None
    if type(function) is dict and type(name := function.get("name")) is str:
        return name, function.get("arguments", {})
    return function_of(call, f"messages.{i}.tool_calls.{n}")


def arguments_object(arguments: object, where: str) -> object:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise RendererError(f"{where}: tool call arguments are not valid JSON ({exc.msg})") from None
    return arguments


def check_messages(messages: Sequence[Message], start: int = 0) -> None:
    """Refuse a message a renderer cannot read (naming it); those before `start` are known good."""
    for i in range(start, len(messages)):
        message = messages[i]
        if type(message) is not dict and not isinstance(message, Mapping):  # dict: 5x cheaper to check
            raise RendererError(f"messages.{i}: a message must be an object, not {type(message).__name__}")
        role = message.get("role")
        if role not in _ROLES:
            raise RendererError(
                f"messages.{i}.role: must be one of system, user, assistant, tool; got {role!r}"
            )
        calls = message.get("tool_calls")
        if calls and role != "assistant":
            raise RendererError(f"messages.{i}.tool_calls: only assistant messages carry tool calls")
        if calls is not None and not isinstance(calls, list):
            raise RendererError(f"messages.{i}.tool_calls: must be a list")


def role_of(message: Message) -> str:
    """The role of a message `check_messages` passed: one of `_ROLES`."""
    return str(message["role"])


def calls_of(message: Message) -> list[object]:
    """The tool calls of a message `check_messages` passed: a list, or none."""
    calls = message.get("tool_calls")
    return calls if isinstance(calls, list) else []


_CACHE_ENTRIES = 1024
_CACHE_MAX_CHARS = 100_000


def tojson(value: object, indent: int | None = None) -> str:
    # transformers' `tojson` filter: json.dumps with ensure_ascii=False and default separators,
    # kept for the tools and calls an agent sends again on every call.
    return jsontext.dumps(value, indent)


class Renderer(ABC):
    """Base of the built-in renderers. Subclasses give `_texts` (the chat format) and `_split`
    (how a sampled reply reads back); tokenizing, splicing and parsing are shared."""

    name: ClassVar[str] = ""
    default_tool_call_parser: ClassVar[str | None] = None
    stop_token_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, tokenizer: Tokenizer, *, tool_call_parser: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.decode = decoder(tokenizer)  # `tokenizer.decode(tokens)`, special tokens kept
        parser_name = tool_call_parser or self.default_tool_call_parser
        self.tool_call_parser: ToolCallParser | None = (
            get_tool_call_parser(parser_name) if parser_name else None
        )
        self.stop_token_ids: list[int] = [
            t for t in map(self._token_id, self.stop_token_names) if t is not None
        ]
        if self.stop_token_names and not self.stop_token_ids:
            raise RendererError(
                f"the tokenizer has none of {self.name}'s stop tokens {list(self.stop_token_names)}"
            )
        self.stop_strings: list[str] = []
        self._encoded: OrderedDict[str, tuple[int, ...]] = OrderedDict()

    # Rendering

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool] | None = None,
        *,
        add_generation_prompt: bool = True,
        completions: Mapping[int, Sequence[int]] | None = None,
        memo: RenderMemo | None = None,
        encoded: list[bytes | None] | None = None,
    ) -> list[int]:
        """Prompt tokens for `messages`; `completions` maps assistant message indices to the
        tokens sampled for them, which replace their re-rendered text. With `memo` (one per
        agent), the chunks the agent's last prompt began with are not written nor tokenized
        again; `encoded`, each message's `memo.encoded` as it is now, saves the memo that work."""
        # `render_segments` without its chunks: a long history's tokens are copied once, not thrice.
        listed, tools = list(messages), list(tools) if tools else None
        if memo is None:
            check_messages(listed)
            texts = self._texts(listed, tools, add_generation_prompt)
        else:
            if encoded is None or len(encoded) != len(listed):
                encoded = encoded_each(listed)
            same = memo.repeated(self, encoded)  # the agent's last render checked those
            check_messages(listed, same)
            texts = memo.texts(self, listed, tools, add_generation_prompt, encoded, same)
        completions = completions or {}
        for index in completions:
            if not 0 <= index < len(messages) or messages[index].get("role") != "assistant":
                raise RendererError(f"completions: message {index} is not an assistant message")
        if memo is not None:
            chunks = [(text, completions.get(m) if m is not None else None) for m, _, text in texts if text]
            return memo.tokens(self, chunks, self._encoded_text, self.completion_segment)
        tokens: list[int] = []
        for message, _, text in texts:
            if not text:
                continue
            if message is not None and message in completions:
                tokens += self.completion_segment(completions[message])
            else:
                tokens += self._encoded_text(text)
        return tokens

    def render_segments(
        self,
        messages: Sequence[Message],
        tools: Sequence[Tool] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> list[Segment]:
        """The prompt as chunks: one per message (tool results may share their neighbours'
        chat turn but keep their own chunk), the tools preamble, and the generation prompt."""
        check_messages(messages)
        texts = self._texts(list(messages), list(tools) if tools else None, add_generation_prompt)
        return [Segment(index, role, self._encode(text)) for index, role, text in texts if text]

    def generation_prompt(self) -> list[int]:
        """The tokens that open an assistant turn (the end of every generation prompt)."""
        return self._encode(self._generation_text())

    def completion_segment(self, completion: Sequence[int]) -> list[int]:
        """The chunk an assistant turn takes in later prompts when its sampled tokens are reused:
        the generation prompt, the sampled tokens, an end-of-turn token if sampling was cut
        short, and whatever the format puts between turns."""
        body = list(completion)
        if not body or body[-1] not in self.stop_token_ids:
            body += self._encode(self._end_of_turn_text())
        return self.generation_prompt() + body + self._encode(self._after_turn_text())

    def _token_id(self, token: str) -> int | None:
        # Not get_vocab(): it copies the whole vocabulary (0.1 s for Qwen's).
        token_id = self.tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and self.tokenizer.convert_ids_to_tokens(token_id) == token:
            return token_id
        return None

    def _encode(self, text: str) -> list[int]:
        return list(self._encoded_text(text)) if text else []

    def _encoded_text(self, text: str) -> tuple[int, ...]:
        # An agent's prompts repeat its history, so chunks are cached: re-rendering a long
        # conversation then costs only its new messages.
        cached = self._encoded.get(text)
        if cached is None:
            cached = tuple(self.tokenizer.encode(text, add_special_tokens=False))
            if len(text) <= _CACHE_MAX_CHARS:
                if len(self._encoded) >= _CACHE_ENTRIES:
                    self._encoded.popitem(last=False)
                self._encoded[text] = cached
        else:
            self._encoded.move_to_end(text)
        return cached

    # Parsing

    def parse(
        self, tokens: Sequence[int], tools: Sequence[Tool] | None = None, *, tool_calls: bool = True
    ) -> ParsedMessage:
        """Read sampled tokens back into an assistant message. Never raises on model output.

        `tool_calls=False` reads tool-call markup as plain text (`tool_choice: none`)."""
        tokens = list(tokens)
        stop_at = next((i for i, t in enumerate(tokens) if t in self.stop_token_ids), None)
        body = tokens if stop_at is None else tokens[:stop_at]
        text = self.decode(body)
        return self.parse_text(text, tools, stopped=stop_at is not None, tool_calls=tool_calls)

    def parse_text(
        self, text: str, tools: Sequence[Tool] | None = None, *, stopped: bool, tool_calls: bool = True
    ) -> ParsedMessage:
        """`parse` on the decoded text of a completion (its stop token left out)."""
        text, stopped = self._cut_at_stop_string(text, stopped=stopped)
        reasoning, content = self._split(text)
        calls: list[ToolCall] = []
        errors: list[str] = []
        if self.tool_call_parser is not None and tool_calls:
            result = self.tool_call_parser.parse(content, tools)
            content, calls, errors = result.content, result.tool_calls, result.errors
        finish: Literal["stop", "length", "tool_calls"] = (
            "length" if not stopped else ("tool_calls" if calls else "stop")
        )
        return ParsedMessage(content, reasoning, calls, errors, finish)

    # Streaming and constrained calls

    reasoning_markers: ClassVar[tuple[str, ...]] = ()

    def stream_markers(self) -> tuple[list[str], bool]:
        """(markers, plain): text from a marker on is not plain content (a tool call, reasoning,
        a stop string); `plain` False means the parser reads whole replies, so nothing streams
        before the end."""
        parser = self.tool_call_parser
        start = getattr(parser, "start", None) if parser is not None else None
        plain = parser is None or start is not None
        return [*self.reasoning_markers, *self.stop_strings, *([start] if start else [])], plain

    def tool_call_end(self) -> str | None:
        """The text that closes one tool call, where the format has one."""
        return getattr(self.tool_call_parser, "end", None) if self.tool_call_parser else None

    def tool_call_prefill(self, name: str | None) -> str | None:
        """The beginning of a reply that must call a tool (`name`, or any): sampled from there,
        the reply is a tool call by construction. None: the format cannot be steered so."""
        parser = self.tool_call_parser
        start = getattr(parser, "start", None) if parser is not None else None
        if start != "<tool_call>":
            return None
        return "<tool_call>\n" + ("" if name is None else '{"name": ' + json.dumps(name) + ', "arguments": ')

    def _cut_at_stop_string(self, text: str, *, stopped: bool) -> tuple[str, bool]:
        cuts = [text.find(s) for s in self.stop_strings if s in text]
        if cuts:
            return text[: min(cuts)], True
        return text, stopped

    def _split(self, text: str) -> tuple[str | None, str]:
        """(reasoning, content) of a decoded reply."""
        return None, text.strip()

    # The chat format, given by each subclass

    @abstractmethod
    def _texts(
        self, messages: list[Message], tools: list[Tool] | None, add_generation_prompt: bool
    ) -> list[tuple[int | None, str, str]]:
        """(message index or None, role, text) per chunk, in prompt order."""

    @abstractmethod
    def _generation_text(self) -> str:
        """The text that opens an assistant turn."""

    def _end_of_turn_text(self) -> str:
        return ""

    def _after_turn_text(self) -> str:
        return ""

    # An agent's next call (`RenderMemo.texts`): a class that defines `_unchanged` itself has
    # the chunks of the messages the call repeats taken from the last one (`_texts_from` the rest).

    def _context(self, messages: list[Message]) -> object:
        """What of the whole conversation a message's chunk depends on beyond its neighbours."""
        return None

    def _unchanged(self, before: object, after: object, same: int) -> int:
        """How many leading messages keep their chunks from the last render, when this one repeats
        its tools and its first `same` messages (`before`, `after`: the two `_context`s)."""
        return 0

    def _texts_from(
        self, messages: list[Message], tools: list[Tool] | None, add_generation_prompt: bool, start: int
    ) -> Texts:
        """`_texts` without the chunks of the first `start` messages, nor a preamble (a first
        chunk no message owns: it may depend on the tools and those messages only). Here the
        whole render's tail; a renderer that can write the rest alone does it faster."""
        texts = self._texts(messages, tools, add_generation_prompt)
        return texts[leading(texts, start) :]


_RENDERERS: dict[str, Callable[..., Renderer]] = {}


def register_renderer(name: str, factory: Callable[..., Renderer]) -> None:
    """Register a renderer class (or a factory `f(tokenizer, *, tool_call_parser=None)`) under `name`."""
    _RENDERERS[name] = factory


def get_renderer(name: str, tokenizer: Tokenizer, *, tool_call_parser: str | None = None) -> Renderer:
    """A renderer for the named chat format over `tokenizer` (a transformers tokenizer).

    `tool_call_parser` overrides the format's own parser (see `platoon.gateway.toolcalls`).
    """
    try:
        factory = _RENDERERS[name]
    except KeyError:
        raise UnknownRendererError(unknown_name("renderer", name, _RENDERERS)) from None
    return factory(tokenizer, tool_call_parser=tool_call_parser)


def renderer_names() -> list[str]:
    """The registered renderer names, sorted."""
    return sorted(_RENDERERS)

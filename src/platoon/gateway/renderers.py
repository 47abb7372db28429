"""Renderers: OpenAI-style messages and tool schemas to prompt tokens, and sampled tokens back
to an assistant message.

A renderer reproduces a model's chat template in Python, so a prompt is built from token
chunks the gateway can reason about: `render_segments` gives one chunk per message (plus the
tools preamble and the generation prompt), each tokenized on its own. Chunks start and end at
special tokens, so their concatenation equals `tokenizer.apply_chat_template(...)` for the
chat formats here (`role_colon` has no template: it is defined by its chunks).

Token-exact history: `render(..., completions={i: tokens})` puts the tokens that were sampled
for assistant message `i` in place of its re-rendered text, so a conversation that grows
turn by turn gives prompts that extend each other token for token, even where re-tokenizing the
text would differ, or where the template rewrites old turns (Qwen3 drops the reasoning of
assistant turns before the latest user message; a spliced turn keeps exactly what was sampled).

Conventions (the same for every renderer):
- `content` may be a string, None, or a list of parts; text parts are joined with "\\n"
  (as vLLM and SGLang do), other part types raise `RendererError`.
- Reasoning is read from `reasoning_content`, `thinking` or `reasoning` (first not None), as
  transformers does.
- Tool call arguments may be JSON strings (OpenAI) or objects.
- `tools=[]` means no tools.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, Literal

import msgspec

from platoon.gateway import jsontext
from platoon.gateway.memo import RenderMemo, Texts, leading
from platoon.gateway.shapes import Message, ParsedMessage, Tokenizer, Tool, ToolCall
from platoon.gateway.toolcalls import ToolCallParser, get_tool_call_parser
from platoon.naming import unknown_name

__all__ = [
    "Llama3Renderer",
    "ParsedMessage",
    "Qwen3InstructRenderer",
    "Qwen3Renderer",
    "Renderer",
    "RendererError",
    "RoleColonRenderer",
    "Segment",
    "SmolLM2Renderer",
    "UnknownRendererError",
    "get_renderer",
    "register_renderer",
    "renderer_names",
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


def _text(content: object, where: str) -> str:
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


def _content(message: Message, i: int) -> str:
    """The text of message `i` (`_text`, its place named only when it is wrong)."""
    content = message.get("content")
    return content if type(content) is str else _text(content, f"messages.{i}.content")


def _reasoning(message: Message) -> object:
    return next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)


def _function(call: object, where: str) -> tuple[str, object]:
    """(name, arguments) of a tool call in OpenAI (`{"function": {...}}`) or flat form."""
    function = call.get("function", call) if type(call) is dict or isinstance(call, Mapping) else None
    if not (type(function) is dict or isinstance(function, Mapping)) or not isinstance(
        function.get("name"), str
    ):
        raise RendererError(f"{where}: a tool call needs function.name")
    return function["name"], function.get("arguments", {})


def _function_at(call: object, i: int, n: int) -> tuple[str, object]:
    """`_function` of call `n` of message `i` (its place named only when it is wrong)."""
    function = call.get("function", call) if type(call) is dict else None
    if type(function) is dict and type(name := function.get("name")) is str:
        return name, function.get("arguments", {})
    return _function(call, f"messages.{i}.tool_calls.{n}")


def _arguments_object(arguments: object, where: str) -> object:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise RendererError(f"{where}: tool call arguments are not valid JSON ({exc.msg})") from None
    return arguments


def _check(messages: Sequence[Message]) -> None:
    for i, message in enumerate(messages):
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


def _role(message: Message) -> str:
    """The role of a message `_check` passed: one of `_ROLES`."""
    return str(message["role"])


def _calls(message: Message) -> list[object]:
    """The tool calls of a message `_check` passed: a list, or none."""
    calls = message.get("tool_calls")
    return calls if isinstance(calls, list) else []


_CACHE_ENTRIES = 1024
_CACHE_MAX_CHARS = 100_000


def _dumps(value: object, indent: int | None = None) -> str:
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
        _check(messages)
        listed, tools = list(messages), list(tools) if tools else None
        if memo is None:
            texts = self._texts(listed, tools, add_generation_prompt)
        else:
            texts = memo.texts(self, listed, tools, add_generation_prompt, encoded)
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
        _check(messages)
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
        text = self.tokenizer.decode(body, skip_special_tokens=False)
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


class Qwen3Renderer(Renderer):
    """Qwen3 (hybrid thinking) ChatML, as Qwen3's own chat template renders it.

    Assistant turns after the latest user query keep their reasoning in `<think>` blocks (and
    the final assistant turn always gets one); earlier turns lose it, as in the template. Tool
    results become `<tool_response>` blocks in a user turn; consecutive results share one turn.
    """

    name = "qwen3"
    default_tool_call_parser = "hermes"
    stop_token_names = ("<|im_end|>", "<|endoftext|>")
    thinking: ClassVar[bool] = True
    reasoning_markers = ("<think>", "</think>")

    def _generation_text(self) -> str:
        return "<|im_start|>assistant\n"

    def _end_of_turn_text(self) -> str:
        return "<|im_end|>"

    def _after_turn_text(self) -> str:
        return "\n"

    def _tools_preamble(self, tools: list[Tool]) -> str:
        listed = "".join("\n" + _dumps(tool) for tool in tools)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
            f"{listed}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        )

    def _last_query(self, messages: list[Message]) -> int:
        """The latest user message that is not tool results (the last message if there is none)."""
        for i in range(len(messages) - 1, -1, -1):
            if messages[i]["role"] == "user":
                content = _content(messages[i], i)
                if not (content.startswith("<tool_response>") and content.endswith("</tool_response>")):
                    return i
        return len(messages) - 1

    def _assistant_body(
        self, i: int, message: Message, content: str, last_query: int, last: bool
    ) -> tuple[str, str]:
        """(text after the turn header, content without reasoning) of an assistant message."""
        if not self.thinking:
            return content, content
        given = _reasoning(message)
        if isinstance(given, str):
            reasoning = given
        elif "</think>" in content:
            reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            content = content.split("</think>")[-1].lstrip("\n")
        else:
            reasoning = ""
        if i > last_query and (last or reasoning):
            return "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n"), content
        return content, content

    def _context(self, messages: list[Message]) -> object:
        if not self.thinking:
            return None
        try:
            return self._last_query(messages)
        except RendererError:  # the full render names the message
            return None

    def _unchanged(self, before: object, after: object, same: int) -> int:
        # A tool result's chunk depends on whether the next message is one too (they share a
        # turn); with thinking, an assistant turn's on where the latest user query is.
        if before == after:
            return same - 1
        if not (isinstance(before, int) and isinstance(after, int)):
            return 0
        return min(same - 1, min(before, after) + 1)

    def _texts(
        self, messages: list[Message], tools: list[Tool] | None, add_generation_prompt: bool
    ) -> list[tuple[int | None, str, str]]:
        return self._texts_from(messages, tools, add_generation_prompt, 0)

    def _texts_from(
        self, messages: list[Message], tools: list[Tool] | None, add_generation_prompt: bool, start: int
    ) -> Texts:
        contents = [""] * start + [_content(messages[i], i) for i in range(start, len(messages))]
        out: Texts = []
        first_is_system = bool(messages) and messages[0]["role"] == "system"
        if start == 0 and tools:
            system = contents[0] + "\n\n" if first_is_system else ""
            out.append(
                (
                    0 if first_is_system else None,
                    "system",
                    "<|im_start|>system\n" + system + self._tools_preamble(tools),
                )
            )
        elif start == 0 and first_is_system:
            out.append((0, "system", "<|im_start|>system\n" + contents[0] + "<|im_end|>\n"))
        last_query = self._last_query(messages) if self.thinking else 0
        for i in range(start, len(messages)):
            message = messages[i]
            role, content = message["role"], contents[i]
            if role == "user" or (role == "system" and i > 0):
                out.append((i, role, f"<|im_start|>{role}\n{content}<|im_end|>\n"))
            elif role == "assistant":
                body, content = self._assistant_body(i, message, content, last_query, i == len(messages) - 1)
                text = "<|im_start|>assistant\n" + body
                for n, call in enumerate(_calls(message)):
                    name, arguments = _function_at(call, i, n)
                    if n > 0 or content:
                        text += "\n"
                    rendered = arguments if isinstance(arguments, str) else _dumps(arguments)
                    text += (
                        '<tool_call>\n{"name": "' + name + '", "arguments": ' + rendered + "}\n</tool_call>"
                    )
                out.append((i, role, text + "<|im_end|>\n"))
            elif role == "tool":
                opens = i == 0 or messages[i - 1]["role"] != "tool"
                closes = i == len(messages) - 1 or messages[i + 1]["role"] != "tool"
                text = (
                    ("<|im_start|>user" if opens else "")
                    + "\n<tool_response>\n"
                    + content
                    + "\n</tool_response>"
                )
                out.append((i, role, text + ("<|im_end|>\n" if closes else "")))
        if add_generation_prompt:
            out.append((None, "assistant", self._generation_text()))
        return out

    def _split(self, text: str) -> tuple[str | None, str]:
        if "</think>" in text:
            reasoning = text.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            return reasoning, text.split("</think>")[-1].strip()
        if "<think>" in text:
            before, after = text.split("<think>", 1)
            return after.strip("\n"), before.strip()
        return None, text.strip()


class Qwen3InstructRenderer(Qwen3Renderer):
    """Qwen3 ChatML without thinking (Qwen3 Instruct-2507 style): no `<think>` blocks are written
    or read; reasoning fields on messages are ignored."""

    name = "qwen3_instruct"
    thinking = False
    _unchanged = Qwen3Renderer._unchanged  # its own: a subclass says itself that it may reuse chunks

    def _split(self, text: str) -> tuple[str | None, str]:
        return None, text.strip()


class Llama3Renderer(Renderer):
    """Llama 3.1 / 3.3 Instruct, as their chat template renders it (tools in the first user turn,
    the template's fixed dates, tool results in `ipython` turns, one tool call per message;
    an assistant message with a tool call renders the call only, not its content)."""

    name = "llama3"
    default_tool_call_parser = "llama3"
    stop_token_names = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")
    date_string: ClassVar[str] = "26 Jul 2024"

    def _generation_text(self) -> str:
        return "<|start_header_id|>assistant<|end_header_id|>\n\n"

    def _end_of_turn_text(self) -> str:
        return "<|eot_id|>"

    def _texts(
        self, messages: list[Message], tools: list[Tool] | None, add_generation_prompt: bool
    ) -> list[tuple[int | None, str, str]]:
        out: list[tuple[int | None, str, str]] = []
        bos = self.tokenizer.bos_token or ""
        offset = 0
        system_message = ""
        if messages and messages[0]["role"] == "system":
            system_message = _text(messages[0].get("content"), "messages.0.content").strip()
            offset = 1
        system = "<|start_header_id|>system<|end_header_id|>\n\n"
        if tools:
            system += "Environment: ipython\n"
        system += f"Cutting Knowledge Date: December 2023\nToday Date: {self.date_string}\n\n"
        out.append((0 if offset else None, "system", bos + system + system_message + "<|eot_id|>"))
        if tools:
            if len(messages) == offset:
                raise RendererError("llama3 puts tools in the first user message, and there is none")
            first = _text(messages[offset].get("content"), f"messages.{offset}.content").strip()
            listed = "".join(_dumps(tool, indent=4) + "\n\n" for tool in tools)
            out.append(
                (
                    offset,
                    "user",
                    "<|start_header_id|>user<|end_header_id|>\n\n"
                    "Given the following functions, please respond with a JSON for a function call "
                    "with its proper arguments that best answers the given prompt.\n\n"
                    'Respond in the format {"name": function name, "parameters": dictionary of argument '
                    "name and its value}.Do not use variables.\n\n" + listed + first + "<|eot_id|>",
                )
            )
            offset += 1
        for i in range(offset, len(messages)):
            message = messages[i]
            role = _role(message)
            calls = _calls(message)
            if role == "tool":
                content = message.get("content")
                # The template applies `tojson` to anything iterable, strings included.
                body = _dumps(content) if isinstance(content, str | list | Mapping) else str(content)
                out.append((i, role, "<|start_header_id|>ipython<|end_header_id|>\n\n" + body + "<|eot_id|>"))
            elif calls:
                if len(calls) != 1:
                    raise RendererError(
                        f"messages.{i}.tool_calls: llama3 renders exactly one tool call per message"
                    )
                name, arguments = _function(calls[0], f"messages.{i}.tool_calls.0")
                arguments = _arguments_object(arguments, f"messages.{i}.tool_calls.0")
                call = '{"name": "' + name + '", "parameters": ' + _dumps(arguments) + "}"
                out.append((i, role, self._generation_text() + call + "<|eot_id|>"))
            else:
                content = _text(message.get("content"), f"messages.{i}.content").strip()
                out.append((i, role, f"<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"))
        if add_generation_prompt:
            out.append((None, "assistant", self._generation_text()))
        return out


class SmolLM2Renderer(Renderer):
    """SmolLM2 Instruct's ChatML, as its chat template renders it: every message is
    `<|im_start|>ROLE\nCONTENT<|im_end|>\n`, and a conversation that does not open with a
    system message gets the template's default one.

    The template knows nothing of tools, so platoon writes them as plain text that the template
    then renders unchanged: the tool list goes at the end of the system message (the default one
    when there is none) in Hermes form, each tool call is appended to its assistant message's
    content as a `<tool_call>` block, and a tool result is a `tool` turn, as the template writes
    any role. `lowered_messages` gives those messages, so `apply_chat_template` on them is the
    reference these prompts match token for token.
    """

    name = "smollm2"
    default_tool_call_parser = "hermes"
    stop_token_names = ("<|im_end|>", "<|endoftext|>")
    default_system: ClassVar[str] = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

    def _generation_text(self) -> str:
        return "<|im_start|>assistant\n"

    def _end_of_turn_text(self) -> str:
        return "<|im_end|>"

    def _after_turn_text(self) -> str:
        return "\n"

    @staticmethod
    def tools_text(tools: Sequence[Tool]) -> str:
        """The tool list as it is appended to the system message."""
        listed = "".join("\n" + _dumps(tool) for tool in tools)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
            f"{listed}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within "
            "<tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
        )

    def lowered_messages(
        self, messages: Sequence[Message], tools: Sequence[Tool] | None = None
    ) -> list[dict[str, str]]:
        """The conversation as plain `{role, content}` messages, tools and tool calls written
        into the text as this renderer writes them (the default system message made explicit)."""
        _check(messages)
        out: list[dict[str, str]] = []
        for i, message in enumerate(messages):
            content = _text(message.get("content"), f"messages.{i}.content")
            for n, call in enumerate(_calls(message)):
                name, arguments = _function_at(call, i, n)
                rendered = arguments if isinstance(arguments, str) else _dumps(arguments)
                _arguments_object(rendered, f"messages.{i}.tool_calls.{n}")  # JSON, or a clear error
                if n > 0 or content:
                    content += "\n"
                content += (
                    '<tool_call>\n{"name": ' + _dumps(name) + ', "arguments": ' + rendered + "}\n</tool_call>"
                )
            out.append({"role": _role(message), "content": content})
        if messages and messages[0]["role"] != "system":
            out.insert(0, {"role": "system", "content": self.default_system})
        if tools:
            if not out:
                raise RendererError("smollm2 writes tools into the system message, and there is no message")
            out[0]["content"] += "\n\n" + self.tools_text(tools)
        return out

    def _texts(
        self, messages: list[Message], tools: list[Tool] | None, add_generation_prompt: bool
    ) -> list[tuple[int | None, str, str]]:
        lowered = self.lowered_messages(messages, tools)
        owners: list[int | None] = list(range(len(messages)))
        if messages and messages[0]["role"] != "system":
            owners.insert(0, None)  # the default system message belongs to no message
        out: list[tuple[int | None, str, str]] = [
            (owner, m["role"], f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
            for owner, m in zip(owners, lowered, strict=True)
        ]
        if add_generation_prompt:
            out.append((None, "assistant", self._generation_text()))
        return out


class RoleColonRenderer(Renderer):
    """`User: ...\\n\\nAssistant: ...\\n\\n` for base models (tinker-cookbook's role_colon).

    There is no template to match: a prompt is the concatenation of its chunks, after the BOS
    token if the tokenizer has one. Sampling stops at the string "\\n\\nUser:". No tools.
    """

    name = "role_colon"

    def __init__(self, tokenizer: Tokenizer, *, tool_call_parser: str | None = None) -> None:
        super().__init__(tokenizer, tool_call_parser=tool_call_parser)
        eos = getattr(tokenizer, "eos_token_id", None)
        self.stop_token_ids = [eos] if isinstance(eos, int) else []
        self.stop_strings = ["\n\nUser:"]

    def _generation_text(self) -> str:
        return "Assistant:"

    def _end_of_turn_text(self) -> str:
        return "\n\n"

    def completion_segment(self, completion: Sequence[int]) -> list[int]:
        """The sampled tokens (without a final EOS) closed by "\n\n" unless they end with it.

        Chunks here do not end at special tokens, so the caller should pass a completion cut
        before the stop string.
        """
        body = list(completion)
        if body and body[-1] in self.stop_token_ids:
            body = body[:-1]
        if not self.tokenizer.decode(body, skip_special_tokens=False).endswith("\n\n"):
            body += self._encode("\n\n")
        return self.generation_prompt() + body

    def _texts(
        self, messages: list[Message], tools: list[Tool] | None, add_generation_prompt: bool
    ) -> list[tuple[int | None, str, str]]:
        if tools:
            raise RendererError("role_colon cannot render tools")
        out: list[tuple[int | None, str, str]] = []
        bos = getattr(self.tokenizer, "bos_token", None)
        if bos:
            out.append((None, "bos", bos))
        for i, message in enumerate(messages):
            role = _role(message)
            if role == "tool" or message.get("tool_calls"):
                raise RendererError(f"messages.{i}: role_colon cannot render tool calls or tool results")
            content = _text(message.get("content"), f"messages.{i}.content")
            out.append((i, role, f"{role.capitalize()}: {content}\n\n"))
        if add_generation_prompt:
            out.append((None, "assistant", self._generation_text()))
        return out


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


register_renderer("qwen3", Qwen3Renderer)
register_renderer("qwen3_instruct", Qwen3InstructRenderer)
register_renderer("llama3", Llama3Renderer)
register_renderer("role_colon", RoleColonRenderer)
register_renderer("smollm2", SmolLM2Renderer)

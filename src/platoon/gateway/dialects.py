"""The API dialects the gateway speaks, as pure translations to and from chat messages.

Every dialect becomes one call of `Gateway.complete` on OpenAI-style chat messages, so every
dialect's calls are recorded and trained the same way:

* OpenAI Chat Completions (`/v1/chat/completions`), the gateway's native form;
* OpenAI Responses (`/v1/responses`), as Codex-style agents use;
* Anthropic Messages (`/v1/messages`), as Claude-Code-style agents use.

Each `*_request` function reads a request body into its dialect's struct (`bodies`: the
schema of what each dialect accepts) and returns `(messages, tools, params, stream)`; each
`*_response` function shapes the answer. A bad body raises `DialectError` naming the field.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

import msgspec
from msgspec import Struct

from platoon.gateway import bodies, jsontext
from platoon.gateway.bodies import (
    ChatToolChoice,
    ChoiceTool,
    DialectError,
    FunctionCall,
    FunctionCallOutput,
    ResponsesMessage,
    ResponsesToolChoice,
    SystemMessage,
    Text,
    ToolResultBlock,
    ToolUseBlock,
)
from platoon.gateway.shapes import (
    AnthropicBlock,
    AnthropicReply,
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    JsonObject,
    Message,
    Messages,
    ResponsesItem,
    ResponsesReply,
    Tool,
    ToolCall,
)
from platoon.gateway.shapes import ResponsesMessage as ResponsesMessageItem
from platoon.gateway.shapes import ResponsesText as ResponsesTextPart

__all__ = [
    "DialectError",
    "anthropic_call",
    "anthropic_request",
    "anthropic_response",
    "anthropic_stream",
    "chat_request",
    "chat_response",
    "chat_stream",
    "count_tokens_request",
    "responses_request",
    "responses_response",
    "responses_stream",
]

_OPENAI_WHOLE = {
    "tool_choice": "expected auto, none, required or a function tool by name",
    "stop": "expected a string or an array of strings",
}
_ROLE = re.compile(r"messages\.\d+\.role")


class Call(NamedTuple):
    """What a request asks the gateway: one call of `Gateway.complete`."""

    messages: list[Message]
    tools: list[Tool] | None
    params: dict[str, object]
    stream: bool


class ChatCall(NamedTuple):
    """What a chat completions request asks: `n` calls of `Gateway.complete`."""

    messages: Messages
    tools: list[Tool] | None
    params: dict[str, object]
    n: int
    stream: bool


# --- OpenAI Chat Completions -----------------------------------------------------------------


def chat_request(body: Mapping[str, object]) -> ChatCall:
    """The call a chat completions body asks for.

    The messages and tools are the body's own (developer read as system): the renderer reads
    their fields as the client sent them, and a tool's JSON is part of the prompt.
    """
    try:
        request = bodies.read(body, bodies.ChatRequest, "chat completions", _OPENAI_WHOLE)
    except DialectError as exc:
        if exc.param is not None and _ROLE.fullmatch(exc.param):
            exc.param = exc.param.rpartition(".")[0]  # a message is known by its role: name it
        raise
    _openai_ranges(request.temperature, request.top_p)
    top = bodies.top_logprobs(request.top_logprobs)
    typed = request.messages  # as the call is recorded: developer read as system, as rendered
    for i, message in enumerate(typed):
        if message.role == "tool" and not message.tool_call_id:
            raise DialectError(
                "Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id'.",
                f"messages.{i}.tool_call_id",
            )
        if message.role == "developer":
            typed[i] = msgspec.structs.replace(message, role="system")
    choice = request.tool_choice
    params: dict[str, object] = {
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,
        "max_tokens": request.max_tokens
        if request.max_completion_tokens is None
        else request.max_completion_tokens,
        "stop": [request.stop] if isinstance(request.stop, str) else request.stop,
        "seed": request.seed,
        "tool_choice": {"name": choice.function.name} if isinstance(choice, ChatToolChoice) else choice,
        "parallel_tool_calls": request.parallel_tool_calls,
        # Alternatives come back with the logprobs, so only a call that asks for those samples them.
        "top_logprobs": top if request.logprobs else None,
        "response_format": bodies.output_format(request.response_format, "response_format"),
    }
    messages: list[Message] = [_read_as_system(m) for m in _objects(body.get("messages"))]
    tools = _objects(body.get("tools")) if request.tools is not None else None
    return ChatCall(Messages(messages, typed=typed), tools, params, request.n or 1, bool(request.stream))


def _openai_ranges(temperature: float | None, top_p: float | None) -> None:
    """OpenAI's ranges, refused in its words: temperature from 0 to 2, top_p from 0 to 1."""
    for name, value, high in (("temperature", temperature, 2), ("top_p", top_p, 1)):
        if value is None or 0 <= value <= high:
            continue
        above = value > high
        side, bound = ("above maximum", f"<= {high}") if above else ("below minimum", ">= 0")
        raise DialectError(
            f"Invalid '{name}': decimal {side} value. Expected a value {bound}, but got {value} instead.",
            name,
            "decimal_above_max_value" if above else "decimal_below_min_value",
        )


def _anthropic_ranges(temperature: float | None, top_p: float | None) -> None:
    """Anthropic's ranges, refused in its words: temperature and top_p from 0 to 1."""
    for name, value in (("temperature", temperature), ("top_p", top_p)):
        if value is not None and not 0 <= value <= 1:
            side = "less than or equal to 1" if value > 1 else "greater than or equal to 0"
            raise DialectError(f"{name}: Input should be {side}", name)


def _objects(value: object) -> list[Mapping[str, object]]:
    """A list the body's struct has shown to hold only objects."""
    if not isinstance(value, list):
        return []
    return [item for item in value if type(item) is dict or isinstance(item, Mapping)]


def _read_as_system(message: Mapping[str, object]) -> Message:
    """A developer message read as a system one; any other as it is (never written to, so not
    copied: an agent's history is sent whole on every call)."""
    return {**message, "role": "system"} if message["role"] == "developer" else message


class Logprobs(NamedTuple):
    """A choice's logprobs as the client reads them: each token's text and logprob, and the top
    alternatives at each (text, logprob), when asked for."""

    tokens: list[str]
    logprobs: list[float]
    top: list[list[tuple[str, float]]] | None = None


def _logprobs_content(logprobs: Logprobs) -> JsonObject:
    return {"content": _token_logprobs(logprobs)}


def _token_logprobs(logprobs: Logprobs) -> list[JsonObject]:
    """Each token's text, logprob, bytes and top alternatives, as chat and Responses write them."""
    tops = logprobs.top or [[] for _ in logprobs.tokens]
    return [
        {
            "token": t,
            "logprob": lp,
            "bytes": list(t.encode()),
            "top_logprobs": [{"token": a, "logprob": alp, "bytes": list(a.encode())} for a, alp in top],
        }
        for t, lp, top in zip(logprobs.tokens, logprobs.logprobs, tops, strict=False)
    ]


def chat_response(
    model: str,
    choices: list[tuple[AssistantMessage, str, Logprobs | None]],
    usage: tuple[int, int],
    response_id: str,
) -> ChatCompletion:
    """A chat.completion object; each choice is (message, finish_reason, logprobs or None)."""
    return {
        "id": f"chatcmpl-{response_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": i,
                "message": message,
                "logprobs": _logprobs_content(lp) if lp is not None else None,
                "finish_reason": finish,
            }
            for i, (message, finish, lp) in enumerate(choices)
        ],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }


def chat_stream(response: ChatCompletion, include_usage: bool) -> Iterator[str]:
    """The SSE `data:` payloads of a finished chat completion, as a stream would carry them."""
    stream = ChatStream(response["id"], response["model"], response["created"], include_usage)
    for choice in response["choices"]:
        yield from stream.start(choice["index"])
        yield from stream.choice_end(choice)
    yield from stream.finish(response)


class ChatStream:
    """The SSE `data:` payloads of a chat completion while it is sampled: `start`, a `delta` per
    piece of content as it comes, then `end` with the finished response (what was not streamed)."""

    def __init__(self, response_id: str, model: str, created: int, include_usage: bool) -> None:
        self.base = {"id": response_id, "created": created, "model": model, "object": "chat.completion.chunk"}
        self.include_usage = include_usage
        self.sent = ""

    def _chunk(self, choices: list[JsonObject], **extra: object) -> str:
        return json.dumps(self.base | {"choices": choices} | extra)

    def start(self, index: int = 0) -> Iterator[str]:
        self.sent = ""
        yield self._chunk(
            [{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
        )

    def delta(self, text: str, index: int = 0) -> Iterator[str]:
        self.sent += text
        yield self._chunk([{"index": index, "delta": {"content": text}, "finish_reason": None}])

    def end(self, response: ChatCompletion) -> Iterator[str]:
        yield from self.choice_end(response["choices"][0])
        yield from self.finish(response)

    def choice_end(self, choice: ChatChoice) -> Iterator[str]:
        index, message = choice["index"], choice["message"]
        delta: JsonObject
        if message.get("reasoning_content"):
            delta = {"reasoning_content": message["reasoning_content"]}
            yield self._chunk([{"index": index, "delta": delta, "finish_reason": None}])
        # Logprobs travel with the content, or with the last chunk when there is none.
        logprobs = choice["logprobs"]
        content = message.get("content") or ""
        rest = content[len(self.sent) :] if content.startswith(self.sent) else ""
        if rest:
            delta = {"content": rest}
            yield self._chunk([{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}])
            logprobs = None
        for n, call in enumerate(message.get("tool_calls") or []):
            delta = {"tool_calls": [{"index": n, **call}]}
            yield self._chunk([{"index": index, "delta": delta, "finish_reason": None}])
        last = {"index": index, "delta": {}, "logprobs": logprobs, "finish_reason": choice["finish_reason"]}
        yield self._chunk([last])

    def finish(self, response: ChatCompletion) -> Iterator[str]:
        if self.include_usage:
            yield self._chunk([], usage=response["usage"])
        yield "[DONE]"

    def error(self, kind: str, message: str) -> Iterator[str]:
        yield json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})


# --- OpenAI Responses ------------------------------------------------------------------------


def _text(content: str | Sequence[Struct], where: str, *at: int, what: str = "content part") -> str:
    """A string, or the text of an array of text parts joined by newlines; `where.format(*at)`
    names the content in an error."""
    if isinstance(content, str):
        return content
    texts = []
    for n, part in enumerate(content):
        if not isinstance(part, Text):
            param = f"{where.format(*at)}.{n}"
            raise DialectError(f"{param}: expected a text {what}, got {bodies.tag(part)}", param)
        texts.append(part.text)
    return "\n".join(texts)


def responses_request(body: Mapping[str, object]) -> Call:
    """The call a Responses API body asks for."""
    items = body.get("input") if isinstance(body, dict) else None
    if isinstance(items, list) and any(isinstance(i, dict) and "type" not in i for i in items):
        # A message item may leave out its type, which is the struct's tag.
        items = [i if not isinstance(i, dict) or "type" in i else {**i, "type": "message"} for i in items]
        body = {**body, "input": items}
    request = bodies.read(body, bodies.ResponsesRequest, "Responses", _OPENAI_WHOLE)
    messages: list[Message] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    items = (
        [ResponsesMessage(role="user", content=request.input)]
        if isinstance(request.input, str)
        else request.input
    )
    # The message last added when it is an assistant's, and its tool calls (a list that becomes
    # its "tool_calls" with the first call).
    assistant: tuple[JsonObject, list[JsonObject]] | None = None
    for i, item in enumerate(items):
        if isinstance(item, ResponsesMessage):
            role = "system" if item.role == "developer" else item.role
            entry: JsonObject = {"role": role, "content": _text(item.content, "input.{}.content", i)}
            messages.append(entry)
            assistant = (entry, []) if role == "assistant" else None
        elif isinstance(item, FunctionCall):
            call: JsonObject = {
                "id": item.call_id or item.id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments or "{}"},
            }
            if assistant is not None:
                entry, calls = assistant
                if not calls:
                    entry["tool_calls"] = calls
                calls.append(call)
            else:
                calls = [call]
                entry = {"role": "assistant", "content": None, "tool_calls": calls}
                messages.append(entry)
                assistant = (entry, calls)
        elif isinstance(item, FunctionCallOutput):
            text = _text(item.output, "input.{}.output", i)
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": text})
            assistant = None
        # Reasoning items: the reasoning of earlier turns is not sent back to the model.
    tools: list[Tool] | None = None
    if request.tools:
        tools = []
        for n, tool in enumerate(request.tools):
            if tool.type != "function" or tool.name is None:
                raise DialectError(
                    f"tools.{n}: only function tools (with a name) are supported, got {tool.type}",
                    f"tools.{n}",
                )
            function = {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters or {"type": "object", "properties": {}},
            }
            tools.append({"type": "function", "function": function})
    _openai_ranges(request.temperature, request.top_p)
    top = bodies.top_logprobs(request.top_logprobs)
    choice = request.tool_choice
    params: dict[str, object] = {
        "temperature": request.temperature,
        "top_p": request.top_p,
        "max_tokens": request.max_output_tokens,
        "tool_choice": {"name": choice.name} if isinstance(choice, ResponsesToolChoice) else choice,
        "parallel_tool_calls": request.parallel_tool_calls,
        # Alternatives come back with the output text's logprobs, so only a call that includes
        # those samples them.
        "top_logprobs": (top or 0) if RESPONSES_LOGPROBS in (request.include or ()) else None,
        "response_format": bodies.output_format(request.text.format if request.text else None, "text.format"),
    }
    return Call(messages, tools, params, bool(request.stream))


RESPONSES_LOGPROBS = "message.output_text.logprobs"  # what a Responses body includes to get them


def responses_response(
    model: str,
    message: AssistantMessage,
    finish: str,
    usage: tuple[int, int],
    rid: str,
    logprobs: Logprobs | None = None,
) -> ResponsesReply:
    output: list[ResponsesItem] = []
    if message.get("reasoning_content"):
        output.append(
            {
                "type": "reasoning",
                "id": f"rs_{rid}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}],
            }
        )
    content = message.get("content")
    if content:
        output.append(
            {
                "type": "message",
                "id": f"msg_{rid}",
                "status": "completed",
                "role": "assistant",
                "content": [_output_text(content, logprobs)],
            }
        )
    for n, call in enumerate(message.get("tool_calls") or []):
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{rid}_{n}",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    incomplete = finish == "length"
    return {
        "id": f"resp_{rid}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": usage[0],
            "output_tokens": usage[1],
            "total_tokens": sum(usage),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def _output_text(text: str, logprobs: Logprobs | None = None) -> ResponsesTextPart:
    part: ResponsesTextPart = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = _token_logprobs(logprobs)
    return part


def responses_stream(response: ResponsesReply) -> Iterator[tuple[str, str]]:
    """(event, data) pairs of the Responses streaming protocol for a finished response."""
    stream = ResponsesStream(response["id"], response["model"], response["created_at"])
    yield from stream.start()
    yield from stream.end(response)


class ResponsesStream:
    """The Responses streaming protocol while a reply is sampled: `start`, `delta` per piece of
    text (the message item opens with the first), `end` with the finished response."""

    def __init__(self, response_id: str, model: str, created_at: int) -> None:
        self.response_id = response_id
        self.skeleton: JsonObject = {
            "id": response_id,
            "object": "response",
            "created_at": created_at,
            "status": "in_progress",
            "model": model,
            "output": [],
        }
        self.seq = 0
        self.sent = ""
        self.message_id: str | None = None

    def _event(self, kind: str, **data: object) -> tuple[str, str]:
        self.seq += 1
        return kind, json.dumps({"type": kind, "sequence_number": self.seq} | data)

    def start(self) -> Iterator[tuple[str, str]]:
        yield self._event("response.created", response=self.skeleton)
        yield self._event("response.in_progress", response=self.skeleton)

    def delta(self, text: str) -> Iterator[tuple[str, str]]:
        if self.message_id is None:
            self.message_id = f"msg_{self.response_id.removeprefix('resp_')}"
            item = {
                "type": "message",
                "id": self.message_id,
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            yield self._event("response.output_item.added", output_index=0, item=item)
            part = {"type": "output_text", "text": "", "annotations": []}
            yield self._event(
                "response.content_part.added",
                item_id=self.message_id,
                output_index=0,
                content_index=0,
                part=part,
            )
        self.sent += text
        common = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        yield self._event("response.output_text.delta", delta=text, logprobs=[], **common)

    def end(self, response: ResponsesReply) -> Iterator[tuple[str, str]]:
        output = list(response["output"])
        if self.message_id is not None:
            # The streamed message went out first: it keeps index 0 and its id.
            sampled = next((o for o in output if o["type"] == "message"), None)
            output = [o for o in output if o is not sampled]
            part = sampled["content"][0] if sampled else _output_text(self.sent)
            text = part["text"]
            message: ResponsesMessageItem = {
                "type": "message",
                "id": self.message_id,
                "status": sampled["status"] if sampled else "completed",
                "role": "assistant",
                "content": [part],
            }
            rest = text[len(self.sent) :] if text.startswith(self.sent) else ""
            if rest:
                yield from self.delta(rest)
            common = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
            logprobs = part.get("logprobs", [])
            yield self._event("response.output_text.done", text=text, logprobs=logprobs, **common)
            yield self._event("response.content_part.done", part=message["content"][0], **common)
            yield self._event("response.output_item.done", output_index=0, item=message)
            output = [message, *output]
            response = {**response, "output": output}
        first = 1 if self.message_id is not None else 0
        for index, item in enumerate(output[first:], start=first):
            yield from self._item(index, item)
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        yield self._event(kind, response=response)

    def _item(self, index: int, item: ResponsesItem) -> Iterator[tuple[str, str]]:
        if item["type"] == "message":
            empty = {**item, "status": "in_progress", "content": []}
            yield self._event("response.output_item.added", output_index=index, item=empty)
            part = {"type": "output_text", "text": "", "annotations": []}
            common = {"item_id": item["id"], "output_index": index, "content_index": 0}
            yield self._event("response.content_part.added", part=part, **common)
            text = item["content"][0]["text"]
            yield self._event("response.output_text.delta", delta=text, logprobs=[], **common)
            logprobs = item["content"][0].get("logprobs", [])
            yield self._event("response.output_text.done", text=text, logprobs=logprobs, **common)
            yield self._event("response.content_part.done", part=item["content"][0], **common)
        elif item["type"] == "function_call":
            added = {**item, "arguments": "", "status": "in_progress"}
            yield self._event("response.output_item.added", output_index=index, item=added)
            common = {"item_id": item["id"], "output_index": index}
            yield self._event("response.function_call_arguments.delta", delta=item["arguments"], **common)
            yield self._event(
                "response.function_call_arguments.done",
                arguments=item["arguments"],
                name=item["name"],
                **common,
            )
        else:
            yield self._event("response.output_item.added", output_index=index, item=item)
        yield self._event("response.output_item.done", output_index=index, item=item)

    def error(self, kind: str, message: str) -> Iterator[tuple[str, str]]:
        yield self._event("error", code=kind, message=message, param=None)


# --- Anthropic Messages ----------------------------------------------------------------------


MESSAGES_WHOLE = {"stop_sequences": "expected an array of non-empty strings"}
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def anthropic_request(body: Mapping[str, object]) -> Call:
    """The call an Anthropic Messages body asks for."""
    return anthropic_call(bodies.read(body, bodies.MessagesRequest, "Messages", MESSAGES_WHOLE))


def count_tokens_request(body: Mapping[str, object]) -> tuple[list[Message], list[Tool] | None]:
    """(messages, tools) of an Anthropic count_tokens body: a Messages body without max_tokens."""
    call = anthropic_call(bodies.read(body, bodies.CountTokensRequest, "Messages", MESSAGES_WHOLE))
    return call.messages, call.tools


def anthropic_call(request: bodies.MessagesRequest) -> Call:
    """The call a Messages request (read by `bodies`) asks for."""
    _anthropic_ranges(request.temperature, request.top_p)
    messages: list[Message] = []
    if request.system is not None:
        messages.append({"role": "system", "content": _text(request.system, "system", what="block")})
    for i, message in enumerate(request.messages):
        content, assistant = message.content, type(message) is bodies.AssistantMessage
        if isinstance(message, SystemMessage):
            messages.append(
                {"role": "system", "content": _text(content, "messages.{}.content", i, what="block")}
            )
            continue
        if isinstance(content, str):
            messages.append({"role": "assistant" if assistant else "user", "content": content})
            continue
        texts: list[str] = []
        calls: list[ToolCall] = []
        for n, block in enumerate(content):
            if isinstance(block, Text):
                texts.append(block.text)
            elif isinstance(block, ToolUseBlock):
                arguments = jsontext.dumps(block.input or {})
                calls.append(
                    {
                        "id": block.id,
                        "type": "function",
                        "function": {"name": block.name, "arguments": arguments},
                    }
                )
            elif isinstance(block, ToolResultBlock):
                where = "messages.{}.content.{}.content"
                text = "" if block.content is None else _text(block.content, where, i, n, what="block")
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": block.tool_use_id,
                        "content": f"Error: {text}" if block.is_error else text,
                    }
                )
            # Thinking blocks: the thinking of earlier turns is not sent back to the model.
        if assistant:
            entry: AssistantMessage = {"role": "assistant", "content": "\n".join(texts) or None}
            if calls:
                entry["tool_calls"] = calls
            messages.append(entry)
        elif texts:
            messages.append({"role": "user", "content": "\n".join(texts)})
    choice = request.tool_choice
    params: dict[str, object] = {
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,
        "max_tokens": request.max_tokens,
        "stop": request.stop_sequences or None,
        "tool_choice": None
        if choice is None
        else {"name": choice.name}
        if isinstance(choice, ChoiceTool)
        else _CHOICES[bodies.tag(choice)],
        "parallel_tool_calls": False if choice is not None and choice.disable_parallel_tool_use else None,
        "response_format": bodies.output_format(
            request.output_config.format if request.output_config else None,
            "output_config.format",
            strict=True,
        ),
    }
    return Call(messages, _anthropic_tools(request.tools), params, bool(request.stream))


def _anthropic_tools(tools: Sequence[bodies.AnthropicTool] | None) -> list[Tool] | None:
    """Messages tools as OpenAI function tools."""
    if not tools:
        return None
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.input_schema or {"type": "object", "properties": {}},
            },
        }
        for tool in tools
    ]


_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def anthropic_response(
    model: str,
    message: AssistantMessage,
    finish: str,
    usage: tuple[int, int],
    rid: str,
    stop_sequence: str | None = None,
) -> AnthropicReply:
    content: list[AnthropicBlock] = []
    if message.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    text = message.get("content")
    if text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        try:
            arguments = json.loads(call["function"]["arguments"] or "{}")
        except json.JSONDecodeError:
            arguments = {}
        content.append(
            {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": arguments}
        )
    return {
        "id": f"msg_{rid}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "stop_sequence"
        if stop_sequence is not None
        else _STOP_REASONS.get(finish, "end_turn"),
        "stop_sequence": stop_sequence,
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }


def anthropic_stream(response: AnthropicReply) -> Iterator[tuple[str, str]]:
    """(event, data) pairs of Anthropic's streaming protocol for a finished message."""
    stream = MessagesStream(response["id"], response["model"], response["usage"]["input_tokens"])
    yield from stream.start()
    yield from stream.end(response)


class MessagesStream:
    """Anthropic's streaming protocol while a reply is sampled: `start`, `delta` per piece of
    text (a text block opens with the first), `end` with the finished message."""

    def __init__(self, message_id: str, model: str, input_tokens: int) -> None:
        self.message: JsonObject = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0},
        }
        self.sent = ""
        self.text_open = False

    @staticmethod
    def _event(kind: str, **data: object) -> tuple[str, str]:
        return kind, json.dumps({"type": kind} | data)

    def start(self) -> Iterator[tuple[str, str]]:
        yield self._event("message_start", message=self.message)

    def delta(self, text: str) -> Iterator[tuple[str, str]]:
        if not self.text_open:
            self.text_open = True
            yield self._event("content_block_start", index=0, content_block={"type": "text", "text": ""})
        self.sent += text
        yield self._event("content_block_delta", index=0, delta={"type": "text_delta", "text": text})

    def end(self, response: AnthropicReply) -> Iterator[tuple[str, str]]:
        blocks = list(response["content"])
        index = 0
        if self.text_open:
            text_block = next((b for b in blocks if b["type"] == "text"), None)
            blocks = [b for b in blocks if b is not text_block]
            text = text_block["text"] if text_block else self.sent
            rest = text[len(self.sent) :] if text.startswith(self.sent) else ""
            if rest:
                yield from self.delta(rest)
            yield self._event("content_block_stop", index=0)
            index = 1
        for block in blocks:
            yield from self._block(index, block)
            index += 1
        delta = {"stop_reason": response["stop_reason"], "stop_sequence": response.get("stop_sequence")}
        # The prompt's size is known only now when the reply streamed: it goes with the end too.
        yield self._event("message_delta", delta=delta, usage=dict(response["usage"]))
        yield self._event("message_stop")

    def _block(self, index: int, block: AnthropicBlock) -> Iterator[tuple[str, str]]:
        if block["type"] == "text":
            yield self._event("content_block_start", index=index, content_block={"type": "text", "text": ""})
            delta = {"type": "text_delta", "text": block["text"]}
        elif block["type"] == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            yield self._event("content_block_start", index=index, content_block=start)
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
        else:
            yield self._event("content_block_start", index=index, content_block={**block, "input": {}})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield self._event("content_block_delta", index=index, delta=delta)
        yield self._event("content_block_stop", index=index)

    def error(self, kind: str, message: str) -> Iterator[tuple[str, str]]:
        yield self._event("error", error={"type": kind, "message": message})

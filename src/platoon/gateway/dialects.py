"""The API dialects the gateway speaks, as pure translations to and from chat messages.

Every dialect becomes one call of `Gateway.complete` on OpenAI-style chat messages, so every
dialect's calls are recorded and trained the same way:

* OpenAI Chat Completions (`/v1/chat/completions`), the gateway's native form;
* OpenAI Responses (`/v1/responses`), as Codex-style agents use;
* Anthropic Messages (`/v1/messages`), as Claude-Code-style agents use.

Each `*_request` function validates a request body and returns
`(messages, tools, params, stream)`; each `*_response` function shapes the answer. A bad body
raises `DialectError` naming the field.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "DialectError",
    "anthropic_request",
    "anthropic_response",
    "anthropic_stream",
    "chat_request",
    "chat_response",
    "chat_stream",
    "responses_request",
    "responses_response",
    "responses_stream",
]


class DialectError(ValueError):
    """A request body that does not follow its dialect; `param` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _expect(body: Mapping[str, Any], key: str, types: type | tuple[type, ...], what: str) -> Any:
    value = body.get(key)
    if value is not None and not isinstance(value, types):
        raise DialectError(f"{key}: expected {what}, got {type(value).__name__}", key)
    return value


def _number(body: Mapping[str, Any], key: str) -> float | None:
    value = body.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise DialectError(f"{key}: expected a number, got {type(value).__name__}", key)
    return value


def _check_keys(
    body: Mapping[str, Any],
    api: str,
    known: frozenset[str],
    only_if: Mapping[str, Any],
) -> None:
    """Refuse, naming it, every field the gateway would otherwise ignore.

    `known` fields are honoured, or are hints with nothing to honour (metadata, cache keys,
    a reasoning effort: the policy's own chat template decides how it reasons). `only_if` maps
    a field to a check of its value: values the gateway cannot honour (a penalty, a JSON
    output format, top log-probabilities) are refused rather than silently dropped.
    """
    for key, value in body.items():
        if key in known:
            continue
        check = only_if.get(key)
        if check is None:
            raise DialectError(f"{key}: not a {api} parameter the gateway honours", key)
        if value is not None and not check(value):
            shown = json.dumps(value)
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise DialectError(f"{key}: the gateway cannot honour {shown} (it samples the policy as is)", key)


def _text_format(value: Any) -> bool:
    return isinstance(value, Mapping) and value.get("type", "text") == "text"


_NO_VALUE: dict[str, Any] = {
    "top_logprobs": lambda v: v == 0,
    "frequency_penalty": lambda v: v == 0,
    "presence_penalty": lambda v: v == 0,
    "logit_bias": lambda v: v == {},
    "response_format": _text_format,
    "modalities": lambda v: v == ["text"],
    "functions": lambda v: v == [],
    "function_call": lambda v: v in ("auto", "none"),
    "prediction": lambda v: False,
    "audio": lambda v: False,
    "web_search_options": lambda v: False,
    "truncation": lambda v: v == "disabled",
    "background": lambda v: v is False,
    "max_tool_calls": lambda v: False,
    "conversation": lambda v: False,
    "prompt": lambda v: False,
    "text": lambda v: isinstance(v, Mapping) and _text_format(v.get("format", {"type": "text"})),
    "output_config": lambda v: isinstance(v, Mapping) and v.get("format") is None,
    "container": lambda v: False,
    "mcp_servers": lambda v: v == [],
}
_HINTS = frozenset(
    {"model", "user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"}
)
_CHAT_KEYS = _HINTS | {
    "messages", "tools", "tool_choice", "parallel_tool_calls", "stop", "max_tokens",
    "max_completion_tokens", "temperature", "top_p", "top_k", "n", "stream", "stream_options",
    "seed", "logprobs", "reasoning_effort", "verbosity",
}  # fmt: skip
_RESPONSES_KEYS = _HINTS | {
    "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
    "temperature", "top_p", "stream", "stream_options", "previous_response_id", "include",
    "reasoning", "client_metadata", "prompt_cache_retention",
}  # fmt: skip
_MESSAGES_KEYS = _HINTS | {
    "messages", "system", "max_tokens", "stop_sequences", "temperature", "top_p", "top_k",
    "stream", "tools", "tool_choice", "thinking", "context_management",
}  # fmt: skip


def _openai_tool_choice(value: Any, nested: bool) -> Any:
    """ "auto", "none", "required" or {"name": ...} from an OpenAI tool_choice."""
    if value is None or value in ("auto", "none", "required"):
        return value
    if isinstance(value, Mapping) and value.get("type") == "function":
        function = value.get("function") if nested else value
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            return {"name": function["name"]}
    raise DialectError("tool_choice: expected auto, none, required or a function tool by name", "tool_choice")


def _model(body: Mapping[str, Any]) -> None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise DialectError("model: expected a string", "model")


def _int(body: Mapping[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise DialectError(f"{key}: expected an integer, got {type(value).__name__}", key)
    return value


# --- OpenAI Chat Completions -----------------------------------------------------------------


def chat_request(
    body: Any,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any], int, bool]:
    """(messages, tools, params, n, stream) of a chat completions body."""
    if not isinstance(body, Mapping):
        raise DialectError("the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise DialectError("messages: expected a non-empty array of messages", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise DialectError(f"messages.{i}: expected an object with a role", f"messages.{i}")
    _check_keys(body, "chat completions", _CHAT_KEYS, _NO_VALUE)
    _model(body)
    tools = _expect(body, "tools", list, "an array of tools")
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    elif stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise DialectError("stop: expected a string or an array of strings", "stop")
    max_tokens = _int(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens")
    params = {
        "temperature": _number(body, "temperature"),
        "top_p": _number(body, "top_p"),
        "top_k": _int(body, "top_k"),
        "max_tokens": max_tokens,
        "stop": stop,
        "seed": _int(body, "seed"),
        "tool_choice": _openai_tool_choice(body.get("tool_choice"), nested=True),
        "parallel_tool_calls": _expect(body, "parallel_tool_calls", bool, "a boolean"),
    }
    _expect(body, "logprobs", bool, "a boolean")
    n = _int(body, "n")
    n = 1 if n is None else n
    if n < 1 or n > 16:
        raise DialectError("n: expected an integer from 1 to 16", "n")
    stream = bool(_expect(body, "stream", bool, "a boolean"))
    # "developer" is what newer OpenAI clients call the system role.
    messages = [{**m, "role": "system"} if m["role"] == "developer" else dict(m) for m in messages]
    return messages, tools, params, n, stream


def _logprobs_content(tokens: list[str], logprobs: list[float]) -> dict[str, Any]:
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for t, lp in zip(tokens, logprobs, strict=False)
        ]
    }


def chat_response(
    model: str,
    choices: list[tuple[dict[str, Any], str, tuple[list[str], list[float]] | None]],
    usage: tuple[int, int],
    response_id: str,
) -> dict[str, Any]:
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
                "logprobs": _logprobs_content(*lp) if lp is not None else None,
                "finish_reason": finish,
            }
            for i, (message, finish, lp) in enumerate(choices)
        ],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)},
    }


def chat_stream(response: dict[str, Any], include_usage: bool) -> Iterator[str]:
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

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> str:
        return json.dumps(self.base | {"choices": choices} | extra)

    def start(self, index: int = 0) -> Iterator[str]:
        self.sent = ""
        yield self._chunk(
            [{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
        )

    def delta(self, text: str, index: int = 0) -> Iterator[str]:
        self.sent += text
        yield self._chunk([{"index": index, "delta": {"content": text}, "finish_reason": None}])

    def end(self, response: dict[str, Any]) -> Iterator[str]:
        yield from self.choice_end(response["choices"][0])
        yield from self.finish(response)

    def choice_end(self, choice: dict[str, Any]) -> Iterator[str]:
        index, message = choice["index"], choice["message"]
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

    def finish(self, response: dict[str, Any]) -> Iterator[str]:
        if self.include_usage:
            yield self._chunk([], usage=response["usage"])
        yield "[DONE]"

    def error(self, kind: str, message: str) -> Iterator[str]:
        yield json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})


# --- OpenAI Responses ------------------------------------------------------------------------


def _joined_text(content: Any, where: str, kinds: tuple[str, ...], what: str) -> str:
    """A string, or the text of an array of text parts (of the given `type`s) joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for n, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") not in kinds:
                raise DialectError(f"{where}.{n}: expected a text {what}", f"{where}.{n}")
            texts.append(str(part.get("text", "")))
        return "\n".join(texts)
    raise DialectError(f"{where}: expected a string or an array of {what}s", where)


def _input_text(content: Any, where: str) -> str:
    return _joined_text(content, where, ("input_text", "output_text", "text"), "content part")


def responses_request(
    body: Any,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any], bool]:
    """(messages, tools, params, stream) of a Responses API body."""
    if not isinstance(body, Mapping):
        raise DialectError("the body must be a JSON object")
    _check_keys(body, "Responses", _RESPONSES_KEYS, _NO_VALUE)
    _model(body)
    _expect(body, "previous_response_id", str, "a string")
    messages: list[dict[str, Any]] = []
    instructions = _expect(body, "instructions", str, "a string")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise DialectError("input: expected a string or a non-empty array of items", "input")
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise DialectError(f"input.{i}: expected an object", f"input.{i}")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise DialectError(
                    f"input.{i}.role: expected user, assistant, system or developer", f"input.{i}.role"
                )
            role = "system" if role == "developer" else role
            messages.append({"role": role, "content": _input_text(item.get("content"), f"input.{i}.content")})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id") or item.get("id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _input_text(output, f"input.{i}.output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            continue  # the reasoning of earlier turns is not sent back to the model
        else:
            raise DialectError(f"input.{i}.type: {kind!r} items are not supported", f"input.{i}.type")
    tools = None
    raw_tools = _expect(body, "tools", list, "an array of tools")
    if raw_tools:
        tools = []
        for n, tool in enumerate(raw_tools):
            if not isinstance(tool, Mapping) or tool.get("type") != "function":
                raise DialectError(f"tools.{n}: only function tools are supported", f"tools.{n}")
            tools.append(
                {
                    "type": "function",
                    "function": {
                        "name": tool.get("name"),
                        "description": tool.get("description", ""),
                        "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
                    },
                }
            )
    params = {
        "temperature": _number(body, "temperature"),
        "top_p": _number(body, "top_p"),
        "max_tokens": _int(body, "max_output_tokens"),
        "tool_choice": _openai_tool_choice(body.get("tool_choice"), nested=False),
        "parallel_tool_calls": _expect(body, "parallel_tool_calls", bool, "a boolean"),
    }
    stream = bool(_expect(body, "stream", bool, "a boolean"))
    return messages, tools, params, stream


def responses_response(
    model: str, message: dict[str, Any], finish: str, usage: tuple[int, int], rid: str
) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        output.append(
            {
                "type": "reasoning",
                "id": f"rs_{rid}",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}],
            }
        )
    if message.get("content"):
        output.append(
            {
                "type": "message",
                "id": f"msg_{rid}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": message["content"], "annotations": []}],
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


def responses_stream(response: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(event, data) pairs of the Responses streaming protocol for a finished response."""
    stream = ResponsesStream(response["id"], response["model"], response["created_at"])
    yield from stream.start()
    yield from stream.end(response)


class ResponsesStream:
    """The Responses streaming protocol while a reply is sampled: `start`, `delta` per piece of
    text (the message item opens with the first), `end` with the finished response."""

    def __init__(self, response_id: str, model: str, created_at: int) -> None:
        self.skeleton = {
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

    def _event(self, kind: str, **data: Any) -> tuple[str, str]:
        self.seq += 1
        return kind, json.dumps({"type": kind, "sequence_number": self.seq} | data)

    def start(self) -> Iterator[tuple[str, str]]:
        yield self._event("response.created", response=self.skeleton)
        yield self._event("response.in_progress", response=self.skeleton)

    def delta(self, text: str) -> Iterator[tuple[str, str]]:
        if self.message_id is None:
            self.message_id = f"msg_{self.skeleton['id'].removeprefix('resp_')}"
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

    def end(self, response: dict[str, Any]) -> Iterator[tuple[str, str]]:
        output = list(response["output"])
        if self.message_id is not None:
            # The streamed message went out first: it keeps index 0 and its id.
            message = next((o for o in output if o["type"] == "message"), None)
            output = [o for o in output if o is not message]
            text = message["content"][0]["text"] if message else self.sent
            message = (message or {"type": "message", "status": "completed", "role": "assistant"}) | {
                "id": self.message_id,
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
            rest = text[len(self.sent) :] if text.startswith(self.sent) else ""
            if rest:
                yield from self.delta(rest)
            common = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
            yield self._event("response.output_text.done", text=text, logprobs=[], **common)
            yield self._event("response.content_part.done", part=message["content"][0], **common)
            yield self._event("response.output_item.done", output_index=0, item=message)
            output = [message, *output]
            response = response | {"output": output}
        first = 1 if self.message_id is not None else 0
        for index, item in enumerate(output[first:], start=first):
            yield from self._item(index, item)
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        yield self._event(kind, response=response)

    def _item(self, index: int, item: dict[str, Any]) -> Iterator[tuple[str, str]]:
        if item["type"] == "message":
            empty = item | {"status": "in_progress", "content": []}
            yield self._event("response.output_item.added", output_index=index, item=empty)
            part = {"type": "output_text", "text": "", "annotations": []}
            common = {"item_id": item["id"], "output_index": index, "content_index": 0}
            yield self._event("response.content_part.added", part=part, **common)
            text = item["content"][0]["text"]
            yield self._event("response.output_text.delta", delta=text, logprobs=[], **common)
            yield self._event("response.output_text.done", text=text, logprobs=[], **common)
            yield self._event("response.content_part.done", part=item["content"][0], **common)
        elif item["type"] == "function_call":
            added = item | {"arguments": "", "status": "in_progress"}
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


def _blocks_text(content: Any, where: str) -> str:
    return _joined_text(content, where, ("text",), "block")


def anthropic_request(
    body: Any,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any], bool]:
    """(messages, tools, params, stream) of an Anthropic Messages body."""
    if not isinstance(body, Mapping):
        raise DialectError("the body must be a JSON object")
    _check_keys(body, "Messages", _MESSAGES_KEYS, _NO_VALUE)
    _model(body)
    max_tokens = _int(body, "max_tokens")
    if max_tokens is None:
        raise DialectError("max_tokens: field required", "max_tokens")
    messages: list[dict[str, Any]] = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": _blocks_text(body["system"], "system")})
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise DialectError("messages: expected a non-empty array of messages", "messages")
    for i, message in enumerate(raw):
        if not isinstance(message, Mapping) or message.get("role") not in ("user", "assistant", "system"):
            raise DialectError(f"messages.{i}.role: expected user, assistant or system", f"messages.{i}.role")
        content = message.get("content")
        if message["role"] == "system":
            # Claude Code sends late instructions as a system message between turns.
            messages.append({"role": "system", "content": _blocks_text(content, f"messages.{i}.content")})
            continue
        if isinstance(content, str):
            messages.append({"role": message["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise DialectError(
                f"messages.{i}.content: expected a string or an array of blocks", f"messages.{i}.content"
            )
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for n, block in enumerate(content):
            kind = block.get("type") if isinstance(block, Mapping) else None
            where = f"messages.{i}.content.{n}"
            if kind == "text":
                texts.append(str(block.get("text", "")))
            elif kind == "tool_use" and message["role"] == "assistant":
                arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
                calls.append(
                    {
                        "id": block.get("id"),
                        "type": "function",
                        "function": {"name": block.get("name"), "arguments": arguments},
                    }
                )
            elif kind == "tool_result" and message["role"] == "user":
                result = block.get("content")
                text = "" if result is None else _blocks_text(result, f"{where}.content")
                if block.get("is_error"):
                    text = f"Error: {text}"
                messages.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text})
            elif kind == "thinking":
                continue
            else:
                raise DialectError(f"{where}.type: {kind!r} blocks are not supported here", f"{where}.type")
        if message["role"] == "assistant":
            entry: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
            if calls:
                entry["tool_calls"] = calls
            messages.append(entry)
        elif texts:
            messages.append({"role": "user", "content": "\n".join(texts)})
    tools = None
    raw_tools = _expect(body, "tools", list, "an array of tools")
    if raw_tools:
        tools = []
        for n, tool in enumerate(raw_tools):
            if not isinstance(tool, Mapping) or not isinstance(tool.get("name"), str):
                raise DialectError(f"tools.{n}: expected an object with a name", f"tools.{n}")
            tools.append(
                {
                    "type": "function",
                    "function": {
                        "name": tool["name"],
                        "description": tool.get("description", ""),
                        "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
                    },
                }
            )
    stop = _expect(body, "stop_sequences", list, "an array of strings")
    if stop is not None and not all(isinstance(s, str) and s for s in stop):
        raise DialectError("stop_sequences: expected an array of non-empty strings", "stop_sequences")
    choice, parallel = _anthropic_tool_choice(body.get("tool_choice"))
    params = {
        "temperature": _number(body, "temperature"),
        "top_p": _number(body, "top_p"),
        "top_k": _int(body, "top_k"),
        "max_tokens": max_tokens,
        "stop": stop or None,
        "tool_choice": choice,
        "parallel_tool_calls": parallel,
    }
    stream = bool(_expect(body, "stream", bool, "a boolean"))
    return messages, tools, params, stream


def _anthropic_tool_choice(value: Any) -> tuple[Any, bool | None]:
    """(tool_choice as the gateway takes it, parallel_tool_calls) of an Anthropic tool_choice."""
    if value is None:
        return None, None
    kinds = {"auto": "auto", "any": "required", "none": "none"}
    if not isinstance(value, Mapping) or value.get("type") not in (*kinds, "tool"):
        raise DialectError("tool_choice: expected an object of type auto, any, tool or none", "tool_choice")
    parallel = False if value.get("disable_parallel_tool_use") else None
    if value["type"] == "tool":
        if not isinstance(value.get("name"), str):
            raise DialectError(
                "tool_choice.name: a tool choice of type tool names the tool", "tool_choice.name"
            )
        return {"name": value["name"]}, parallel
    return kinds[value["type"]], parallel


_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def anthropic_response(
    model: str,
    message: dict[str, Any],
    finish: str,
    usage: tuple[int, int],
    rid: str,
    stop_sequence: str | None = None,
) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
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


def anthropic_stream(response: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(event, data) pairs of Anthropic's streaming protocol for a finished message."""
    stream = MessagesStream(response["id"], response["model"], response["usage"]["input_tokens"])
    yield from stream.start()
    yield from stream.end(response)


class MessagesStream:
    """Anthropic's streaming protocol while a reply is sampled: `start`, `delta` per piece of
    text (a text block opens with the first), `end` with the finished message."""

    def __init__(self, message_id: str, model: str, input_tokens: int) -> None:
        self.message = {
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
    def _event(kind: str, **data: Any) -> tuple[str, str]:
        return kind, json.dumps({"type": kind} | data)

    def start(self) -> Iterator[tuple[str, str]]:
        yield self._event("message_start", message=self.message)

    def delta(self, text: str) -> Iterator[tuple[str, str]]:
        if not self.text_open:
            self.text_open = True
            yield self._event("content_block_start", index=0, content_block={"type": "text", "text": ""})
        self.sent += text
        yield self._event("content_block_delta", index=0, delta={"type": "text_delta", "text": text})

    def end(self, response: dict[str, Any]) -> Iterator[tuple[str, str]]:
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

    def _block(self, index: int, block: dict[str, Any]) -> Iterator[tuple[str, str]]:
        if block["type"] == "text":
            yield self._event("content_block_start", index=index, content_block={"type": "text", "text": ""})
            delta = {"type": "text_delta", "text": block["text"]}
        elif block["type"] == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            yield self._event("content_block_start", index=index, content_block=start)
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
        else:
            yield self._event("content_block_start", index=index, content_block=block | {"input": {}})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield self._event("content_block_delta", index=index, delta=delta)
        yield self._event("content_block_stop", index=index)

    def error(self, kind: str, message: str) -> Iterator[tuple[str, str]]:
        yield self._event("error", error={"type": kind, "message": message})

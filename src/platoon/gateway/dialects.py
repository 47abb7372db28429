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
    tools = _expect(body, "tools", list, "an array of tools")
    tool_choice = body.get("tool_choice")
    if tool_choice == "none":
        tools = None
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
    }
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
    base = {k: response[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        return json.dumps(base | {"choices": choices} | extra)

    for choice in response["choices"]:
        index, message = choice["index"], choice["message"]
        yield chunk([{"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        if message.get("reasoning_content"):
            delta = {"reasoning_content": message["reasoning_content"]}
            yield chunk([{"index": index, "delta": delta, "finish_reason": None}])
        # Logprobs travel with the content, or with the last chunk when there is none.
        logprobs = choice["logprobs"]
        if message.get("content"):
            yield chunk(
                [
                    {
                        "index": index,
                        "delta": {"content": message["content"]},
                        "logprobs": logprobs,
                        "finish_reason": None,
                    }
                ]
            )
            logprobs = None
        for n, call in enumerate(message.get("tool_calls") or []):
            delta = {"tool_calls": [{"index": n, **call}]}
            yield chunk([{"index": index, "delta": delta, "finish_reason": None}])
        yield chunk(
            [{"index": index, "delta": {}, "logprobs": logprobs, "finish_reason": choice["finish_reason"]}]
        )
    if include_usage:
        yield chunk([], usage=response["usage"])
    yield "[DONE]"


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
    if body.get("previous_response_id"):
        raise DialectError(
            "previous_response_id: the gateway keeps no responses; send the whole input",
            "previous_response_id",
        )
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
    if body.get("tool_choice") == "none":
        tools = None
    params = {
        "temperature": _number(body, "temperature"),
        "top_p": _number(body, "top_p"),
        "max_tokens": _int(body, "max_output_tokens"),
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
    seq = 0

    def event(kind: str, **data: Any) -> tuple[str, str]:
        nonlocal seq
        seq += 1
        return kind, json.dumps({"type": kind, "sequence_number": seq} | data)

    started = response | {"status": "in_progress", "output": []}
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            empty = item | {"status": "in_progress", "content": []}
            yield event("response.output_item.added", output_index=index, item=empty)
            part = {"type": "output_text", "text": "", "annotations": []}
            yield event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=part,
            )
            text = item["content"][0]["text"]
            common = {"item_id": item["id"], "output_index": index, "content_index": 0}
            yield event("response.output_text.delta", delta=text, logprobs=[], **common)
            yield event("response.output_text.done", text=text, logprobs=[], **common)
            yield event("response.content_part.done", part=item["content"][0], **common)
        elif item["type"] == "function_call":
            yield event(
                "response.output_item.added",
                output_index=index,
                item=item | {"arguments": "", "status": "in_progress"},
            )
            common = {"item_id": item["id"], "output_index": index}
            yield event("response.function_call_arguments.delta", delta=item["arguments"], **common)
            yield event(
                "response.function_call_arguments.done",
                arguments=item["arguments"],
                name=item["name"],
                **common,
            )
        else:
            yield event("response.output_item.added", output_index=index, item=item)
        yield event("response.output_item.done", output_index=index, item=item)
    yield event(
        "response.completed" if response["status"] == "completed" else "response.incomplete",
        response=response,
    )


# --- Anthropic Messages ----------------------------------------------------------------------


def _blocks_text(content: Any, where: str) -> str:
    return _joined_text(content, where, ("text",), "block")


def anthropic_request(
    body: Any,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, Any], bool]:
    """(messages, tools, params, stream) of an Anthropic Messages body."""
    if not isinstance(body, Mapping):
        raise DialectError("the body must be a JSON object")
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
    params = {
        "temperature": _number(body, "temperature"),
        "top_p": _number(body, "top_p"),
        "top_k": _int(body, "top_k"),
        "max_tokens": max_tokens,
        "stop": stop,
    }
    stream = bool(_expect(body, "stream", bool, "a boolean"))
    return messages, tools, params, stream


_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def anthropic_response(
    model: str, message: dict[str, Any], finish: str, usage: tuple[int, int], rid: str
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
        "stop_reason": _STOP_REASONS.get(finish, "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }


def anthropic_stream(response: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(event, data) pairs of Anthropic's streaming protocol for a finished message."""
    start = response | {
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": response["usage"]["input_tokens"], "output_tokens": 0},
    }
    yield "message_start", json.dumps({"type": "message_start", "message": start})
    for index, block in enumerate(response["content"]):
        if block["type"] == "text":
            yield (
                "content_block_start",
                json.dumps(
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    }
                ),
            )
            yield (
                "content_block_delta",
                json.dumps(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "text_delta", "text": block["text"]},
                    }
                ),
            )
        elif block["type"] == "thinking":
            yield (
                "content_block_start",
                json.dumps(
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "thinking", "thinking": "", "signature": ""},
                    }
                ),
            )
            yield (
                "content_block_delta",
                json.dumps(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "thinking_delta", "thinking": block["thinking"]},
                    }
                ),
            )
        else:
            yield (
                "content_block_start",
                json.dumps(
                    {"type": "content_block_start", "index": index, "content_block": block | {"input": {}}}
                ),
            )
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            yield (
                "content_block_delta",
                json.dumps({"type": "content_block_delta", "index": index, "delta": delta}),
            )
        yield "content_block_stop", json.dumps({"type": "content_block_stop", "index": index})
    delta = {"stop_reason": response["stop_reason"], "stop_sequence": None}
    yield (
        "message_delta",
        json.dumps(
            {
                "type": "message_delta",
                "delta": delta,
                "usage": {"output_tokens": response["usage"]["output_tokens"]},
            }
        ),
    )
    yield "message_stop", json.dumps({"type": "message_stop"})

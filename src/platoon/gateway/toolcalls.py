"""Tool-call parsers: turn a model's text into OpenAI tool calls.

A parser never raises on model output. What cannot be a call (bad JSON, no name, arguments
that are not an object) stays in `content` as the text the model wrote. A call the API would
still return (to a tool that was not declared, with arguments that do not fit the tool's JSON
schema) is a call, for the agent to answer as it answers a bad call from the real API. Either
way `errors` says what is wrong, one line per call, which the harness can show the model.

Formats follow SGLang's detectors: `hermes`/`qwen` (`<tool_call>{json}</tool_call>`), `llama3`
(`{"name": ..., "parameters": ...}`, optionally after `<|python_tag|>`, several joined by `;`),
and `json` (the whole reply is one call object or a list of them).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, Protocol

import msgspec

from platoon.gateway.shapes import Tool, ToolCall
from platoon.naming import unknown_name

__all__ = [
    "HermesToolParser",
    "JsonToolParser",
    "Llama3ToolParser",
    "ToolCallParser",
    "ToolParseResult",
    "UnknownToolParserError",
    "get_tool_call_parser",
    "register_tool_call_parser",
    "tool_call_parser_names",
]


class UnknownToolParserError(KeyError):
    """No tool-call parser is registered under the requested name."""

    def __str__(self) -> str:
        return str(self.args[0])


class ToolParseResult(msgspec.Struct):
    """What a parser read: the text that is not a call, the calls, and one line per call that is
    wrong (kept as text, or a call that does not fit the declared tools)."""

    content: str
    tool_calls: list[ToolCall] = []
    errors: list[str] = []


def new_tool_call_id() -> str:
    """An OpenAI-style tool call id (`call_` and 24 hex digits)."""
    return "call_" + uuid.uuid4().hex[:24]


def make_tool_call(name: str, arguments: object, call_id: str | None = None) -> ToolCall:
    """An OpenAI tool call dict with JSON-string arguments."""
    return {
        "id": call_id or new_tool_call_id(),
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


_JSON_TYPES: dict[str, Callable[[object], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def _json_type_name(value: object) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if _JSON_TYPES[name](value):
            return name
    return type(value).__name__


def _tool_schemas(tools: Sequence[Tool] | None) -> dict[str, Mapping[str, object]] | None:
    """Map tool name -> parameters schema; None when no tools were given (accept any call)."""
    if not tools:
        return None
    schemas = {}
    for tool in tools:
        function = tool.get("function", tool)
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            schemas[function["name"]] = function.get("parameters") or {}
    return schemas


def _check_arguments(name: str, arguments: object, schema: Mapping[str, object]) -> str | None:
    """Check arguments against the basic JSON-schema facts: types, required and extra keys."""
    if not isinstance(arguments, dict):
        return f"arguments of '{name}' must be a JSON object, got {_json_type_name(arguments)}"
    # A schema keyword of the wrong JSON type (the client's tool is not a JSON schema) checks nothing.
    properties = schema.get("properties") or {}
    if not isinstance(properties, Mapping):
        properties = {}
    required = schema.get("required") or []
    names = [key for key in required if isinstance(key, str)] if isinstance(required, list) else []
    missing = [key for key in names if key not in arguments]
    if missing:
        return f"'{name}' is missing required argument(s): {', '.join(missing)}"
    for key, value in arguments.items():
        spec = properties.get(key)
        if spec is None:
            if schema.get("additionalProperties") is False:
                return f"'{name}' has no argument '{key}' (expected: {', '.join(properties) or 'none'})"
            continue
        expected = spec.get("type") if isinstance(spec, dict) else None
        allowed = [expected] if isinstance(expected, str) else expected if isinstance(expected, list) else []
        known = [t for t in allowed if isinstance(t, str) and t in _JSON_TYPES]
        if known and not any(_JSON_TYPES[t](value) for t in known):
            return f"argument '{key}' of '{name}' must be {' or '.join(known)}, got {_json_type_name(value)}"
        enum = spec.get("enum") if isinstance(spec, dict) else None
        if isinstance(enum, list) and value not in enum:
            return f"argument '{key}' of '{name}' must be one of {json.dumps(enum, ensure_ascii=False)}"
    return None


def _accept_call(
    obj: object, schemas: Mapping[str, Mapping[str, object]] | None, *, arguments_keys: tuple[str, ...]
) -> tuple[ToolCall | None, str | None]:
    """One decoded call object as an OpenAI tool call, and what is wrong with it: no call when it
    cannot be one (no name, arguments that are not an object), a call and the problem when it
    calls a tool that was not declared or does not fit the tool's schema."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, 'a tool call must be a JSON object with a string "name"'
    name = obj["name"]
    arguments: object = {}
    for key in arguments_keys:
        if key in obj:
            arguments = obj[key]
            break
    if isinstance(arguments, str):
        # Some models encode the arguments object as a JSON string; accept it when it is one.
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None, f"arguments of '{name}' must be a JSON object, got a string"
    if not isinstance(arguments, dict):
        return None, f"arguments of '{name}' must be a JSON object, got {_json_type_name(arguments)}"
    call = make_tool_call(name, arguments)
    if schemas is None:
        return call, None
    if name not in schemas:
        return call, f"unknown tool '{name}' (available: {', '.join(schemas) or 'none'})"
    return call, _check_arguments(name, arguments, schemas[name])


def _json_error(exc: json.JSONDecodeError) -> str:
    return f"invalid JSON in tool call: {exc.msg} at line {exc.lineno} column {exc.colno}"


class ToolCallParser(Protocol):
    """What every parser offers: `parse(text, tools)` reads the calls out of one complete reply."""

    name: ClassVar[str]

    def parse(self, text: str, tools: Sequence[Tool] | None = None) -> ToolParseResult: ...

    def has_tool_call(self, text: str) -> bool:
        """Cheap check streaming code can use to decide whether to hold text back."""
        ...


class HermesToolParser:
    """`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` blocks, as Qwen and Hermes write."""

    name: ClassVar[str] = "hermes"
    start = "<tool_call>"
    end = "</tool_call>"

    def has_tool_call(self, text: str) -> bool:
        return self.start in text

    def parse(self, text: str, tools: Sequence[Tool] | None = None) -> ToolParseResult:
        if self.start not in text:  # most replies call nothing
            return ToolParseResult(content=text.strip())
        schemas = _tool_schemas(tools)
        kept: list[str] = []
        calls: list[ToolCall] = []
        errors: list[str] = []
        pos = 0
        number = 0
        while (begin := text.find(self.start, pos)) != -1:
            kept.append(text[pos:begin])
            number += 1
            close = text.find(self.end, begin + len(self.start))
            if close == -1:
                kept.append(text[begin:])
                errors.append(f"tool call {number}: unterminated {self.start} block")
                pos = len(text)
                break
            block = text[begin : close + len(self.end)]
            body = text[begin + len(self.start) : close]
            try:
                call, problem = _accept_call(
                    json.loads(body.strip()), schemas, arguments_keys=("arguments", "parameters")
                )
            except json.JSONDecodeError as exc:
                call, problem = None, _json_error(exc)
            if call is not None:
                calls.append(call)
            else:
                kept.append(block)
            if problem:
                errors.append(f"tool call {number}: {problem}")
            pos = close + len(self.end)
        kept.append(text[pos:])
        return ToolParseResult(content="".join(kept).strip(), tool_calls=calls, errors=errors)


class Llama3ToolParser:
    """Llama 3.1+ JSON calls: `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`,
    several separated by `;`. Without the tag, a reply is a call only if it starts with `{`."""

    name: ClassVar[str] = "llama3"
    tag = "<|python_tag|>"

    def has_tool_call(self, text: str) -> bool:
        return self.tag in text or text.lstrip().startswith("{")

    def parse(self, text: str, tools: Sequence[Tool] | None = None) -> ToolParseResult:
        if self.tag in text:
            before, action = text.split(self.tag, 1)
        elif text.lstrip().startswith("{"):
            before, action = "", text
        else:
            return ToolParseResult(content=text.strip())
        schemas = _tool_schemas(tools)
        decoder = json.JSONDecoder()
        calls: list[ToolCall] = []
        errors: list[str] = []
        kept = [before]
        pos = 0
        number = 0
        while pos < len(action):
            while pos < len(action) and (action[pos].isspace() or action[pos] == ";"):
                pos += 1
            if pos >= len(action):
                break
            number += 1
            try:
                obj, end = decoder.raw_decode(action, pos)
            except json.JSONDecodeError as exc:
                kept.append(action[pos:])
                errors.append(f"tool call {number}: {_json_error(exc)}")
                break
            call, problem = _accept_call(obj, schemas, arguments_keys=("parameters", "arguments"))
            if call is not None:
                calls.append(call)
            else:
                kept.append(action[pos:end])
            if problem:
                errors.append(f"tool call {number}: {problem}")
            pos = end
        return ToolParseResult(
            content="\n".join(k for k in kept if k.strip()).strip(), tool_calls=calls, errors=errors
        )


class JsonToolParser:
    """Fallback: the whole reply (optionally in a ```json fence) is one call object or a list of them.

    A reply that is not JSON, or JSON without a "name", is plain content, not an error.
    """

    name: ClassVar[str] = "json"
    _fence = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)

    def has_tool_call(self, text: str) -> bool:
        stripped = text.lstrip()
        return stripped.startswith(("{", "[", "```"))

    def parse(self, text: str, tools: Sequence[Tool] | None = None) -> ToolParseResult:
        stripped = text.strip()
        fenced = self._fence.match(stripped)
        body = fenced.group(1) if fenced else stripped
        if not body.startswith(("{", "[")):
            return ToolParseResult(content=stripped)
        try:
            decoded = json.loads(body)
        except json.JSONDecodeError as exc:
            if '"name"' in body:
                return ToolParseResult(content=stripped, errors=[f"tool call 1: {_json_error(exc)}"])
            return ToolParseResult(content=stripped)
        objects = decoded if isinstance(decoded, list) else [decoded]
        if not objects or not all(isinstance(o, dict) and "name" in o for o in objects):
            return ToolParseResult(content=stripped)
        schemas = _tool_schemas(tools)
        calls: list[ToolCall] = []
        errors: list[str] = []
        whole = True
        for number, obj in enumerate(objects, 1):
            call, problem = _accept_call(obj, schemas, arguments_keys=("arguments", "parameters"))
            if call is not None:
                calls.append(call)
            else:
                whole = False
            if problem:
                errors.append(f"tool call {number}: {problem}")
        # One call that cannot be one keeps the whole reply as text: a list cannot be split back
        # into its source.
        if not whole:
            return ToolParseResult(content=stripped, tool_calls=[], errors=errors)
        return ToolParseResult(content="", tool_calls=calls, errors=errors)


_PARSERS: dict[str, Callable[[], ToolCallParser]] = {}


def register_tool_call_parser(name: str, factory: Callable[[], ToolCallParser]) -> None:
    """Register a parser class (or a factory returning a parser) under `name`; replaces any earlier one."""
    _PARSERS[name] = factory


def get_tool_call_parser(name: str) -> ToolCallParser:
    """A new parser for the named format."""
    try:
        factory = _PARSERS[name]
    except KeyError:
        raise UnknownToolParserError(unknown_name("tool_call_parser", name, _PARSERS)) from None
    return factory()


def tool_call_parser_names() -> list[str]:
    """The registered parser names, sorted."""
    return sorted(_PARSERS)


register_tool_call_parser("hermes", HermesToolParser)
register_tool_call_parser("qwen", HermesToolParser)
register_tool_call_parser("llama3", Llama3ToolParser)
register_tool_call_parser("json", JsonToolParser)

"""The request bodies the gateway's HTTP dialects accept, as msgspec structs: the schema.

One struct per request (`ChatRequest`, `ResponsesRequest`, `MessagesRequest`), tagged unions
where the wire has a `type` or `role` tag. Unknown fields inside a body are ignored, as the
APIs do (clients send cache hints, ids, statuses, annotations); unknown top-level parameters
are refused, so that no request is silently sampled without what it asked for. Parameters the
gateway cannot honour (penalties; another dialect's output format; top log-probabilities in
Anthropic Messages) are accepted only at their neutral value. `read` turns a parsed JSON body into its struct, or raises
`DialectError` naming the field in the dotted form the clients show (`messages.0.role`).

What a field means for sampling, and which shapes are then refused (an image, a tool of
another kind), is the translation's business: see `dialects`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from typing import Annotated, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct
from msgspec import inspect as mi

from platoon.bus.chat import ChatMessage
from platoon.policy.constraints import unsupported

__all__ = [
    "ChatRequest",
    "DialectError",
    "MessagesRequest",
    "ResponsesRequest",
    "decode",
    "output_format",
    "read",
    "top_logprobs",
]


class DialectError(ValueError):
    """A request body that does not follow its dialect; `param` names the field, `code` is the
    OpenAI error code the API gives such a body (None where it gives none)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


T = TypeVar("T")
NonEmpty = Annotated[T, Meta(min_length=1)]
Empty = Annotated[T, Meta(max_length=0)]
Zero = Annotated[float, Meta(ge=0, le=0)]


class _Tagged(Struct, tag_field="type"):
    pass


# --- what every dialect takes --------------------------------------------------------------


class _TextFormat(_Tagged, tag="text"):
    pass


class JsonObjectFormat(_Tagged, tag="json_object"):
    pass


class JsonSchemaSpec(Struct):
    """A JSON schema output format, as chat writes it under `json_schema` (the schema optional)."""

    schema: dict[str, object] | None = None
    name: str | None = None
    description: str | None = None
    strict: bool | None = None


class FlatJsonSchema(_Tagged, tag="json_schema", kw_only=True):
    """A JSON schema output format as Responses and Anthropic write it: flat, with its schema."""

    schema: dict[str, object]
    name: str | None = None
    description: str | None = None
    strict: bool | None = None


class ChatJsonSchema(_Tagged, tag="json_schema"):
    json_schema: JsonSchemaSpec


class _TextOptions(Struct):
    format: _TextFormat | None = None
    verbosity: str | None = None


class ResponsesText(Struct):
    format: _TextFormat | JsonObjectFormat | FlatJsonSchema | None = None
    verbosity: str | None = None


class _OutputConfig(Struct):
    format: None = None
    effort: str | None = None


class OutputConfig(Struct):
    format: FlatJsonSchema | None = None
    effort: str | None = None


class _Hints(Struct, kw_only=True):
    """Fields of every dialect with nothing to honour."""

    model: str | None = None
    user: str | None = None
    metadata: dict[str, object] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


class _Common(_Hints, kw_only=True):
    """Fields of every dialect: the hints, and parameters of these APIs the gateway cannot
    honour (it samples the policy as is), accepted only at their neutral value or null. Clients
    that speak several APIs send them across, so every dialect takes them all."""

    frequency_penalty: Zero | None = None
    presence_penalty: Zero | None = None
    logit_bias: Empty[dict[str, object]] | None = None
    modalities: tuple[Literal["text"]] | None = None
    functions: Empty[list[object]] | None = None
    function_call: Literal["auto", "none"] | None = None
    truncation: Literal["disabled"] | None = None
    background: bool | None = None  # false only (msgspec < 0.21 has no Literal[False]): see `read`
    mcp_servers: Empty[list[object]] | None = None
    prediction: None = None
    audio: None = None
    web_search_options: None = None
    max_tool_calls: None = None
    conversation: None = None
    prompt: None = None
    container: None = None


def _names(kind: type[Struct]) -> frozenset[str]:
    return frozenset(f.encode_name for f in msgspec.structs.fields(kind))


# Each dialect honours its own output format (`response_format`, `text`, `output_config`) and
# log-probabilities (chat and Responses, where the sampler gives them); another's stays neutral.
NEUTRAL = _names(_Common) - _names(_Hints) | {"top_logprobs", "response_format", "text", "output_config"}


# --- OpenAI Chat Completions ---------------------------------------------------------------


class ChatFunction(Struct):
    name: str
    description: str | None = None
    parameters: dict[str, object] | None = None
    strict: bool | None = None


class ChatTool(Struct):
    """A function tool, passed to the renderer as the client sent it (its JSON is the prompt)."""

    type: str = "function"
    function: ChatFunction | None = None  # None: a flat {"name", "parameters"} tool


class _Name(Struct):
    name: str


class ChatToolChoice(Struct):
    type: Literal["function"]
    function: _Name


class StreamOptions(Struct):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class ChatRequest(_Common, kw_only=True, forbid_unknown_fields=True):
    response_format: _TextFormat | JsonObjectFormat | ChatJsonSchema | None = None
    text: _TextOptions | None = None
    output_config: _OutputConfig | None = None
    messages: NonEmpty[list[ChatMessage]]
    tools: list[ChatTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | ChatToolChoice | None = None
    parallel_tool_calls: bool | None = None
    stop: str | list[str] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # wins over max_tokens
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    n: Annotated[int, Meta(ge=1, le=16)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None  # served where the policy's sampler gives them (see `dialects`)
    reasoning_effort: str | None = None  # the policy's chat template decides how it reasons
    verbosity: str | None = None


# --- OpenAI Responses ----------------------------------------------------------------------


class Text(_Tagged, tag="text"):
    """A text part or block (each dialect has its own tags for it)."""

    text: str = ""


class InputText(Text, tag="input_text"):
    pass


class OutputText(Text, tag="output_text"):
    pass


class InputImage(_Tagged, tag="input_image"):
    pass


class InputFile(_Tagged, tag="input_file"):
    pass


ResponsesPart = InputText | OutputText | Text | InputImage | InputFile


class ResponsesMessage(_Tagged, tag="message"):
    """A message item; the wire may leave out its `type`."""

    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ResponsesPart]


class FunctionCall(_Tagged, tag="function_call"):
    name: str
    arguments: str | None = None
    call_id: str | None = None
    id: str | None = None


class FunctionCallOutput(_Tagged, tag="function_call_output"):
    call_id: str
    output: str | list[ResponsesPart]


class _TextOnly(Struct):
    """A summary or reasoning text part (its `type` is not read)."""

    text: str


class ReasoningItem(_Tagged, tag="reasoning"):
    """Earlier reasoning, not sent back to the model."""

    summary: list[_TextOnly] | None = None
    content: list[_TextOnly] | None = None
    encrypted_content: str | None = None


ResponsesItem = ResponsesMessage | FunctionCall | FunctionCallOutput | ReasoningItem


class ResponsesTool(Struct):
    """A tool; only `type: function` ones are served (the translation refuses others)."""

    type: str
    name: str | None = None
    description: str | None = ""
    parameters: dict[str, object] | None = None
    strict: bool | None = None


class ResponsesToolChoice(Struct):
    type: Literal["function"]
    name: str


class ReasoningOptions(Struct):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class ResponsesRequest(_Common, kw_only=True, forbid_unknown_fields=True):
    input: str | NonEmpty[list[ResponsesItem]]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | ResponsesToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    previous_response_id: str | None = None
    top_logprobs: int | None = None  # served where the policy's sampler gives them (see `dialects`)
    include: list[str] | None = None
    text: ResponsesText | None = None
    response_format: _TextFormat | None = None
    output_config: _OutputConfig | None = None
    reasoning: ReasoningOptions | None = None
    client_metadata: dict[str, object] | None = None
    prompt_cache_retention: str | None = None


# --- Anthropic Messages --------------------------------------------------------------------


class ThinkingBlock(_Tagged, tag="thinking"):
    """Earlier thinking, not sent back to the model."""

    thinking: str | None = None
    signature: str | None = None


class ToolUseBlock(_Tagged, tag="tool_use"):
    id: str
    name: str
    input: dict[str, object] | None = None


class ToolResultBlock(_Tagged, tag="tool_result"):
    tool_use_id: str
    content: str | list[Text] | None = None
    is_error: bool | None = None


class UserMessage(Struct, tag_field="role", tag="user"):
    content: str | list[Text | ToolResultBlock | ThinkingBlock]


class AssistantMessage(Struct, tag_field="role", tag="assistant"):
    content: str | list[Text | ToolUseBlock | ThinkingBlock]


class SystemMessage(Struct, tag_field="role", tag="system"):
    """Late instructions between turns, as Claude Code sends them."""

    content: str | list[Text]


class AnthropicTool(Struct):
    """A tool by name; its `type` (custom or a server tool's) is not read."""

    name: str
    description: str | None = ""
    input_schema: dict[str, object] | None = None


class _Choice(_Tagged, kw_only=True):
    disable_parallel_tool_use: bool | None = None


class ChoiceAuto(_Choice, tag="auto"):
    pass


class ChoiceAny(_Choice, tag="any"):
    pass


class ChoiceNone(_Choice, tag="none"):
    pass


class ChoiceTool(_Choice, tag="tool"):
    name: str


class ThinkingOptions(Struct):
    type: str
    budget_tokens: int | None = None


class MessagesRequest(_Common, kw_only=True, forbid_unknown_fields=True):
    max_tokens: int
    messages: NonEmpty[list[UserMessage | AssistantMessage | SystemMessage]]
    system: str | list[Text] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: ChoiceAuto | ChoiceAny | ChoiceNone | ChoiceTool | None = None
    stop_sequences: list[NonEmpty[str]] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool | None = None
    thinking: ThinkingOptions | None = None  # the policy's chat template decides how it thinks
    output_config: OutputConfig | None = None
    response_format: _TextFormat | None = None
    text: _TextOptions | None = None
    top_logprobs: Literal[0] | None = None  # not an Anthropic parameter: see `_cannot_honour`
    context_management: dict[str, object] | None = None


class CountTokensRequest(MessagesRequest, kw_only=True, forbid_unknown_fields=True):
    max_tokens: int = 1


# --- reading a body ------------------------------------------------------------------------

S = TypeVar("S", bound=Struct)


def tag(value: Struct) -> str:
    """The tag of a tagged struct (its `type` or `role` on the wire)."""
    return str(value.__struct_config__.tag)


# An agent's tools, bounded: OpenAI takes at most 128 functions; real agents send a few dozen
# whose schemas add up to tens of KiB. Past these a request is refused, not rendered into memory.
MAX_TOOLS = 512
MAX_TOOLS_BYTES = 1 << 20


def _check_tools(tools: object) -> None:
    if not isinstance(tools, list):
        return
    if len(tools) > MAX_TOOLS:
        raise DialectError(f"tools: {len(tools)} tools, more than the {MAX_TOOLS} allowed", param="tools")
    size = len(msgspec.json.encode(tools))
    if size > MAX_TOOLS_BYTES:
        raise DialectError(
            f"tools: their definitions take {size} bytes, more than the {MAX_TOOLS_BYTES} allowed",
            param="tools",
        )


def decode(raw: bytes, kind: type[S]) -> S | None:
    """`raw` JSON read straight into a `kind`, with no dicts in between (3x cheaper than
    parsing, then `read`); None when it is not a valid one, whose parsed body `read` then
    refuses, saying why. Bodies that may hold more tools than allowed are left to `read`."""
    if len(raw) > MAX_TOOLS_BYTES:
        return None
    try:
        request = _decoder(kind).decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    tools = getattr(request, "tools", None)
    if (tools is not None and len(tools) > MAX_TOOLS) or getattr(request, "background", None):
        return None
    return request


@cache
def _decoder(kind: type[S]) -> msgspec.json.Decoder[S]:
    return msgspec.json.Decoder(kind)


def top_logprobs(top: int | None) -> int | None:
    """OpenAI's range of top_logprobs (0 to 20), refused in its words."""
    if top is not None and not 0 <= top <= 20:
        side, bound = ("above maximum", "<= 20") if top > 20 else ("below minimum", ">= 0")
        raise DialectError(
            f"Invalid 'top_logprobs': integer {side} value. Expected a value {bound}, but got {top} instead.",
            "top_logprobs",
            "integer_above_max_value" if top > 20 else "integer_below_min_value",
        )
    return top


def output_format(spec: object, param: str, *, strict: bool = False) -> dict[str, object] | None:
    """A JSON output format as the gateway's `response_format` parameter (`{"schema": SCHEMA}`,
    None: any JSON object), None for text. A strict schema (Anthropic's always is) with keywords
    outside the enforced subset is refused: it would be promised and not kept."""
    if isinstance(spec, JsonObjectFormat):
        return {"schema": None}
    if isinstance(spec, ChatJsonSchema):
        spec = spec.json_schema
    if not isinstance(spec, (JsonSchemaSpec, FlatJsonSchema)):
        return None
    outside = unsupported(spec.schema) if strict or spec.strict else []
    if outside:
        shown = ", ".join(outside[:4]) + (" ..." if len(outside) > 4 else "")
        raise DialectError(
            f"{param}: the schema's {shown} cannot be enforced; the gateway enforces type, properties, "
            "required, additionalProperties, items, enum and const (send the schema without strict, "
            "and the rest of it goes unchecked)",
            param,
        )
    return {"schema": spec.schema}


def read(body: object, kind: type[S], api: str, whole: Mapping[str, str] | None = None) -> S:
    """`body` (parsed JSON) as a `kind`, or a `DialectError` naming the field.

    Errors inside a field of `whole` name the field itself, with the given message (a tool
    choice, stop sequences); inside a neutral-only field, they say it cannot be honoured.
    """
    if not isinstance(body, Mapping):
        raise DialectError("the body must be a JSON object")
    _check_tools(body.get("tools"))
    try:
        request = msgspec.convert(body, kind)
    except msgspec.ValidationError as exc:
        raise _error(str(exc), kind, body, api, whole or {}) from None
    if getattr(request, "background", None):
        raise _cannot_honour("background", body)
    return request


_AT = re.compile(r"(?P<text>.*?)(?: - at `\$(?P<path>[^`]*)`)?", re.S)
_NAMES = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "array": "an array",
    "object": "an object",
    "null": "null",
}


def _error(
    message: str, kind: type, body: Mapping[str, object], api: str, whole: Mapping[str, str]
) -> DialectError:
    match = _AT.fullmatch(message)
    assert match is not None
    text = match["text"]
    segments = [s for s in re.split(r"[.\[\]]+", match["path"] or "") if s and s != "..."]
    missing = re.fullmatch(r"Object missing required field `(.+)`", text)
    unknown = re.fullmatch(r"Object contains unknown field `(.+)`", text)
    invalid = re.fullmatch(r"Invalid (?:enum )?value (.+)", text)
    if unknown:
        segments.append(unknown[1])
        text = f"not a {api} parameter the gateway honours"
    elif missing:
        # A missing field is named by the object that lacks it, or by itself at the top.
        text = "field required" if not segments else f"missing the required field {missing[1]}"
        segments = segments or [missing[1]]
    elif invalid:
        allowed = _allowed(kind, segments, body)
        expected = f"expected {_or(allowed)}, " if allowed else ""
        text = f"{expected}got {invalid[1]}"
    else:
        text = _plain(text)
    field = segments[0] if segments else None
    if field is not None and field in whole:
        return DialectError(f"{field}: {whole[field]}", field)
    if field in NEUTRAL:
        return _cannot_honour(field, body, api)
    param = ".".join(segments) or None
    return DialectError(f"{param}: {text}" if param else f"the body: {text}", param)


def _cannot_honour(field: str, body: Mapping[str, object], api: str = "") -> DialectError:
    shown = json.dumps(body.get(field))
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    if field == "top_logprobs" and api == "Messages":
        return DialectError(
            f"top_logprobs: the Messages API has no log-probabilities, so the gateway cannot honour {shown}; "
            "ask /v1/chat/completions (logprobs, top_logprobs) or /v1/responses "
            '(include ["message.output_text.logprobs"], top_logprobs) for them',
            field,
        )
    return DialectError(f"{field}: the gateway cannot honour {shown} (it samples the policy as is)", field)


def _plain(text: str) -> str:
    """msgspec's "Expected `str | array`, got `int`" as "expected a string or an array, got an integer"."""
    text = text.replace("Expected `array` of length >= 1", "Expected a non-empty array")

    def names(match: re.Match[str]) -> str:
        kinds = [t.strip() for t in match[1].split("|")]
        kinds = [t for t in kinds if t != "null"] or kinds  # null is never the point
        return _or([_NAMES.get(t, t) for t in kinds])

    text = re.sub(r"`([^`]+)`", names, text)
    return text[:1].lower() + text[1:]


def _or(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


@cache
def _info(kind: type) -> mi.Type:
    return mi.type_info(kind)


def _allowed(kind: type, segments: list[str], body: object) -> list[str] | None:
    """The values a tag or a literal field at `segments` may take, read from the type (the body
    says which variant of a tagged union each step is)."""
    info, value = _info(kind), body
    for n, segment in enumerate(segments):
        info = _variant(info, value)
        tagged = [t for t in _options(info) if isinstance(t, mi.StructType) and t.tag_field == segment]
        if tagged:
            return [str(t.tag) for t in tagged] if n == len(segments) - 1 else None
        if isinstance(info, mi.UnionType):
            return None
        if isinstance(info, mi.StructType) and isinstance(value, Mapping):
            field = next((f for f in info.fields if f.encode_name == segment), None)
            if field is None:
                return None
            info, value = field.type, value.get(segment)
        elif isinstance(info, mi.ListType | mi.TupleType) and isinstance(value, list) and segment.isdigit():
            index = int(segment)
            item = info.item_type if isinstance(info, mi.ListType) else info.item_types[index]
            info, value = item, value[index] if index < len(value) else None
        else:
            return None
    literals = [t for t in _options(info) if isinstance(t, mi.LiteralType)]
    return [str(v) for t in literals for v in t.values] or None


def _options(info: mi.Type) -> list[mi.Type]:
    while isinstance(info, mi.Metadata):
        info = info.type
    return (
        [o.type if isinstance(o, mi.Metadata) else o for o in info.types]
        if isinstance(info, mi.UnionType)
        else [info]
    )


def _variant(info: mi.Type, value: object) -> mi.Type:
    """The member of a union that `value` was read as (a union left as is when unclear)."""
    options = _options(info)
    if len(options) == 1:
        return options[0]
    if isinstance(value, Mapping):
        structs = [o for o in options if isinstance(o, mi.StructType)]
        for struct in structs:
            if struct.tag_field is not None and value.get(struct.tag_field) == struct.tag:
                return struct
        if len(structs) == 1 and structs[0].tag_field is None:
            return structs[0]
        if any(s.tag_field is not None for s in structs):
            return mi.UnionType(tuple(structs))
    if isinstance(value, list):
        arrays = [o for o in options if isinstance(o, mi.ListType | mi.TupleType)]
        if len(arrays) == 1:
            return arrays[0]
    return info

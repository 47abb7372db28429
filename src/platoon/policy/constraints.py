"""Decoding constraints: what a reply must be (one tool call, or a JSON value of a schema), as a
sampler that can constrain its decoding is told, and how any reply is checked against one.

The schema subset, the same for the embedded sampler's constrained decoding and for the check
of any other sampler's reply: `type` (a name or a list of them: object, array, string, number,
integer, boolean, null), `properties`, `required`, `additionalProperties`, `items`, `enum` and
`const`. Annotations (`title`, `description`, `default`, `examples`, `format`, `$schema`, ...)
are read past. Any other keyword (`anyOf`, `$ref`, `pattern`, `minimum`, ...) is not enforced:
`unsupported` names them, so that a strict `json_schema` can be refused rather than pretended,
and elsewhere the value under such a keyword is any JSON value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import msgspec

__all__ = [
    "DecodingConstraint",
    "ToolSpec",
    "json_reply_error",
    "schema_error",
    "unsupported",
]

_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
_ENFORCED = frozenset({"type", "properties", "required", "additionalProperties", "items", "enum", "const"})
_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "format",
        "$schema",
        "$id",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "nullable",
        "strict",
    }
)


class ToolSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A tool a constrained reply may call: its name and its parameters' JSON schema."""

    name: str
    parameters: dict[str, object] | None = None


class DecodingConstraint(msgspec.Struct, frozen=True, omit_defaults=True, forbid_unknown_fields=True):
    """What the sampled text must be, from the first sampled token to a stop token.

    With `tools`: one call object `{"name": NAME, "arguments": ARGS}` of one of them, written as
    `{"name": ` + the JSON name + `, "arguments": ` + ARGS + `}`, ARGS an object of the tool's
    parameters schema. Without: one JSON value of `schema` (None: any JSON object). `written` is
    the beginning of the value that the prompt already holds (a forced opening): the sampled text
    continues it. `after` is the text that follows the value (a tool call's closing markup); then
    the reply ends with one of the sampler's stop tokens.
    """

    schema: dict[str, object] | None = None
    tools: list[ToolSpec] | None = None
    written: str = ""
    after: str = ""


def unsupported(schema: object, path: str = "") -> list[str]:
    """The keywords of `schema` outside the subset, each with its JSON path (empty: all enforced)."""
    if not isinstance(schema, Mapping):
        return []
    found = [f"{path}/{key}" for key in schema if key not in _ENFORCED and key not in _ANNOTATIONS]
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        for name, sub in properties.items():
            found += unsupported(sub, f"{path}/properties/{name}")
    for key in ("items", "additionalProperties"):
        found += unsupported(schema.get(key), f"{path}/{key}")
    return found


def _is(value: object, kind: str) -> bool:
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    kinds: dict[str, type | tuple[type, ...]] = {
        "object": dict,
        "array": list,
        "string": str,
        "boolean": bool,
        "null": type(None),
    }
    return isinstance(value, kinds[kind])


def schema_error(value: object, schema: object, path: str = "$") -> str | None:
    """Where `value` breaks `schema` (the subset), or None when it fits."""
    if not isinstance(schema, Mapping):
        return None
    if "const" in schema and value != schema["const"]:
        return f"{path} must be {json.dumps(schema['const'])}"
    enum = schema.get("enum")
    if isinstance(enum, list) and value not in enum:
        return f"{path} must be one of {json.dumps(enum)}"
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else []
    kinds = [k for k in kinds if k in _TYPES]
    if kinds and not any(_is(value, k) for k in kinds):
        return f"{path} must be {' or '.join(kinds)}"
    if isinstance(value, dict):
        return _object_error(value, schema, path)
    if isinstance(value, list):
        for i, item in enumerate(value):
            if (problem := schema_error(item, schema.get("items"), f"{path}[{i}]")) is not None:
                return problem
    return None


def _object_error(value: dict[str, object], schema: Mapping[str, object], path: str) -> str | None:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    required = schema.get("required")
    for name in required if isinstance(required, list) else []:
        if isinstance(name, str) and name not in value:
            return f"{path} lacks the required property {name!r}"
    extra = schema.get("additionalProperties")
    for name, item in value.items():
        if name in properties:
            sub = properties[name]
        elif extra is False:
            return f"{path} has the property {name!r}, which the schema does not declare"
        else:
            sub = extra
        if (problem := schema_error(item, sub, f"{path}.{name}")) is not None:
            return problem
    return None


def json_reply_error(text: str, schema: dict[str, object] | None) -> str | None:
    """Why a reply's text is not the JSON a `response_format` asks for (None: it is): a JSON
    object without a schema, a value of the schema with one."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"the reply is not JSON ({exc.msg} at column {exc.colno})"
    if schema is None:
        return None if isinstance(value, dict) else "the reply is JSON but not an object"
    return schema_error(value, schema)

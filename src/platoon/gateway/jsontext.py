"""JSON text as chat templates write it (transformers' `tojson`), kept for values seen before.

An agent sends the same tools and echoes the same tool calls on every call: dumping them anew
with `json.dumps` cost more than the rest of a render. Their msgpack encoding (C speed, and
exact: key order, ints apart from floats and bools, NaN) finds the text written before.
"""

from __future__ import annotations

import json

import msgspec

__all__ = ["dumps"]

_KEYS = msgspec.msgpack.Encoder()
_SEEN: dict[tuple[int | None, bytes], str] = {}
_ENTRIES = 1024
_LARGEST = 1 << 15  # bytes of msgpack: larger values are dumped each time, not kept (<= 64 MiB in all)


def dumps(value: object, indent: int | None = None) -> str:
    """`json.dumps(value, ensure_ascii=False, indent=indent)`: the `tojson` filter's text."""
    try:
        key = (indent, _KEYS.encode(value))
    except (TypeError, ValueError, OverflowError):  # not plain data: dumped as it is
        return json.dumps(value, ensure_ascii=False, indent=indent)
    text = _SEEN.get(key)
    if text is None:
        text = json.dumps(value, ensure_ascii=False, indent=indent)
        if len(key[1]) <= _LARGEST:
            if len(_SEEN) >= _ENTRIES:
                _SEEN.clear()  # rare: agents' tools and calls repeat
            _SEEN[key] = text
    return text

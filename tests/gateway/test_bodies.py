"""Request bodies read straight from their bytes are the structs `read` makes of them parsed, and
a body that is not a valid one is left to `read`, which says why."""

import json

import msgspec
import pytest

from platoon.gateway import bodies, dialects

MESSAGES = {
    "model": "platoon-policy",
    "max_tokens": 64,
    "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {"p": "."}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.py"}]},
    ],
    "tools": [{"name": "ls", "description": "List.", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "auto"},
    "metadata": {"user_id": "u"},
    "stream": False,
}


def test_a_valid_body_decoded_is_the_body_read():
    raw = json.dumps(MESSAGES).encode()
    decoded = bodies.decode(raw, bodies.MessagesRequest)
    assert decoded == bodies.read(json.loads(raw), bodies.MessagesRequest, "Messages")
    assert dialects.anthropic_call(decoded) == dialects.anthropic_request(json.loads(raw))


@pytest.mark.parametrize(
    "change",
    [
        {"max_tokens": "many"},  # a wrong type
        {"top_k_sampling": 3},  # an unknown parameter
        {"background": True},  # a parameter only its neutral value of which is taken
        {"tools": [{"name": f"t{n}"} for n in range(bodies.MAX_TOOLS + 1)]},
    ],
)
def test_an_invalid_body_is_left_to_read(change):
    body = {**MESSAGES, **change}
    assert bodies.decode(json.dumps(body).encode(), bodies.MessagesRequest) is None
    with pytest.raises(bodies.DialectError):
        bodies.read(body, bodies.MessagesRequest, "Messages")


def test_bodies_not_utf8_json_are_left_to_read():
    assert bodies.decode(b'{"model": "m", "max_tokens": 1', bodies.MessagesRequest) is None
    utf16 = json.dumps(MESSAGES).encode("utf-16")
    assert bodies.decode(utf16, bodies.MessagesRequest) is None
    assert bodies.decode(msgspec.json.encode(MESSAGES) + b" x", bodies.MessagesRequest) is None

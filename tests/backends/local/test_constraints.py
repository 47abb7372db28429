# ruff: noqa: F811
"""The embedded sampler's constraint matcher on its own: whatever token a random sampler picks
among those allowed, the reply is what the constraint asks for, within its token budget."""

from __future__ import annotations

import json
import random

import pytest

from platoon.backends.local.constraints import (
    ConstraintError,
    Guide,
    Vocabulary,
    compile_constraint,
    out_of_reach,
)
from platoon.policy.constraints import DecodingConstraint, ToolSpec, schema_error
from tokenizer_fixtures import toy_tokenizer  # noqa: F401

NUMBER = {"type": "object", "properties": {"number": {"type": "integer"}}, "required": ["number"]}
NOTE = {
    "type": "object",
    "properties": {
        "text": {"type": "string"},
        "level": {"enum": [1, 12, "high"]},
        "scores": {"type": "array", "items": {"type": "number"}},
        "done": {"type": ["boolean", "null"]},
        "meta": {"type": "object"},
    },
    "required": ["text", "level"],
}
CALLS = [ToolSpec(name="guess", parameters=NUMBER), ToolSpec(name="note", parameters=NOTE)]


def decode_at_random(
    tokenizer, constraint: DecodingConstraint, max_tokens: int, seed: int
) -> tuple[str, bool]:
    """(the text, whether it ended with a stop token) of a reply drawn uniformly among the allowed tokens."""
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    guide = Guide(compile_constraint(constraint), Vocabulary(tokenizer, len(tokenizer) + 7), [stop])
    rng = random.Random(seed)
    tokens: list[int] = []
    for left in range(max_tokens - 1, -1, -1):
        token = int(rng.choice(list(guide.allowed(left))))
        if token == stop:
            return tokenizer.decode(tokens), True
        tokens.append(token)
        guide.advance(token)
    return tokenizer.decode(tokens), False


@pytest.mark.parametrize("seed", range(6))
def test_random_choices_among_the_allowed_tokens_make_the_reply_asked_for(toy_tokenizer, seed):
    text, stopped = decode_at_random(toy_tokenizer, DecodingConstraint(schema=NOTE), 64, seed)
    assert stopped and schema_error(json.loads(text), NOTE) is None, text
    text, stopped = decode_at_random(toy_tokenizer, DecodingConstraint(), 24, seed)
    assert stopped and isinstance(json.loads(text), dict), text
    constraint = DecodingConstraint(tools=CALLS, after="\n</tool_call>")
    text, stopped = decode_at_random(toy_tokenizer, constraint, 96, seed)
    assert stopped and text.endswith("\n</tool_call>"), text
    call = json.loads(text.removesuffix("\n</tool_call>"))
    assert schema_error(call["arguments"], {"guess": NUMBER, "note": NOTE}[call["name"]]) is None, text


def test_a_written_opening_is_continued_and_a_wrong_one_refused(toy_tokenizer):
    opened = DecodingConstraint(
        tools=CALLS, written='{"name": "guess", "arguments": ', after="\n</tool_call>"
    )
    text, stopped = decode_at_random(toy_tokenizer, opened, 32, 1)
    assert stopped and isinstance(json.loads(text.removesuffix("}\n</tool_call>"))["number"], int), text
    with pytest.raises(ConstraintError):
        compile_constraint(DecodingConstraint(tools=CALLS, written='{"name": "shout"'))


def test_a_tool_whose_shortest_call_cannot_end_within_the_room_is_out_of_reach(toy_tokenizer):
    """The guide starts a call only where it can end, counting a character a token: a tool with
    a long name and a required string is never drawn when max_tokens is small, whatever the
    model prefers. `out_of_reach` names it (the sampler warns), with the characters it takes."""
    tools = [
        ToolSpec(
            "answer", {"type": "object", "properties": {"room": {"type": "integer"}}, "required": ["room"]}
        ),
        ToolSpec(
            "spawn_subagent",
            {
                "type": "object",
                "properties": {"instruction": {"type": "string"}},
                "required": ["instruction"],
            },
        ),
    ]
    constraint = DecodingConstraint(tools=tools, after="\n</tool_call>")
    # the characters of each tool's shortest call, its closing markup included
    shortest = {
        "answer": len('{"name": "answer", "arguments": {"room": 0}}\n</tool_call>'),
        "spawn_subagent": len('{"name": "spawn_subagent", "arguments": {"instruction": ""}}\n</tool_call>'),
    }
    assert shortest == {"answer": 57, "spawn_subagent": 73}
    vocab = Vocabulary(toy_tokenizer, len(toy_tokenizer))
    assert out_of_reach(constraint, 200, vocab) == []
    [(name, chars)] = out_of_reach(constraint, 60, vocab)
    assert name == "spawn_subagent" and shortest[name] - 1 <= chars <= shortest[name]
    # Short of room for any call, the guide takes the shortest (to be cut at max_tokens): the
    # longer one is still never started.
    assert out_of_reach(constraint, 20, vocab) == [(name, chars)]
    assert out_of_reach(DecodingConstraint(tools=tools[1:], after="\n</tool_call>"), 10, vocab) == []
    # What the guide itself does, token by token, at each room: it starts the tool, or it never does.
    for room in (20, 60, 75, 200):
        reached = {name for name, _ in out_of_reach(constraint, room, vocab)} ^ shortest.keys()
        drawn = {decode_at_random(toy_tokenizer, constraint, room + 1, seed)[0] for seed in range(12)}
        started = {name for name in shortest if any(f'"name": "{name}"' in text for text in drawn)}
        assert started <= reached, room

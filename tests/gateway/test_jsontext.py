"""The tools' and calls' JSON text, kept across calls, is exactly what json.dumps writes."""

import json
import math

import pytest

from platoon.gateway.jsontext import dumps


@pytest.mark.parametrize("indent", [None, 4])
def test_dumps_writes_what_json_dumps_writes_the_first_time_and_after(indent):
    tool = {
        "type": "function",
        "function": {
            "name": "run",
            "description": 'Führt einen Befehl aus — und gibt "die Ausgabe" zurück.',
            "parameters": {"type": "object", "properties": {"n": {"type": "integer", "maximum": 2.5}}},
        },
    }
    expected = json.dumps(tool, ensure_ascii=False, indent=indent)
    assert dumps(tool, indent) == expected
    assert dumps(tool, indent) == expected  # kept


def test_values_json_writes_apart_are_kept_apart():
    values = [
        {"x": 1},
        {"x": 1.0},
        {"x": True},
        {"x": None},
        {"x": math.nan},
        {"x": -0.0},
        {"x": 0.0},
        {"a": 1, "b": 2},
        {"b": 2, "a": 1},
        {1: "a"},
    ]
    for _ in range(2):
        assert [dumps(v) for v in values] == [json.dumps(v, ensure_ascii=False) for v in values]


def test_what_json_cannot_write_is_refused_every_time():
    for _ in range(2):
        with pytest.raises(TypeError):
            dumps({"x": {1, 2}})  # msgpack writes a set; json does not

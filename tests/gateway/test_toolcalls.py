import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from platoon.gateway.toolcalls import (
    HermesToolParser,
    ToolParseResult,
    UnknownToolParserError,
    get_tool_call_parser,
    register_tool_call_parser,
    tool_call_parser_names,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "detailed": {"type": ["boolean", "null"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]


def calls(result: ToolParseResult) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in result.tool_calls]


def hermes(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


# hermes / qwen


def test_hermes_reads_calls_and_keeps_surrounding_text():
    text = (
        "Let me check both.\n"
        + hermes('{"name": "get_weather", "arguments": {"city": "Paris"}}')
        + "\n"
        + hermes('{"name": "add", "arguments": {"a": 1, "b": 2.5}}')
    )
    result = get_tool_call_parser("hermes").parse(text, TOOLS)
    assert result.errors == []
    assert result.content == "Let me check both."
    assert calls(result) == [("get_weather", {"city": "Paris"}), ("add", {"a": 1, "b": 2.5})]
    first = result.tool_calls[0]
    assert first["type"] == "function" and first["id"].startswith("call_")
    assert first["function"]["arguments"] == '{"city": "Paris"}'
    assert len({c["id"] for c in result.tool_calls}) == 2


def test_hermes_without_calls_is_content():
    result = get_tool_call_parser("qwen").parse("  The answer is 4.\n", TOOLS)
    assert result == ToolParseResult(content="The answer is 4.")


def test_hermes_accepts_parameters_key_and_string_arguments():
    text = hermes('{"name": "get_weather", "parameters": {"city": "Oslo"}}') + hermes(
        '{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}'
    )
    result = HermesToolParser().parse(text, TOOLS)
    assert calls(result) == [("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Rome"})]


def test_hermes_without_tools_accepts_any_name():
    result = HermesToolParser().parse(hermes('{"name": "anything", "arguments": {"x": [1]}}'))
    assert calls(result) == [("anything", {"x": [1]})]
    result = HermesToolParser().parse(hermes('{"name": "anything"}'), [])
    assert calls(result) == [("anything", {})]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ('{"name": "get_weather", "arguments": {"city": "Paris"}', "invalid JSON in tool call"),
        ("not json at all", "invalid JSON in tool call: Expecting value at line 1 column 1"),
        ('["get_weather"]', 'a tool call must be a JSON object with a string "name"'),
        ('{"arguments": {"city": "Paris"}}', 'a tool call must be a JSON object with a string "name"'),
        ('{"name": "add", "arguments": [1, 2]}', "arguments of 'add' must be a JSON object, got array"),
        ('{"name": "add", "arguments": "1 + 2"}', "arguments of 'add' must be a JSON object, got a string"),
    ],
)
def test_hermes_what_cannot_be_a_call_stays_as_text_with_an_error(body, error):
    text = "Calling.\n" + hermes(body)
    result = HermesToolParser().parse(text, TOOLS)
    assert result.tool_calls == []
    assert result.content == text
    assert len(result.errors) == 1
    assert result.errors[0].startswith("tool call 1: " + error)


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (
            '{"name": "get_wether", "arguments": {}}',
            "unknown tool 'get_wether' (available: get_weather, add)",
        ),
        (
            '{"name": "get_weather", "arguments": {"days": 3}}',
            "'get_weather' is missing required argument(s): city",
        ),
        (
            '{"name": "get_weather", "arguments": {"city": 7}}',
            "argument 'city' of 'get_weather' must be string, got integer",
        ),
        (
            '{"name": "get_weather", "arguments": {"city": "P", "days": 1.5}}',
            "argument 'days' of 'get_weather' must be integer, got number",
        ),
        (
            '{"name": "get_weather", "arguments": {"city": "P", "days": true}}',
            "argument 'days' of 'get_weather' must be integer, got boolean",
        ),
        (
            '{"name": "get_weather", "arguments": {"city": "P", "detailed": "yes"}}',
            "argument 'detailed' of 'get_weather' must be boolean or null, got string",
        ),
        (
            '{"name": "get_weather", "arguments": {"city": "P", "unit": "kelvin"}}',
            "argument 'unit' of 'get_weather' must be one of [\"celsius\", \"fahrenheit\"]",
        ),
        (
            '{"name": "add", "arguments": {"a": 1, "b": 2, "c": 3}}',
            "'add' has no argument 'c' (expected: a, b)",
        ),
    ],
)
def test_hermes_a_call_that_does_not_fit_the_tools_is_a_call_with_an_error(body, error):
    """As the APIs return it: the agent answers it (unknown tool, bad arguments) and goes on."""
    result = HermesToolParser().parse("Calling.\n" + hermes(body), TOOLS)
    expected = json.loads(body)
    assert calls(result) == [(expected["name"], expected["arguments"])]
    assert result.content == "Calling."
    assert result.errors == ["tool call 1: " + error]


def test_hermes_good_calls_and_bad_neighbours_are_numbered_in_order():
    bad = hermes('{"name": "add", "arguments": {"a": "one", "b": 2}}')
    good = hermes('{"name": "add", "arguments": {"a": 1, "b": 2}}')
    broken = hermes('{"name": "add", "arguments": {"a": 1')
    result = HermesToolParser().parse(good + "\n" + bad + "\n" + broken, TOOLS)
    assert calls(result) == [("add", {"a": 1, "b": 2}), ("add", {"a": "one", "b": 2})]
    assert result.content == broken
    assert result.errors[0] == "tool call 2: argument 'a' of 'add' must be number, got string"
    assert result.errors[1].startswith("tool call 3: invalid JSON in tool call")


def test_hermes_unterminated_block_is_reported():
    text = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1'
    result = HermesToolParser().parse(text, TOOLS)
    assert result.tool_calls == []
    assert result.content == text
    assert result.errors == ["tool call 1: unterminated <tool_call> block"]


# llama3


def test_llama3_reads_python_tag_and_bare_json():
    parser = get_tool_call_parser("llama3")
    tagged = parser.parse('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', TOOLS)
    assert calls(tagged) == [("get_weather", {"city": "Paris"})] and tagged.content == ""
    bare = parser.parse('{"name": "add", "arguments": {"a": 1, "b": 2}}', TOOLS)
    assert calls(bare) == [("add", {"a": 1, "b": 2})] and bare.errors == []


def test_llama3_reads_several_calls_and_keeps_text_before_the_tag():
    text = (
        'Checking.<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}; '
        '{"name": "get_weather", "parameters": {"city": "Rome"}}'
    )
    result = get_tool_call_parser("llama3").parse(text, TOOLS)
    assert calls(result) == [("add", {"a": 1, "b": 2}), ("get_weather", {"city": "Rome"})]
    assert result.content == "Checking."


def test_llama3_plain_text_is_content():
    result = get_tool_call_parser("llama3").parse("Paris is sunny. {not a call}", TOOLS)
    assert result == ToolParseResult(content="Paris is sunny. {not a call}")


def test_llama3_malformed_json_stays_as_text():
    text = '{"name": "add", "parameters": {"a": 1, '
    result = get_tool_call_parser("llama3").parse(text, TOOLS)
    assert result.tool_calls == [] and result.content == text.strip()
    assert result.errors[0].startswith("tool call 1: invalid JSON in tool call")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('<|python_tag|>{"name": "nope", "parameters": {}}', "tool call 1: unknown tool 'nope'"),
        ('{"name": "add", "parameters": {"a": 1}}', "tool call 1: 'add' is missing required argument(s): b"),
    ],
)
def test_llama3_calls_that_do_not_fit_the_tools_are_calls_with_an_error(text, error):
    result = get_tool_call_parser("llama3").parse(text, TOOLS)
    assert len(result.tool_calls) == 1 and result.content == ""
    assert result.errors[0].startswith(error)


def test_llama3_bad_second_call_keeps_first():
    text = '{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "add", "parameters": [1]}'
    result = get_tool_call_parser("llama3").parse(text, TOOLS)
    assert calls(result) == [("add", {"a": 1, "b": 2})]
    assert result.content == '{"name": "add", "parameters": [1]}'
    assert result.errors == ["tool call 2: arguments of 'add' must be a JSON object, got array"]


# json fallback


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "add", "arguments": {"a": 1, "b": 2}}',
        '```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```',
        '  [{"name": "add", "parameters": {"a": 1, "b": 2}}]  ',
    ],
)
def test_json_reads_a_whole_reply_call(text):
    result = get_tool_call_parser("json").parse(text, TOOLS)
    assert calls(result) == [("add", {"a": 1, "b": 2})]
    assert result.content == "" and result.errors == []


@pytest.mark.parametrize("text", ["The answer is 3.", '{"answer": 3}', "[1, 2, 3]", "{oops: not json}"])
def test_json_non_calls_are_content(text):
    assert get_tool_call_parser("json").parse(text, TOOLS) == ToolParseResult(content=text)


def test_json_malformed_calls_keep_the_whole_reply():
    parser = get_tool_call_parser("json")
    broken = parser.parse('{"name": "add", "arguments": {"a": 1', TOOLS)
    assert broken.tool_calls == [] and broken.errors[0].startswith("tool call 1: invalid JSON in tool call")
    listed = '[{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "sub", "arguments": 5}]'
    result = parser.parse(listed, TOOLS)
    assert result.tool_calls == [] and result.content == listed
    assert result.errors == ["tool call 2: arguments of 'sub' must be a JSON object, got integer"]
    unknown = '[{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "sub", "arguments": {}}]'
    result = parser.parse(unknown, TOOLS)
    assert calls(result) == [("add", {"a": 1, "b": 2}), ("sub", {})] and result.content == ""
    assert result.errors == ["tool call 2: unknown tool 'sub' (available: get_weather, add)"]


# registry and robustness


def test_registry():
    assert {"hermes", "qwen", "llama3", "json"} <= set(tool_call_parser_names())
    with pytest.raises(UnknownToolParserError, match="unknown tool_call_parser 'nope'"):
        get_tool_call_parser("nope")

    class Upper(HermesToolParser):
        name = "upper"

        def parse(self, text, tools=None):
            return ToolParseResult(content=text.upper())

    register_tool_call_parser("upper", Upper)
    assert get_tool_call_parser("upper").parse("hi").content == "HI"


pieces = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<|python_tag|>",
        "{",
        "}",
        "[",
        "]",
        '"name"',
        ":",
        ",",
        ";",
        '"add"',
        '"arguments"',
        '{"a": 1, "b": 2}',
        "\n",
        " ",
        "text",
        "```",
        "null",
        "1e999",
        '"\\ud800"',
    ]
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(pieces | st.text(max_size=5), max_size=20).map("".join))
def test_parsers_never_raise(text):
    for name in ("hermes", "llama3", "json"):
        result = get_tool_call_parser(name).parse(text, TOOLS)
        assert isinstance(result.content, str)
        for call in result.tool_calls:
            assert isinstance(json.loads(call["function"]["arguments"]), dict)

"""The dialect translations as pure functions: request bodies to chat messages (with the bad
field named), and finished answers to each dialect's response and stream."""

from __future__ import annotations

import json

import pytest

from platoon.bus.chat import ChatMessage
from platoon.gateway import dialects
from platoon.gateway.dialects import DialectError

CALL = {"id": "call_1", "type": "function", "function": {"name": "guess", "arguments": '{"number": 5}'}}
TOOL = {"type": "function", "function": {"name": "guess", "parameters": {"type": "object"}}}


# --- chat completions -------------------------------------------------------------------------


def test_chat_request_reads_messages_tools_and_params():
    body = {
        "model": "m",
        "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "tools": [TOOL],
        "stop": "END",
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "max_completion_tokens": 64,
        "max_tokens": 10,
        "seed": 3,
        "n": 2,
        "stream": True,
    }
    messages, tools, params, n, stream = dialects.chat_request(body)
    assert messages.dicts == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    # As its record carries them: the same, read from the body once.
    assert messages.typed == [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]
    assert tools == [TOOL]
    assert params == {
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "max_tokens": 64,
        "stop": ["END"],
        "seed": 3,
        "tool_choice": None,
        "parallel_tool_calls": None,
        "top_logprobs": None,
        "response_format": None,
    }
    assert (n, stream) == (2, True)
    assert body["messages"][0]["role"] == "developer"  # the body is not changed


def test_chat_request_passes_tool_choice_on_with_the_tools():
    """The model still sees the tools under tool_choice none; the gateway then parses no calls."""
    _, tools, params, _, _ = dialects.chat_request(
        {"messages": [{"role": "user", "content": "Hi"}], "tools": [TOOL], "tool_choice": "none"}
    )
    assert tools == [TOOL] and params["tool_choice"] == "none"
    named = {"type": "function", "function": {"name": "guess"}}
    _, _, params, _, _ = dialects.chat_request(
        {"messages": [{"role": "user", "content": "Hi"}], "tools": [TOOL], "tool_choice": named}
    )
    assert params["tool_choice"] == {"name": "guess"}


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"response_format": {"type": "regex"}}, "response_format"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"strict": True, "schema": {"anyOf": []}},
                }
            },
            "response_format",
        ),
        ({"top_logprobs": "three"}, "top_logprobs"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"logit_bias": {"1": 5}}, "logit_bias"),
        ({"no_such_parameter": 1}, "no_such_parameter"),
        ({"tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
    ],
)
def test_chat_request_refuses_what_it_cannot_honour(extra, field):
    with pytest.raises(DialectError) as error:
        dialects.chat_request({"messages": [{"role": "user", "content": "Hi"}], **extra})
    assert error.value.param == field and str(error.value).startswith(field)


def test_chat_request_asks_for_top_logprobs_with_logprobs_only_and_in_openais_range():
    ask = {"messages": [{"role": "user", "content": "Hi"}], "top_logprobs": 3}
    assert dialects.chat_request({**ask, "logprobs": True}).params["top_logprobs"] == 3
    assert dialects.chat_request(ask).params["top_logprobs"] is None
    with pytest.raises(DialectError) as error:
        dialects.chat_request({**ask, "logprobs": True, "top_logprobs": 21})
    assert (error.value.param, error.value.code) == ("top_logprobs", "integer_above_max_value")
    assert str(error.value) == (
        "Invalid 'top_logprobs': integer above maximum value. Expected a value <= 20, but got 21 instead."
    )


def test_chat_request_takes_hints_and_neutral_values():
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "user": "u",
        "metadata": {"a": "b"},
        "store": False,
        "reasoning_effort": "low",
        "response_format": {"type": "text"},
        "top_logprobs": 0,
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "logit_bias": {},
    }
    dialects.chat_request(body)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], None),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "user"}, "text"]}, "messages.1"),
        ({"messages": [{"role": 3}]}, "messages.0"),
        ({"messages": [{"role": "user"}], "tools": "guess"}, "tools"),
        ({"messages": [{"role": "user"}], "stop": ["a", 1]}, "stop"),
        ({"messages": [{"role": "user"}], "temperature": True}, "temperature"),
        ({"messages": [{"role": "user"}], "top_k": 2.5}, "top_k"),
        ({"messages": [{"role": "user"}], "max_tokens": "10"}, "max_tokens"),
        ({"messages": [{"role": "user"}], "n": 0}, "n"),
        ({"messages": [{"role": "user"}], "n": 17}, "n"),
        ({"messages": [{"role": "user"}], "stream": "yes"}, "stream"),
    ],
)
def test_chat_request_names_the_bad_field(body, field):
    with pytest.raises(DialectError) as error:
        dialects.chat_request(body)
    assert error.value.param == field
    assert str(error.value).startswith(field or "the body must be a JSON object")


def test_chat_response_and_its_stream_carry_the_same_answer():
    message = {"role": "assistant", "content": "Trying.", "reasoning_content": "Think.", "tool_calls": [CALL]}
    logprobs = dialects.Logprobs(["Try", "ing", "."], [-0.1, -0.2, -0.3])
    response = dialects.chat_response("m", [(message, "tool_calls", logprobs)], (10, 3), "abc")
    assert response["id"] == "chatcmpl-abc" and response["object"] == "chat.completion"
    [choice] = response["choices"]
    assert choice["message"] == message and choice["finish_reason"] == "tool_calls"
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [-0.1, -0.2, -0.3]
    assert response["usage"] == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}

    payloads = list(dialects.chat_stream(response, include_usage=True))
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert {c["id"] for c in chunks} == {"chatcmpl-abc"}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0]["role"] == "assistant"
    assert "".join(d.get("content") or "" for d in deltas) == "Trying."
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "Think."
    assert [tc for d in deltas for tc in d.get("tool_calls", [])] == [{"index": 0, **CALL}]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1] == {**chunks[-1], "choices": [], "usage": response["usage"]}


def test_chat_stream_sends_logprobs_of_a_reply_without_text_on_the_last_chunk():
    message = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    response = dialects.chat_response(
        "m", [(message, "tool_calls", dialects.Logprobs(["a"], [-0.5]))], (1, 1), "x"
    )
    chunks = [json.loads(p) for p in list(dialects.chat_stream(response, include_usage=False))[:-1]]
    with_logprobs = [c for c in chunks if c["choices"][0].get("logprobs")]
    assert len(with_logprobs) == 1
    assert with_logprobs[0]["choices"][0]["finish_reason"] == "tool_calls"
    assert with_logprobs[0]["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.5


def test_chat_stream_with_several_choices():
    choices = [({"role": "assistant", "content": f"answer {i}"}, "stop", None) for i in range(2)]
    response = dialects.chat_response("m", choices, (5, 4), "n2")
    chunks = [json.loads(p) for p in list(dialects.chat_stream(response, include_usage=False))[:-1]]
    for index in (0, 1):
        text = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"][0]["index"] == index
        )
        assert text == f"answer {index}"


# --- Responses --------------------------------------------------------------------------------


def test_responses_request_turns_items_into_messages():
    body = {
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Guess."}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Let me try."}],
            },
            {"type": "function_call", "call_id": "c1", "name": "guess", "arguments": '{"number": 5}'},
            {"type": "function_call", "call_id": "c2", "name": "guess", "arguments": '{"number": 6}'},
            {"type": "function_call_output", "call_id": "c1", "output": "no"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "yes"}],
            },
            {"type": "function_call", "call_id": "c3", "name": "guess"},
        ],
        "tools": [
            {"type": "function", "name": "guess", "description": "Guess.", "parameters": {"type": "object"}}
        ],
        "max_output_tokens": 50,
        "temperature": 0.2,
        "stream": False,
    }
    messages, tools, params, stream = dialects.responses_request(body)
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Guess."},
        {
            "role": "assistant",
            "content": "Let me try.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "guess", "arguments": '{"number": 5}'}},
                {"id": "c2", "type": "function", "function": {"name": "guess", "arguments": '{"number": 6}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "no"},
        {"role": "tool", "tool_call_id": "c2", "content": "yes"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c3", "type": "function", "function": {"name": "guess", "arguments": "{}"}}
            ],
        },
    ]
    assert tools == [
        {
            "type": "function",
            "function": {"name": "guess", "description": "Guess.", "parameters": {"type": "object"}},
        }
    ]
    assert params == {
        "temperature": 0.2,
        "top_p": None,
        "max_tokens": 50,
        "tool_choice": None,
        "parallel_tool_calls": None,
        "top_logprobs": None,
        "response_format": None,
    }
    assert stream is False


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("hi", None),
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": ["hi"]}, "input.0"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input.0.content.0"),
        ({"input": [{"type": "computer_call"}]}, "input.0.type"),
        ({"input": "hi", "previous_response_id": 5}, "previous_response_id"),
        ({"input": "hi", "text": {"format": {"type": "json_schema"}}}, "text"),
        ({"input": "hi", "instructions": 5}, "instructions"),
        ({"input": "hi", "tools": [{"type": "file_search"}]}, "tools.0"),
        ({"input": "hi", "max_output_tokens": 1.5}, "max_output_tokens"),
    ],
)
def test_responses_request_names_the_bad_field(body, field):
    with pytest.raises(DialectError) as error:
        dialects.responses_request(body)
    assert error.value.param == field


def test_responses_response_and_stream():
    message = {"role": "assistant", "content": "Trying.", "reasoning_content": "Hmm.", "tool_calls": [CALL]}
    response = dialects.responses_response("m", message, "tool_calls", (7, 4), "r1")
    assert response["id"] == "resp_r1" and response["status"] == "completed"
    assert [o["type"] for o in response["output"]] == ["reasoning", "message", "function_call"]
    assert response["output"][2]["call_id"] == "call_1"
    assert response["usage"]["total_tokens"] == 11

    events = list(dialects.responses_stream(response))
    kinds = [kind for kind, _ in events]
    data = [json.loads(d) for _, d in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [d["type"] for d in data] == kinds
    assert [d["sequence_number"] for d in data] == list(range(1, len(events) + 1))
    assert data[-1]["response"] == response
    text = "".join(d["delta"] for d in data if d["type"] == "response.output_text.delta")
    arguments = "".join(d["delta"] for d in data if d["type"] == "response.function_call_arguments.delta")
    assert (text, arguments) == ("Trying.", '{"number": 5}')
    done = [d["item"] for d in data if d["type"] == "response.output_item.done"]
    assert done == response["output"]


def test_a_cut_off_response_is_incomplete():
    response = dialects.responses_response(
        "m", {"role": "assistant", "content": "one two"}, "length", (1, 2), "r"
    )
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert list(dialects.responses_stream(response))[-1][0] == "response.incomplete"


# --- Anthropic Messages -----------------------------------------------------------------------


def test_anthropic_request_turns_blocks_into_messages():
    body = {
        "max_tokens": 100,
        "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}],
        "messages": [
            {"role": "user", "content": "Guess."},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": ""},
                    {"type": "text", "text": "Trying."},
                    {"type": "tool_use", "id": "t1", "name": "guess", "input": {"number": 5}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "no"}]},
                    {"type": "tool_result", "tool_use_id": "t2", "content": "boom", "is_error": True},
                    {"type": "text", "text": "Again."},
                ],
            },
        ],
        "tools": [{"name": "guess", "description": "Guess.", "input_schema": {"type": "object"}}],
        "stop_sequences": ["END"],
        "temperature": 0.3,
        "top_k": 5,
        "stream": True,
    }
    messages, tools, params, stream = dialects.anthropic_request(body)
    assert messages == [
        {"role": "system", "content": "Be brief.\nUse tools."},
        {"role": "user", "content": "Guess."},
        {
            "role": "assistant",
            "content": "Trying.",
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "guess", "arguments": '{"number": 5}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "no"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: boom"},
        {"role": "user", "content": "Again."},
    ]
    assert tools == [
        {
            "type": "function",
            "function": {"name": "guess", "description": "Guess.", "parameters": {"type": "object"}},
        }
    ]
    assert params == {
        "temperature": 0.3,
        "top_p": None,
        "top_k": 5,
        "max_tokens": 100,
        "stop": ["END"],
        "tool_choice": None,
        "parallel_tool_calls": None,
        "response_format": None,
    }
    assert stream is True


def test_anthropic_request_keeps_a_system_message_between_turns():
    """Claude Code 2.1 sends late instructions as a `system` message inside `messages`."""
    body = {
        "max_tokens": 10,
        "messages": [
            {"role": "user", "content": "Go."},
            {"role": "system", "content": [{"type": "text", "text": "Tools changed."}]},
            {"role": "assistant", "content": "Ok."},
        ],
    }
    messages, _, _, _ = dialects.anthropic_request(body)
    assert messages == [
        {"role": "user", "content": "Go."},
        {"role": "system", "content": "Tools changed."},
        {"role": "assistant", "content": "Ok."},
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"max_tokens": 1}, "messages"),
        ({"max_tokens": 1, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        ({"max_tokens": 1, "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        (
            {"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "tool_use"}]}]},
            "messages.0.content.0.type",
        ),
        ({"max_tokens": 1, "system": 5, "messages": [{"role": "user", "content": "x"}]}, "system"),
        ({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "tools": [{}]}, "tools.0"),
    ],
)
def test_anthropic_request_names_the_bad_field(body, field):
    with pytest.raises(DialectError) as error:
        dialects.anthropic_request(body)
    assert error.value.param == field
    assert str(error.value).startswith(field)


def test_anthropic_response_and_stream():
    message = {"role": "assistant", "content": "Trying.", "reasoning_content": "Hmm.", "tool_calls": [CALL]}
    response = dialects.anthropic_response("m", message, "tool_calls", (9, 5), "a1")
    assert response["stop_reason"] == "tool_use"
    assert response["content"] == [
        {"type": "thinking", "thinking": "Hmm.", "signature": ""},
        {"type": "text", "text": "Trying."},
        {"type": "tool_use", "id": "call_1", "name": "guess", "input": {"number": 5}},
    ]
    assert response["usage"] == {"input_tokens": 9, "output_tokens": 5}
    assert (
        dialects.anthropic_response("m", {"content": "x"}, "length", (1, 1), "b")["stop_reason"]
        == "max_tokens"
    )
    assert (
        dialects.anthropic_response("m", {"content": "x"}, "stop", (1, 1), "c")["stop_reason"] == "end_turn"
    )

    events = [(kind, json.loads(data)) for kind, data in dialects.anthropic_stream(response)]
    assert [k for k, d in events] == [d["type"] for k, d in events]
    assert events[0][0] == "message_start" and events[-1][0] == "message_stop"
    assert events[0][1]["message"]["content"] == [] and events[0][1]["message"]["stop_reason"] is None
    blocks: dict[int, dict] = {}
    for kind, data in events:
        if kind == "content_block_start":
            blocks[data["index"]] = dict(data["content_block"])
        elif kind == "content_block_delta":
            block, delta = blocks[data["index"]], data["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            else:
                block["partial"] = block.get("partial", "") + delta["partial_json"]
    blocks[2]["input"] = json.loads(blocks[2].pop("partial"))
    assert [blocks[i] for i in sorted(blocks)] == response["content"]
    [delta] = [d for k, d in events if k == "message_delta"]
    assert delta["delta"]["stop_reason"] == "tool_use" and delta["usage"]["output_tokens"] == 5


# --- the structs: nested fields, what real agents send, nulls ----------------------------------

USER = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    ("request_of", "body", "field", "message"),
    [
        (
            dialects.chat_request,
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": 5}}]}]},
            "messages.0.tool_calls.0.function.name",
            "expected a string, got an integer",
        ),
        (
            dialects.chat_request,
            {"messages": USER, "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            "tools.0.function.parameters",
            "expected an object, got an array",
        ),
        (
            dialects.chat_request,
            {"messages": [{"role": "tool", "content": "x", "tool_call_id": 7}]},
            "messages.0.tool_call_id",
            "expected a string, got an integer",
        ),
        (
            dialects.responses_request,
            {"input": [{"type": "function_call_output", "call_id": "c1", "output": 5}]},
            "input.0.output",
            "expected a string or an array, got an integer",
        ),
        (
            dialects.responses_request,
            {"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": {"a": 1}}]},
            "input.0.arguments",
            "expected a string, got an object",
        ),
        (
            dialects.responses_request,
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
            "input.0.content.0.text",
            "expected a string, got an integer",
        ),
        (
            dialects.responses_request,
            {"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": None}]}]},
            "input.0.summary.0.text",
            "expected a string, got null",
        ),
        (
            dialects.responses_request,
            {"input": [{"type": "function_call", "call_id": "c1"}]},
            "input.0",
            "missing the required field name",
        ),
        (
            dialects.responses_request,
            {"input": [{"type": "shell_call"}]},
            "input.0.type",
            "expected message, function_call, function_call_output or reasoning, got 'shell_call'",
        ),
        (
            dialects.responses_request,
            {"input": "hi", "reasoning": {"effort": 3}},
            "reasoning.effort",
            "expected a string, got an integer",
        ),
        (
            dialects.anthropic_request,
            {
                "max_tokens": 1,
                "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": 5}]}],
            },
            "messages.0.content.0.tool_use_id",
            "expected a string, got an integer",
        ),
        (
            dialects.anthropic_request,
            {
                "max_tokens": 1,
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]}
                ],
            },
            "messages.0.content.0.content",
            "expected a string or an array, got an integer",
        ),
        (
            dialects.anthropic_request,
            {
                "max_tokens": 1,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image"}]}
                        ],
                    }
                ],
            },
            "messages.0.content.0.content.0.type",
            "expected text, got 'image'",
        ),
        (
            dialects.anthropic_request,
            {
                "max_tokens": 1,
                "messages": [
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}],
                    }
                ],
            },
            "messages.0.content.0.input",
            "expected an object, got a string",
        ),
        (
            dialects.anthropic_request,
            {"max_tokens": 1, "messages": USER, "system": [{"type": "text", "text": 5}]},
            "system.0.text",
            "expected a string, got an integer",
        ),
        (
            dialects.anthropic_request,
            {"max_tokens": 1, "messages": USER, "tool_choice": {"type": "tool"}},
            "tool_choice",
            "missing the required field name",
        ),
        (
            dialects.anthropic_request,
            {"max_tokens": 1, "messages": USER, "tool_choice": {"type": "some"}},
            "tool_choice.type",
            "expected auto, any, none or tool, got 'some'",
        ),
        (
            dialects.anthropic_request,
            {"max_tokens": 1, "messages": USER, "thinking": {"type": "enabled", "budget_tokens": "all"}},
            "thinking.budget_tokens",
            "expected an integer, got a string",
        ),
    ],
)
def test_a_wrong_nested_field_is_named_with_what_was_expected(request_of, body, field, message):
    with pytest.raises(DialectError) as error:
        request_of(body)
    assert error.value.param == field
    assert str(error.value) == f"{field}: {message}"


def test_a_codex_responses_body_is_read():
    """The shapes Codex sends: ids and statuses on items, annotations, reasoning with encrypted
    content, client metadata, strict function tools."""
    body = {
        "model": "platoon-policy",
        "stream": True,
        "input": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "developer",
                "content": [
                    {"type": "input_text", "text": "Sandbox."},
                    {"type": "input_text", "text": "Skills."},
                ],
            },
            {
                "type": "message",
                "id": "msg_2",
                "role": "user",
                "content": [{"type": "input_text", "text": "Go."}],
            },
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "**Plan**"}],
                "content": None,
                "encrypted_content": "gAAAA",
            },
            {
                "type": "message",
                "status": "completed",
                "id": "msg_3",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Step 1.", "annotations": [], "logprobs": []}],
            },
            {
                "type": "function_call",
                "status": "completed",
                "id": "fc_1",
                "name": "exec_command",
                "arguments": '{"cmd": "ls"}',
                "call_id": "call_1",
            },
            {"type": "function_call_output", "id": "fco_1", "call_id": "call_1", "output": "a.txt"},
        ],
        "tools": [
            {
                "type": "function",
                "name": "exec_command",
                "description": "Runs a command.",
                "strict": False,
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            }
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "01a2",
        "client_metadata": {"session_id": "01a2", "x-codex-window-id": "01a2:0"},
        "text": {"verbosity": "low"},
    }
    messages, tools, params, stream = dialects.responses_request(body)
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "exec_command", "arguments": '{"cmd": "ls"}'},
    }
    assert messages == [
        {"role": "system", "content": "Sandbox.\nSkills."},
        {"role": "user", "content": "Go."},
        {"role": "assistant", "content": "Step 1.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
    ]
    assert tools == [
        {
            "type": "function",
            "function": {
                "name": "exec_command",
                "description": "Runs a command.",
                "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
            },
        }
    ]
    assert params["tool_choice"] == "auto" and params["parallel_tool_calls"] is True and stream is True


def test_a_claude_code_messages_body_is_read():
    """The shapes Claude Code sends: cache_control on blocks and tool results, a system message
    between turns, adaptive thinking, context management, an effort, metadata."""
    cache = {"type": "ephemeral"}
    body = {
        "model": "platoon-policy",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": "x-billing-header: v=2"},
            {"type": "text", "text": "You are an agent.", "cache_control": cache},
        ],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "<reminder>"}, {"type": "text", "text": "Add them."}],
            },
            {"role": "system", "content": "# Environment"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "", "signature": "sig"},
                    {"type": "text", "text": "Step 1."},
                    {"type": "tool_use", "id": "call_1", "name": "Bash", "input": {"command": "ls"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "tool_use_id": "call_1",
                        "type": "tool_result",
                        "content": "a.txt",
                        "is_error": False,
                        "cache_control": cache,
                    }
                ],
            },
        ],
        "tools": [
            {
                "name": "Bash",
                "description": "Runs bash.",
                "input_schema": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"},
                "cache_control": cache,
            }
        ],
        "metadata": {"user_id": '{"device_id": "7e7a"}'},
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
    }
    messages, tools, params, stream = dialects.anthropic_request(body)
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "Bash", "arguments": '{"command": "ls"}'},
    }
    assert messages == [
        {"role": "system", "content": "x-billing-header: v=2\nYou are an agent."},
        {"role": "user", "content": "<reminder>\nAdd them."},
        {"role": "system", "content": "# Environment"},
        {"role": "assistant", "content": "Step 1.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"},
    ]
    assert tools[0]["function"]["parameters"] == body["tools"][0]["input_schema"]
    assert (params["max_tokens"], stream) == (32000, True)


def test_null_is_the_same_as_leaving_a_field_out():
    _, _, params, n, stream = dialects.chat_request(
        {"messages": USER, "n": None, "stream": None, "stop": None, "tool_choice": None, "top_logprobs": None}
    )
    assert (n, stream, params["stop"], params["tool_choice"]) == (1, False, None, None)
    messages, _, params, stream = dialects.anthropic_request(
        {
            "max_tokens": 5,
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": None}]}
            ],
            "tool_choice": {"type": "auto", "disable_parallel_tool_use": None},
            "stream": None,
        }
    )
    assert messages == [{"role": "tool", "tool_call_id": "t", "content": ""}]
    assert (params["tool_choice"], params["parallel_tool_calls"], stream) == ("auto", None, False)


def test_chat_messages_and_tools_reach_the_gateway_as_the_client_sent_them():
    """A tool's JSON is part of the prompt, and the renderer reads a message's own fields: both
    pass on whole, with fields the structs do not name and in the client's key order."""
    tool = {"function": {"parameters": {"type": "object"}, "name": "f", "strict": True}, "type": "function"}
    message = {"content": None, "role": "assistant", "refusal": None, "tool_calls": [CALL], "audio": None}
    messages, tools, _, _, _ = dialects.chat_request({"messages": [*USER, message], "tools": [tool]})
    assert tools == [tool] and list(tools[0]["function"]) == ["parameters", "name", "strict"]
    assert messages.dicts[1] == message and list(messages.dicts[1]) == list(message)


def test_count_tokens_takes_a_messages_body_without_max_tokens():
    messages, tools = dialects.count_tokens_request({"messages": USER, "tools": [{"name": "f"}]})
    assert messages == USER
    assert tools == [
        {
            "type": "function",
            "function": {"name": "f", "description": "", "parameters": {"type": "object", "properties": {}}},
        }
    ]


@pytest.mark.parametrize(
    ("request_of", "base"),
    [
        (dialects.chat_request, {"messages": USER}),
        (dialects.responses_request, {"input": "hi"}),
        (dialects.anthropic_request, {"max_tokens": 1, "messages": USER}),
    ],
)
@pytest.mark.parametrize(
    ("field", "neutral", "refused"),
    [
        ("background", False, True),
        ("truncation", "disabled", "auto"),
        ("modalities", ["text"], ["text", "audio"]),
        ("function_call", "none", {"name": "f"}),
        ("output_config", {"effort": "high"}, {"format": {"type": "regex"}}),
        ("text", {"verbosity": "low", "format": {"type": "text"}}, {"format": {"type": "grammar"}}),
        ("audio", None, {"voice": "alloy"}),
    ],
)
def test_what_cannot_be_honoured_is_taken_only_at_its_neutral_value(
    request_of, base, field, neutral, refused
):
    request_of({**base, field: neutral})
    with pytest.raises(DialectError) as error:
        request_of({**base, field: refused})
    assert error.value.param == field
    assert str(error.value).startswith(f"{field}: the gateway cannot honour ")

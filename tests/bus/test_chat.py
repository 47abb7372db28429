"""Chat messages on the bus: read from the dicts a harness sends, written back as they were,
and read from logs written when they were dicts."""

from __future__ import annotations

import pytest

from platoon.bus.chat import (
    ChatFunctionCall,
    ChatMessage,
    ChatToolCall,
    MessageReader,
    SampledMessage,
    message_dict,
    messages_of,
)
from platoon.bus.codec import decode, encode
from platoon.bus.events import ChatReplied, ChatRequested, ModelCallFinished

CALLED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "guess", "arguments": '{"n": 5}'}}],
}
ANSWERED = {"role": "tool", "tool_call_id": "c1", "name": "guess", "content": "higher"}
PARTS = {"role": "user", "content": ["Look:", {"type": "text", "text": "here"}]}


def test_a_message_reads_and_writes_back_as_it_was_sent():
    sent = [{"role": "system", "content": "Be brief."}, PARTS, CALLED, ANSWERED]
    assert [message_dict(m) for m in messages_of(sent)] == sent
    # Unset fields stay unset: a call without arguments is not given `null` ones.
    [bare] = messages_of([{"role": "assistant", "tool_calls": [{"function": {"name": "stop"}}]}])
    assert message_dict(bare) == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": {"name": "stop"}}],
    }


def test_keys_that_are_no_field_of_a_message_are_dropped():
    [message] = messages_of(
        [{"role": "user", "content": "hi", "cache_control": {"type": "ephemeral"}, "id": "m1"}]
    )
    assert message == ChatMessage("user", "hi")
    assert message_dict(message) == {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("messages", "error"),
    [
        (
            [{"role": "user", "content": 5}],
            r"messages\.0\.content: Expected `str \| array \| null`, got `int`",
        ),
        ([{"role": "user"}, {"content": "hi"}], r"messages\.1: Object missing required field `role`"),
        (
            [CALLED, {"role": "assistant", "tool_calls": [{"id": "c2"}]}],
            r"messages\.1\.tool_calls\.0: .*`function`",
        ),
        (["hi"], r"messages\.0: Expected `object`, got `str`"),
    ],
)
def test_a_message_that_does_not_fit_is_named_with_its_field(messages, error):
    with pytest.raises(ValueError, match=error):
        messages_of(messages)


def test_logs_written_when_messages_were_dicts_still_read():
    """Events encoded with dict messages (as every log before the messages were typed) decode
    into the structs; an error reply's empty message is an empty `SampledMessage`."""
    asked = ChatRequested(episode_id="e", agent_id="a", messages=[PARTS, CALLED, {**ANSWERED, "extra": 1}])  # type: ignore[list-item]
    replied = ChatReplied(reply_to=asked.request_id, error="budget", message={})  # type: ignore[arg-type]
    recorded = ModelCallFinished(
        call_id="c",
        episode_id="e",
        agent_id="a",
        prompt_tokens=[1],
        completion_tokens=[2],
        logprobs=[-0.1],
        stop_reason="stop",
        policy_version=0,
        messages=[ANSWERED],  # type: ignore[list-item]
    )
    read_asked, read_replied, read_recorded = (decode(encode(event)) for event in (asked, replied, recorded))
    assert isinstance(read_asked, ChatRequested) and isinstance(read_replied, ChatReplied)
    assert read_asked.messages == messages_of([PARTS, CALLED, ANSWERED])
    assert read_asked.messages[1].tool_calls == [
        ChatToolCall(id="c1", type="function", function=ChatFunctionCall("guess", '{"n": 5}'))
    ]
    assert read_replied.message == SampledMessage() and read_replied.error == "budget"
    assert isinstance(read_recorded, ModelCallFinished) and read_recorded.messages == messages_of([ANSWERED])


# --- MessageReader: one agent's calls, which repeat its history --------------------------------


def _call() -> dict:
    return {"id": "c1", "type": "function", "function": {"name": "run", "arguments": '{"cmd": "ls"}'}}


def test_a_history_read_again_keeps_its_structs_and_reads_only_what_it_adds():
    reader = MessageReader()
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    first = reader.read(history)
    history += [
        {"role": "assistant", "content": None, "tool_calls": [_call()]},
        {"role": "tool", "content": "x"},
    ]
    second = reader.read(history)
    assert second[:2] == first and all(a is b for a, b in zip(first, second[:2], strict=False))
    assert second == messages_of(history)


def test_a_message_changed_in_place_or_with_keys_of_its_own_is_read_as_it_is_now():
    reader = MessageReader()
    history = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": None, "tool_calls": [_call()]},
    ]
    reader.read(history)
    history[0]["content"] = "Hello"
    history[1]["tool_calls"][0]["function"]["arguments"] = '{"cmd": "ls tests"}'
    assert reader.read(history) == messages_of(history)
    history[0]["cache_control"] = {"type": "ephemeral"}  # dropped when read: never the same dict
    again = reader.read(history)
    assert again == messages_of(history) and again[0].content == "Hello"


def test_arguments_sent_as_an_object_are_read_each_time_as_they_are():
    """1, 1.0 and true are equal to Python: a message that holds them is never stood in for."""
    reader = MessageReader()
    for value in (1, 1.0, True, 1):
        call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"n": value}}}
        (message,) = reader.read([{"role": "assistant", "content": None, "tool_calls": [call]}])
        read = message.tool_calls[0].function.arguments
        assert type(read["n"]) is type(value)


def test_a_message_that_does_not_fit_after_a_repeated_history_is_named_by_its_place():
    reader = MessageReader()
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    reader.read(history)
    with pytest.raises(ValueError, match=r"messages\.2\.content"):
        reader.read([*history, {"role": "user", "content": 3}])
    assert reader.read(history) == messages_of(history)

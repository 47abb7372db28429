"""The cheap bound on a prompt's text is never below its characters."""

from collections import UserDict

from platoon.gateway.params import size_bound, text_size


def test_size_bound_is_at_least_the_characters_of_the_strings():
    messages = [
        {"role": "system", "content": "Sei kurz — 短く"},
        {"role": "user", "content": [{"type": "text", "text": 'quote " and \\ and \n'}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
        },
    ]
    assert size_bound(messages) >= text_size(messages) > 0


def test_a_value_msgspec_cannot_encode_is_counted():
    messages = [UserDict({"role": "user", "content": "hello"})]
    assert size_bound(messages) == text_size(messages) == len("user") + len("hello")

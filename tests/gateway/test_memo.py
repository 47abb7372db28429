"""An agent's prompt rendered with its memo is token for token the full render, call after call,
for every renderer: histories that grow, are edited, are cut short, change their tools, and
splice the tokens sampled for earlier turns."""

from __future__ import annotations

import functools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from platoon.gateway import renderers
from platoon.gateway.memo import RenderMemo
from platoon.gateway.renderers import get_renderer, renderer_names
from platoon.testing import tokenizers

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command (é, 中文).",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]
OTHER_TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]


def _call(n: int, arguments: object) -> dict:
    return {"id": f"c{n}", "type": "function", "function": {"name": "run", "arguments": arguments}}


def _tool_turns(n: int, *, parallel: bool, reasoning: bool) -> list[dict]:
    """An assistant turn calling a tool (two with `parallel`), then the results."""
    calls = [_call(n, json.dumps({"cmd": f"ls {n}"}))]
    if parallel:
        calls.append(_call(n + 100, {"cmd": f"cat {n}", "lines": 1.0}))  # arguments as an object
    turn: dict = {"role": "assistant", "content": None if n % 2 else "Looking.", "tool_calls": calls}
    if reasoning:
        turn["reasoning_content"] = f"I should look at {n}."
    results = [{"role": "tool", "tool_call_id": c["id"], "content": f"file_{n}.py\n"} for c in calls]
    return [turn, *results]


def _agent_calls(*, tools: bool, parallel: bool) -> list[tuple[list[dict], list[dict] | None]]:
    """An agent's calls one after another: (messages, tools) of each, the history growing, then a
    new user query (Qwen3 drops earlier reasoning), an edited turn, a compacted history, new tools."""
    history: list[dict] = [
        {"role": "system", "content": "You are a careful engineer."},
        {"role": "user", "content": "Fix the parser."},
    ]
    offered = TOOLS if tools else None
    calls = [(list(history), offered)]
    for n in range(3):
        if tools:
            history += _tool_turns(n, parallel=parallel, reasoning=n == 1)
        else:
            history += [
                {"role": "assistant", "content": f"Step {n}.", "reasoning_content": "thinking"},
                {"role": "user", "content": f"Go on ({n})."},
            ]
        calls.append((list(history), offered))
    history += [{"role": "assistant", "content": "Done."}, {"role": "user", "content": "Now the tests."}]
    calls.append((list(history), offered))
    edited = [dict(m) for m in history]
    edited[1]["content"] = "Fix the lexer."
    calls.append((edited, offered))
    calls.append(([history[0], {"role": "user", "content": "Summary: fixed. Go on."}], offered))
    if tools:
        calls.append((list(history), OTHER_TOOLS))
        calls.append((list(history), None))
    calls.append((list(history), offered))
    return calls


def _renderers(toy: object, llama: object) -> list[tuple[str, object, dict]]:
    """(name, tokenizer, what its format can render) for every built-in renderer."""
    return [
        ("qwen3", toy, {"tools": True, "parallel": True}),
        ("qwen3_instruct", toy, {"tools": True, "parallel": True}),
        ("smollm2", toy, {"tools": True, "parallel": True}),
        ("llama3", llama, {"tools": True, "parallel": False}),
        ("role_colon", toy, {"tools": False, "parallel": False}),
    ]


def _sampled(renderer: object, messages: list[dict], seed: int) -> dict[int, list[int]]:
    """Sampled tokens for some assistant turns, as the gateway splices them."""
    out = {}
    for i, message in enumerate(messages):
        if message["role"] == "assistant" and (i + seed) % 3:
            text = message.get("content") or "call"
            out[i] = renderer.tokenizer.encode(f"{text} {seed}", add_special_tokens=False)  # type: ignore[attr-defined]
    return out


@pytest.mark.parametrize("spliced", [False, True], ids=["text", "spliced"])
def test_every_renderer_with_a_memo_renders_what_a_full_render_does(spliced, toy_tokenizer, llama3_tokenizer):
    # Every renderer platoon registers (tests register more of their own).
    builtin = {
        n
        for n in renderer_names()
        if getattr(renderers._RENDERERS[n], "__module__", "").startswith(renderers.__name__ + ".")
    }
    assert {name for name, _, _ in _renderers(None, None)} == builtin
    for name, tokenizer, can in _renderers(toy_tokenizer, llama3_tokenizer):
        renderer = get_renderer(name, tokenizer)
        memo = RenderMemo()
        for seed, (messages, tools) in enumerate(_agent_calls(tools=can["tools"], parallel=can["parallel"])):
            completions = _sampled(renderer, messages, seed % 2) if spliced else None
            full = renderer.render(messages, tools, completions=completions)
            assert renderer.render(messages, tools, completions=completions, memo=memo) == full, (name, seed)
            # The same call again (a retry) reuses the whole prompt.
            assert renderer.render(messages, tools, completions=completions, memo=memo) == full, (name, seed)


def test_a_memo_reuses_only_the_renderer_that_wrote_it(toy_tokenizer, qwen3_tokenizer):
    """Two renderers of one format over different tokenizers tokenize the same text differently."""
    qwen = get_renderer("qwen3", toy_tokenizer)
    other = get_renderer("qwen3", qwen3_tokenizer)
    memo = RenderMemo()
    messages = [{"role": "user", "content": "Hello there, how do you do?"}]
    assert qwen.render(messages) != other.render(messages)
    assert qwen.render(messages, memo=memo) == qwen.render(messages)
    assert memo._last is not None and memo._last[0] is qwen
    assert other.render(messages, memo=memo) == other.render(messages)
    assert memo._last[0] is other


def test_a_prompt_without_generation_prompt_and_the_next_one(toy_tokenizer):
    renderer = get_renderer("qwen3", toy_tokenizer)
    memo = RenderMemo()
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    for agp in (False, True, False):
        full = renderer.render(messages, add_generation_prompt=agp)
        assert renderer.render(messages, add_generation_prompt=agp, memo=memo) == full


_TEXT = st.sampled_from(["", "Hi", "ls -la", "<tool_response>x</tool_response>", "é 中文", "\n\n", "a b"])


@st.composite
def _message(draw: st.DrawFn) -> dict:
    role = draw(st.sampled_from(["user", "assistant", "tool", "system"]))
    message: dict = {"role": role, "content": draw(_TEXT)}
    if role == "assistant":
        if draw(st.booleans()):
            message["reasoning_content"] = draw(_TEXT)
        if draw(st.booleans()):
            message["content"] = None
            arguments = draw(st.sampled_from(['{"cmd": "ls"}', {"cmd": "ls"}, {"n": 1}, {"n": 1.0}]))
            message["tool_calls"] = [_call(0, arguments)]
    if role == "tool":
        message["tool_call_id"] = "c0"
    return message


@st.composite
def _edits(draw: st.DrawFn) -> list[tuple[list[dict], list[dict] | None]]:
    """Calls of one agent: each appends, changes, drops messages, or changes its tools."""
    messages: list[dict] = [draw(_message())]
    tools = draw(st.sampled_from([None, TOOLS]))
    calls = [(list(messages), tools)]
    for _ in range(draw(st.integers(1, 8))):
        edit = draw(st.sampled_from(["append", "append", "append", "change", "drop", "tools"]))
        if edit == "append":
            messages += draw(st.lists(_message(), min_size=1, max_size=3))
        elif edit == "change":
            messages[draw(st.integers(0, len(messages) - 1))] = draw(_message())
        elif edit == "drop" and len(messages) > 1:
            del messages[draw(st.integers(0, len(messages) - 1))]
        else:
            tools = draw(st.sampled_from([None, TOOLS, OTHER_TOOLS]))
        calls.append((list(messages), tools))
    return calls


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=_edits(), name=st.sampled_from(["qwen3", "qwen3_instruct", "smollm2"]), seed=st.integers(0, 2))
def test_any_sequence_of_calls_renders_as_a_full_render(calls, name, seed):
    renderer = get_renderer(name, _toy())
    memo = RenderMemo()
    for messages, tools in calls:
        completions = _sampled(renderer, messages, seed)
        try:
            full = renderer.render(messages, tools, completions=completions)
        except ValueError:  # a history this format cannot render: the memo must refuse it too
            with pytest.raises(ValueError):
                renderer.render(messages, tools, completions=completions, memo=memo)
            continue
        assert renderer.render(messages, tools, completions=completions, memo=memo) == full


@functools.cache
def _toy() -> object:
    return tokenizers.toy_tokenizer()  # not the fixture: hypothesis runs the test many times


def test_messages_changed_in_place_between_calls_are_rendered_anew(toy_tokenizer):
    """A harness may edit its own messages in place between calls (in process, the gateway gets
    the very dicts): the memo keeps what they were, not the dicts."""
    for name in ("qwen3", "qwen3_instruct"):
        renderer = get_renderer(name, toy_tokenizer)
        memo = RenderMemo()
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "List the files."},
            *_tool_turns(0, parallel=True, reasoning=True),
            {"role": "user", "content": "And now?"},
        ]
        renderer.render(messages, TOOLS, memo=memo)
        messages[1]["content"] = "List the tests."
        messages[2]["tool_calls"][0]["function"]["arguments"] = '{"cmd": "ls tests"}'
        messages.append({"role": "assistant", "content": "Done."})
        assert renderer.render(messages, TOOLS, memo=memo) == renderer.render(messages, TOOLS)
        TOOLS[0]["function"]["description"] += " Changed."
        try:
            assert renderer.render(messages, TOOLS, memo=memo) == renderer.render(messages, TOOLS)
        finally:
            TOOLS[0]["function"]["description"] = TOOLS[0]["function"]["description"].removesuffix(
                " Changed."
            )


def test_a_renderer_that_says_only_what_it_keeps_writes_the_rest_from_its_whole_render(toy_tokenizer):
    """`Renderer._texts_from` by default is the tail of the whole render: a renderer that defines
    `_unchanged` alone still renders, through the memo, what a full render does."""

    class Keeping(renderers.SmolLM2Renderer):
        def _unchanged(self, before: object, after: object, same: int) -> int:
            return same - 1  # a tool result's chunk may depend on the message after it

    assert "_texts_from" not in vars(Keeping)
    renderer = Keeping(toy_tokenizer)
    memo = RenderMemo()
    for seed, (messages, tools) in enumerate(_agent_calls(tools=True, parallel=True)):
        full = renderer.render(messages, tools)
        assert renderer.render(messages, tools, memo=memo) == full, seed
        texts = memo._written[4] if memo._written is not None else []
        assert texts == renderer._texts(messages, tools, True), seed


# --- MessageMemo: an agent's messages over the bus, made into dicts once -------------------------


def _typed(messages: list[dict]) -> list:
    from platoon.bus.chat import messages_of

    return messages_of(messages)


def test_a_repeated_history_keeps_its_dicts_and_encodings_and_only_what_it_adds_is_made():
    from platoon.gateway.memo import MessageMemo, encoded_each

    memo = MessageMemo()
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    first = memo.read(_typed(history))
    grown = [*history, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Again"}]
    second = memo.read(_typed(grown))

    assert second.dicts == grown and second.written == encoded_each(grown)
    assert all(a is b for a, b in zip(first.dicts, second.dicts, strict=False))  # kept, not made again
    assert all(a is b for a, b in zip(first.written or [], second.written or [], strict=False))
    assert second.typed == _typed(grown)


def test_a_message_that_changed_is_made_again_from_where_it_changed():
    from platoon.gateway.memo import MessageMemo

    memo = MessageMemo()
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "A long answer."}]
    first = memo.read(_typed(history))
    cut = [history[0], {"role": "assistant", "content": "A long [cut]"}]  # a harness trims its history
    second = memo.read(_typed(cut))

    assert second.dicts == cut and second.dicts[0] is first.dicts[0] and second.dicts[1] is not first.dicts[1]


def test_arguments_sent_as_an_object_are_never_taken_from_the_last_call():
    """1 == 1.0 == True in Python, not in a prompt: a call whose arguments are an object is made
    again every time, so the number it renders is the one sent."""
    from platoon.gateway.memo import MessageMemo

    def turn(n: object) -> list[dict]:
        call = {"id": "c1", "type": "function", "function": {"name": "run", "arguments": {"n": n}}}
        return [
            {"role": "user", "content": "Go"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
        ]

    memo = MessageMemo()
    renderer = get_renderer("qwen3", tokenizers.toy_tokenizer())
    for n in (1, 1.0, True, 1):
        read = memo.read(_typed(turn(n)))
        assert read.dicts == turn(n) and renderer.render(read.dicts) == renderer.render(turn(n))
        assert type(read.dicts[1]["tool_calls"][0]["function"]["arguments"]["n"]) is type(n)


def test_a_message_published_in_process_as_a_dict_is_read_as_ctx_chat_reads_one():
    """A `ChatRequested` published by other code than `ctx.chat` may hold dicts: they are read
    into messages, and one that does not fit is refused by its place."""
    from platoon.bus.chat import ChatMessage
    from platoon.gateway.memo import MessageMemo

    memo = MessageMemo()
    memo.read([ChatMessage("user", "Hi")])
    read = memo.read([ChatMessage("user", "Hi"), {"role": "user", "content": "Again"}])  # type: ignore[list-item]
    assert read.typed == [ChatMessage("user", "Hi"), ChatMessage("user", "Again")]
    with pytest.raises(ValueError, match=r"messages\.1\.content: Expected"):
        memo.read([ChatMessage("user", "Hi"), {"role": "user", "content": 5}])  # type: ignore[list-item]


def test_messages_a_render_refused_are_checked_again_and_a_changed_one_is_checked(toy_tokenizer):
    """The memo skips checking only the leading messages its last render took: a message a
    render refused is refused again however often it comes, and one that changed is checked."""
    renderer = get_renderer("qwen3_instruct", toy_tokenizer)
    memo = RenderMemo()
    good = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    bad = [*good, {"role": "robot", "content": "beep"}]
    for _ in range(2):
        with pytest.raises(renderers.RendererError, match=r"messages\.2\.role"):
            renderer.render(bad, TOOLS, memo=memo)
    assert renderer.render(good, TOOLS, memo=memo) == renderer.render(good, TOOLS)
    with pytest.raises(renderers.RendererError, match=r"messages\.1\.role"):
        renderer.render([good[0], {"role": "robot", "content": "Hi"}], TOOLS, memo=memo)
    with pytest.raises(renderers.RendererError, match=r"messages\.1\.tool_calls"):
        renderer.render([good[0], {**good[1], "tool_calls": [_call(0, "{}")]}], TOOLS, memo=memo)


def test_a_prompt_the_caller_extends_leaves_the_next_one_as_a_full_render(toy_tokenizer):
    """The prompt a render returns is the caller's own list (the gateway appends a forced
    opening to it): what the memo keeps of it does not change with it."""
    renderer = get_renderer("qwen3_instruct", toy_tokenizer)
    memo = RenderMemo()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    prompt = renderer.render(messages, TOOLS, memo=memo)
    prompt += [7, 7, 7]
    prompt[0] = -1
    messages.append({"role": "assistant", "content": "Hello."})
    assert renderer.render(messages, TOOLS, memo=memo) == renderer.render(messages, TOOLS)


# --- RecordMemo: an HTTP agent's messages, read for its record once ------------------------------


def _recorded(memo: object, dicts: list[dict]) -> list:
    from platoon.gateway.memo import encoded_each
    from platoon.gateway.shapes import Messages

    return memo.read(Messages(dicts, encoded_each(dicts)))  # type: ignore[attr-defined]


def test_an_http_agents_repeated_history_is_recorded_as_the_structs_it_was_read_as():
    from platoon.bus.chat import messages_of
    from platoon.gateway.memo import RecordMemo

    memo = RecordMemo()
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi", "extra": 1}]
    first = _recorded(memo, history)
    history += [{"role": "assistant", "content": None, "tool_calls": [_call(0, '{"cmd": "ls"}')]}]
    second = _recorded(memo, history)
    assert second == messages_of(history) and all(a is b for a, b in zip(first, second, strict=False))
    history[0] = {"role": "system", "content": "Be long."}  # a message written otherwise is read
    assert _recorded(memo, history) == messages_of(history)
    for value in (1, 1.0, True):  # exact: 1, 1.0 and true are written apart
        (message,) = _recorded(memo, [{"role": "assistant", "tool_calls": [_call(0, {"n": value})]}])
        assert type(message.tool_calls[0].function.arguments["n"]) is type(value)
    with pytest.raises(ValueError, match=r"messages\.3\.content"):
        _recorded(memo, [*history, {"role": "user", "content": 3}])
    assert _recorded(memo, history) == messages_of(history)


def test_a_message_that_could_not_be_written_is_never_the_same_as_another():
    from platoon.gateway.memo import same_written

    assert same_written([b"a", None, b"c"], [b"a", None, b"c"]) == 1
    assert same_written([b"a", b"b", b"c"], [b"a", b"b"]) == 2
    assert same_written([b"a"], [b"a", b"b"]) == 1
    assert same_written([b"a", b"x", None], [b"a", b"b", None]) == 1

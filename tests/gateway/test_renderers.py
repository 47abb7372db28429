import copy
import json

import pytest

from platoon.gateway.renderers import (
    ParsedMessage,
    Qwen3Renderer,
    RendererError,
    UnknownRendererError,
    get_renderer,
    register_renderer,
    renderer_names,
)
from platoon.testing.tokenizers import QWEN3_INSTRUCT_CHAT_TEMPLATE

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather für a city (°C)",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    },
]


def call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "Hi there"}],
    "system_multi_turn": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "parallel_tools": [
        {"role": "system", "content": "Be helpful."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "Two cities, two calls.",
            "tool_calls": [
                call("c1", "get_weather", {"city": "Paris"}),
                call("c2", "get_weather", {"city": "Rome", "days": 2}),
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny, 20"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain, 15"},
        {"role": "assistant", "content": "Paris is sunny; Rome is rainy."},
        {"role": "user", "content": "Thanks!"},
    ],
    "agent_mid_episode": [
        {"role": "user", "content": "Find x."},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Search first.",
            "tool_calls": [call("c1", "search", {"q": "x"})],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "x = 3"},
        {"role": "assistant", "content": "x is 3.", "reasoning": "The tool said so."},
    ],
    "think_in_content": [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>\nold thoughts\n</think>\n\nA1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "<think>\nnew thoughts\n</think>\n\nA2"},
    ],
    "content_parts_and_late_system": [
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "two"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        {"role": "system", "content": "Now answer in French."},
        {"role": "user", "content": "Bonjour ? 日本語 🙂"},
    ],
}


def flatten(messages):
    """What transformers should see: text parts joined, as our renderers do."""
    out = copy.deepcopy(messages)
    for message in out:
        if isinstance(message.get("content"), list):
            message["content"] = "\n".join(part["text"] for part in message["content"])
    return out


def reference(tokenizer, messages, tools, add_generation_prompt, **kwargs):
    return tokenizer.apply_chat_template(
        messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        tokenize=True,
        return_dict=False,
        **kwargs,
    )


CASES = [(name, tools, agp) for name in CONVERSATIONS for tools in (None, TOOLS) for agp in (True, False)]
IDS = [f"{name}-{'tools' if tools else 'notools'}-{'gen' if agp else 'nogen'}" for name, tools, agp in CASES]


# Parity with the models' own chat templates


@pytest.mark.parametrize(("name", "tools", "agp"), CASES, ids=IDS)
def test_qwen3_matches_chat_template(qwen3_tokenizer, name, tools, agp):
    messages = CONVERSATIONS[name]
    renderer = get_renderer("qwen3", qwen3_tokenizer)
    expected = reference(qwen3_tokenizer, flatten(messages), tools, agp)
    assert renderer.render(messages, tools, add_generation_prompt=agp) == expected


@pytest.mark.parametrize(("name", "tools", "agp"), CASES, ids=IDS)
def test_qwen3_instruct_matches_chat_template(qwen3_tokenizer, name, tools, agp):
    messages = CONVERSATIONS[name]
    renderer = get_renderer("qwen3_instruct", qwen3_tokenizer)
    expected = reference(
        qwen3_tokenizer, flatten(messages), tools, agp, chat_template=QWEN3_INSTRUCT_CHAT_TEMPLATE
    )
    assert renderer.render(messages, tools, add_generation_prompt=agp) == expected


@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_toy_tokenizer_renders_like_its_template(toy_tokenizer, name):
    renderer = get_renderer("qwen3", toy_tokenizer)
    for tools in (None, TOOLS):
        expected = reference(toy_tokenizer, flatten(CONVERSATIONS[name]), tools, True)
        assert renderer.render(CONVERSATIONS[name], tools) == expected


def for_llama(messages):
    """Llama 3.1's template renders one call per message, from an arguments object."""
    out = []
    for message in flatten(messages):
        if message["role"] == "tool" and message["tool_call_id"] != "c1":
            continue
        if message.get("tool_calls"):
            function = message["tool_calls"][0]["function"]
            message["tool_calls"] = [
                {
                    "type": "function",
                    "function": {"name": function["name"], "arguments": json.loads(function["arguments"])},
                }
            ]
        out.append(message)
    return out


@pytest.mark.parametrize(("name", "tools", "agp"), CASES, ids=IDS)
def test_llama3_matches_chat_template(llama3_tokenizer, name, tools, agp):
    messages = for_llama(CONVERSATIONS[name])
    ours = copy.deepcopy(messages)
    for message in ours:  # we take OpenAI's JSON-string arguments
        for tool_call in message.get("tool_calls", []):
            tool_call["function"]["arguments"] = json.dumps(tool_call["function"]["arguments"])
    renderer = get_renderer("llama3", llama3_tokenizer)
    assert renderer.render(ours, tools, add_generation_prompt=agp) == reference(
        llama3_tokenizer, messages, tools, agp
    )


# How a prompt is composed


def test_segments_concatenate_to_the_prompt(qwen3_tokenizer):
    renderer = get_renderer("qwen3", qwen3_tokenizer)
    messages = CONVERSATIONS["parallel_tools"]
    segments = renderer.render_segments(messages, TOOLS)
    prompt = renderer.render(messages, TOOLS)
    assert [t for s in segments for t in s.tokens] == prompt
    segments[1].tokens.clear()  # chunks are cached; a caller's edits must not leak into them
    assert renderer.render(messages, TOOLS) == prompt
    assert [s.message for s in segments] == [0, 1, 2, 3, 4, 5, 6, None]
    assert segments[0].role == "system" and "get_weather" in qwen3_tokenizer.decode(segments[0].tokens)
    assert segments[-1].tokens == renderer.generation_prompt()
    assert (
        qwen3_tokenizer.decode(segments[4].tokens)
        == "\n<tool_response>\nrain, 15\n</tool_response><|im_end|>\n"
    )
    # Tools without a system message: the preamble belongs to no message.
    no_system = renderer.render_segments(CONVERSATIONS["single_user"], TOOLS)
    assert [s.message for s in no_system] == [None, 0, None]


def test_stop_tokens(qwen3_tokenizer, llama3_tokenizer, toy_tokenizer):
    assert get_renderer("qwen3", qwen3_tokenizer).stop_token_ids == [151645, 151643]
    assert get_renderer("llama3", llama3_tokenizer).stop_token_ids == [128009, 128008, 128001]
    role_colon = get_renderer("role_colon", toy_tokenizer)
    assert role_colon.stop_strings == ["\n\nUser:"]
    assert role_colon.stop_token_ids == [toy_tokenizer.eos_token_id]


# Qwen3's thinking history, and token-exact history


def test_qwen3_drops_reasoning_before_the_latest_user_query(qwen3_tokenizer):
    """As Qwen3's template does: reasoning survives only after the latest user message."""
    renderer = get_renderer("qwen3", qwen3_tokenizer)
    text = qwen3_tokenizer.decode(
        renderer.render(CONVERSATIONS["think_in_content"], add_generation_prompt=False)
    )
    assert "old thoughts" not in text
    assert "<|im_start|>assistant\nA1<|im_end|>" in text
    assert "<|im_start|>assistant\n<think>\nnew thoughts\n</think>\n\nA2<|im_end|>" in text
    # Within one agentic turn (tool results only) every step keeps its reasoning.
    agent = qwen3_tokenizer.decode(renderer.render(CONVERSATIONS["agent_mid_episode"], TOOLS))
    assert "<think>\nSearch first.\n</think>" in agent and "<think>\nThe tool said so.\n</think>" in agent


def sample(tokenizer, *pieces):
    """Tokens as a sampler might produce them: each piece tokenized on its own, so the ids need
    not be what tokenizing the joined text would give."""
    return [t for piece in pieces for t in tokenizer.encode(piece, add_special_tokens=False)]


def test_token_exact_history_extends_each_prompt(qwen3_tokenizer):
    renderer = get_renderer("qwen3", qwen3_tokenizer)
    messages = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Paris?"}]
    prompt1 = renderer.render(messages, TOOLS)
    sampled1 = sample(
        qwen3_tokenizer,
        "<think>\nI",
        " should call the tool.\n</think>\n\n",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        'is"}}\n</tool_call>',
        "<|im_end|>",
    )
    reply = renderer.parse(sampled1, TOOLS)
    assert reply.finish_reason == "tool_calls" and reply.errors == []
    call_id = reply.tool_calls[0]["id"]
    messages += [reply.to_openai(), {"role": "tool", "tool_call_id": call_id, "content": "sunny"}]
    # Re-rendering the text re-tokenizes it: the ids differ from the sampled ones ...
    assert renderer.render(messages, TOOLS)[: len(prompt1) + len(sampled1)] != prompt1 + sampled1
    # ... splicing the sampled tokens keeps the prompt an extension of the last call.
    prompt2 = renderer.render(messages, TOOLS, completions={2: sampled1})
    assert prompt2[: len(prompt1) + len(sampled1)] == prompt1 + sampled1
    assert qwen3_tokenizer.decode(prompt2) == qwen3_tokenizer.decode(renderer.render(messages, TOOLS))

    # A new user turn: the template would drop the old reasoning; the spliced turn keeps it.
    sampled2 = sample(qwen3_tokenizer, "<think>\nSunny.\n</think>\n\n", "It is sunny.", "<|im_end|>")
    messages += [renderer.parse(sampled2).to_openai(), {"role": "user", "content": "And tomorrow?"}]
    prompt3 = renderer.render(messages, TOOLS, completions={2: sampled1, 4: sampled2})
    assert prompt3[: len(prompt2) + len(sampled2)] == prompt2 + sampled2
    assert "I should call the tool." not in qwen3_tokenizer.decode(renderer.render(messages, TOOLS))


def test_truncated_completion_is_closed(qwen3_tokenizer, llama3_tokenizer):
    for name, tokenizer, end in [
        ("qwen3", qwen3_tokenizer, "<|im_end|>\n"),
        ("llama3", llama3_tokenizer, "<|eot_id|>"),
    ]:
        renderer = get_renderer(name, tokenizer)
        truncated = tokenizer.encode("I was cut", add_special_tokens=False)
        messages = [{"role": "user", "content": "Talk"}, {"role": "assistant", "content": "I was cut"}]
        prompt = renderer.render(messages, add_generation_prompt=False, completions={1: truncated})
        assert tokenizer.decode(prompt).endswith("I was cut" + end)


def test_completions_only_for_assistant_messages(toy_tokenizer):
    renderer = get_renderer("qwen3", toy_tokenizer)
    with pytest.raises(RendererError, match="completions: message 0 is not an assistant message"):
        renderer.render([{"role": "user", "content": "hi"}], completions={0: [1, 2]})


# Round trips: render -> sample -> parse -> render


@pytest.mark.parametrize(
    ("name", "reply", "tools"),
    [
        ("qwen3", "<think>\nLet me add.\n</think>\n\nSure.", None),
        (
            "qwen3",
            '<think>\nTwo calls.\n</think>\n\nChecking.\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "search", "arguments": {"q": "Rome"}}\n</tool_call>',
            TOOLS,
        ),
        ("qwen3_instruct", "Just the answer: 4.", None),
        ("qwen3_instruct", '<tool_call>\n{"name": "search", "arguments": {"q": "ünï"}}\n</tool_call>', TOOLS),
        ("llama3", "The answer is 4.", None),
        ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}', TOOLS),
    ],
)
def test_round_trip(qwen3_tokenizer, llama3_tokenizer, name, reply, tools):
    tokenizer = llama3_tokenizer if name == "llama3" else qwen3_tokenizer
    renderer = get_renderer(name, tokenizer)
    messages = [{"role": "user", "content": "Question?"}]
    prompt = renderer.render(messages, tools)
    end = "<|eot_id|>" if name == "llama3" else "<|im_end|>"
    sampled = tokenizer.encode(reply + end, add_special_tokens=False)
    parsed = renderer.parse(sampled, tools)
    assert parsed.errors == []
    after = renderer.render([*messages, parsed.to_openai()], tools, add_generation_prompt=False)
    trailer = tokenizer.encode("\n", add_special_tokens=False) if name != "llama3" else []
    assert after == prompt + sampled + trailer


def test_role_colon_round_trip(toy_tokenizer):
    renderer = get_renderer("role_colon", toy_tokenizer)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    prompt = renderer.render(messages)
    assert toy_tokenizer.decode(prompt) == "System: Be brief.\n\nUser: 2+2?\n\nAssistant:"
    sampled = toy_tokenizer.encode(" It is 4.\n\nUser: and 3+3?", add_special_tokens=False)
    parsed = renderer.parse(sampled)
    assert parsed == ParsedMessage(content="It is 4.", finish_reason="stop")
    again = renderer.render([*messages, parsed.to_openai(), {"role": "user", "content": "3+3?"}])
    assert toy_tokenizer.decode(again).endswith("Assistant: It is 4.\n\nUser: 3+3?\n\nAssistant:")
    assert renderer.parse(toy_tokenizer.encode(" It is", add_special_tokens=False)).finish_reason == "length"


# Parsing


def test_parse_stops_at_the_first_stop_token(qwen3_tokenizer):
    renderer = get_renderer("qwen3", qwen3_tokenizer)
    tokens = qwen3_tokenizer.encode("<think>\nhmm\n</think>\n\nDone.<|im_end|>junk", add_special_tokens=False)
    assert renderer.parse(tokens) == ParsedMessage(content="Done.", reasoning="hmm", finish_reason="stop")


def test_parse_truncated_reasoning(qwen3_tokenizer):
    renderer = get_renderer("qwen3", qwen3_tokenizer)
    parsed = renderer.parse(qwen3_tokenizer.encode("<think>\nStill thinking about", add_special_tokens=False))
    assert parsed == ParsedMessage(content="", reasoning="Still thinking about", finish_reason="length")
    message = parsed.to_openai()
    assert message == {"role": "assistant", "content": "", "reasoning_content": "Still thinking about"}


def test_parse_reports_bad_tool_calls(qwen3_tokenizer):
    renderer = get_renderer("qwen3_instruct", qwen3_tokenizer)
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": 3}}\n</tool_call>'
    parsed = renderer.parse(qwen3_tokenizer.encode(text + "<|im_end|>", add_special_tokens=False), TOOLS)
    # Arguments that do not fit the schema: still a call, with the error beside it.
    [call] = parsed.tool_calls
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": 3}'}
    assert parsed.content == "" and parsed.finish_reason == "tool_calls"
    assert parsed.errors == ["tool call 1: argument 'city' of 'get_weather' must be string, got integer"]
    broken = '<tool_call>\n{"name": "get_weather", "arguments": {"city": 3}\n</tool_call>'
    parsed = renderer.parse(qwen3_tokenizer.encode(broken + "<|im_end|>", add_special_tokens=False), TOOLS)
    assert parsed.tool_calls == [] and parsed.content == broken and parsed.finish_reason == "stop"
    assert parsed.errors[0].startswith("tool call 1: invalid JSON in tool call")
    assert parsed.to_openai() == {"role": "assistant", "content": broken}


def test_parse_with_another_tool_call_parser(qwen3_tokenizer):
    renderer = get_renderer("qwen3_instruct", qwen3_tokenizer, tool_call_parser="json")
    tokens = qwen3_tokenizer.encode(
        '{"name": "search", "arguments": {"q": "x"}}<|im_end|>', add_special_tokens=False
    )
    message = renderer.parse(tokens, TOOLS).to_openai()
    assert message["content"] is None
    assert message["tool_calls"][0]["function"] == {"name": "search", "arguments": '{"q": "x"}'}


def test_llama3_parses_python_tag_calls(llama3_tokenizer):
    renderer = get_renderer("llama3", llama3_tokenizer)
    text = '<|python_tag|>{"name": "search", "parameters": {"q": "x"}}<|eom_id|>'
    parsed = renderer.parse(llama3_tokenizer.encode(text, add_special_tokens=False), TOOLS)
    assert parsed.finish_reason == "tool_calls" and parsed.tool_calls[0]["function"]["name"] == "search"


# Bad input


@pytest.mark.parametrize(
    ("renderer_name", "messages", "tools", "error"),
    [
        ("qwen3", [{"role": "robot", "content": "x"}], None, "messages.0.role: must be one of"),
        ("qwen3", ["hello"], None, "messages.0: a message must be an object, not str"),
        ("qwen3", [{"role": "user", "content": 3}], None, "messages.0.content: content must be a string"),
        (
            "qwen3",
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            None,
            "messages.0.content: content part of type 'image_url' is not supported",
        ),
        (
            "qwen3",
            [{"role": "user", "content": "x", "tool_calls": [call("c", "f", {})]}],
            None,
            "only assistant",
        ),
        ("qwen3", [{"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]}], None, "function.name"),
        (
            "llama3",
            [{"role": "assistant", "content": "", "tool_calls": [call("a", "f", {}), call("b", "f", {})]}],
            None,
            "exactly one tool call",
        ),
        (
            "llama3",
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}],
            None,
            "tool call arguments are not valid JSON",
        ),
        ("llama3", [{"role": "system", "content": "x"}], TOOLS, "there is none"),
        ("role_colon", [{"role": "user", "content": "x"}], TOOLS, "role_colon cannot render tools"),
        ("role_colon", [{"role": "tool", "content": "x"}], None, "cannot render tool calls or tool results"),
    ],
)
def test_bad_messages(qwen3_tokenizer, llama3_tokenizer, renderer_name, messages, tools, error):
    tokenizer = llama3_tokenizer if renderer_name == "llama3" else qwen3_tokenizer
    with pytest.raises(RendererError, match=error):
        get_renderer(renderer_name, tokenizer).render(messages, tools)


def test_registry(toy_tokenizer):
    assert {"qwen3", "qwen3_instruct", "llama3", "role_colon"} <= set(renderer_names())
    with pytest.raises(UnknownRendererError, match="unknown renderer 'gpt2'"):
        get_renderer("gpt2", toy_tokenizer)

    class Loud(Qwen3Renderer):
        name = "loud"

        def _generation_text(self):
            return "<|im_start|>assistant\nLOUD: "

    register_renderer("loud", Loud)
    renderer = get_renderer("loud", toy_tokenizer)
    assert toy_tokenizer.decode(renderer.render([{"role": "user", "content": "hi"}])).endswith("LOUD: ")
    with pytest.raises(RendererError, match="stop tokens"):
        get_renderer("llama3", toy_tokenizer)

"""SmolLM2's renderer against its real tokenizer and chat template (the model pulled from the
package index once per machine; see tests/model_fixtures.py)."""

import json

import pytest

from platoon.gateway.renderers import RendererError, get_renderer
from platoon.models.loading import make_renderer

pytestmark = pytest.mark.torch

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather für a city (°C)",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
TOOLS_TEXT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(TOOLS[0], ensure_ascii=False)
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


PLAIN = {
    "user_only": [{"role": "user", "content": "Hi there"}],
    "system_multi_turn": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "What is 2+2? 日本語 🙂"},
    ],
    "assistant_last": [
        {"role": "user", "content": "What is 7 + 5?"},
        {"role": "assistant", "content": "12"},
    ],
    "late_system_and_parts": [
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "two"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "system", "content": "Now answer in French."},
        {"role": "user", "content": "Bonjour ?"},
    ],
}


def template(tokenizer, messages, add_generation_prompt):
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
    )


def plain(messages):
    """The messages as the template takes them: text parts joined, as the renderers do."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = "\n".join(part["text"] for part in content)
        out.append({"role": m["role"], "content": content})
    return out


@pytest.mark.parametrize("agp", [True, False], ids=["gen", "nogen"])
@pytest.mark.parametrize("name", list(PLAIN))
def test_plain_conversations_match_the_chat_template(smollm2_tokenizer, name, agp):
    renderer = get_renderer("smollm2", smollm2_tokenizer)
    messages = PLAIN[name]
    assert renderer.render(messages, add_generation_prompt=agp) == template(
        smollm2_tokenizer, plain(messages), agp
    )


def test_the_default_system_message_is_the_templates(smollm2_tokenizer):
    renderer = get_renderer("smollm2", smollm2_tokenizer)
    text = smollm2_tokenizer.decode(renderer.render([{"role": "user", "content": "Hi"}]))
    assert text == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    segments = renderer.render_segments([{"role": "user", "content": "Hi"}])
    assert [s.message for s in segments] == [None, 0, None]  # the default one belongs to no message


# Tools, tool calls and tool results: the template has no tool support, so they are written as
# text; the reference is the template on the messages with that text written out by hand.

TOOL_TURNS = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [
            call("c1", "get_weather", {"city": "Paris"}),
            call("c2", "get_weather", {"city": "Rome"}),
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny, 20"},
    {"role": "tool", "tool_call_id": "c2", "content": "rain, 15"},
    {"role": "assistant", "content": None, "tool_calls": [call("c3", "get_weather", {"city": "Oslo"})]},
    {"role": "tool", "tool_call_id": "c3", "content": "snow, -2"},
    {"role": "assistant", "content": "Paris is sunny, Rome rainy, Oslo snowy."},
    {"role": "user", "content": "Thanks!"},
]
WRITTEN_OUT = [
    {"role": "system", "content": DEFAULT_SYSTEM + "\n\n" + TOOLS_TEXT},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
    },
    {"role": "tool", "content": "sunny, 20"},
    {"role": "tool", "content": "rain, 15"},
    {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    },
    {"role": "tool", "content": "snow, -2"},
    {"role": "assistant", "content": "Paris is sunny, Rome rainy, Oslo snowy."},
    {"role": "user", "content": "Thanks!"},
]


@pytest.mark.parametrize("agp", [True, False], ids=["gen", "nogen"])
def test_tool_calls_and_results_match_the_template_on_their_text(smollm2_tokenizer, agp):
    renderer = get_renderer("smollm2", smollm2_tokenizer)
    assert renderer.lowered_messages(TOOL_TURNS, TOOLS) == WRITTEN_OUT
    assert renderer.render(TOOL_TURNS, TOOLS, add_generation_prompt=agp) == template(
        smollm2_tokenizer, WRITTEN_OUT, agp
    )


def test_tools_join_a_given_system_message(smollm2_tokenizer):
    renderer = get_renderer("smollm2", smollm2_tokenizer)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]
    written = [{"role": "system", "content": "Be brief.\n\n" + TOOLS_TEXT}, messages[1]]
    assert renderer.render(messages, TOOLS) == template(smollm2_tokenizer, written, True)


def test_auto_chooses_hermes_and_reads_a_sampled_call_back(smollm2_tokenizer):
    renderer, parser = make_renderer("smollm2", smollm2_tokenizer)
    assert parser == "hermes"
    turn = WRITTEN_OUT[2]["content"]
    tokens = smollm2_tokenizer.encode(turn + "<|im_end|>", add_special_tokens=False)
    parsed = renderer.parse(tokens, TOOLS)
    assert parsed.content == "Let me check."
    assert [json.loads(c["function"]["arguments"]) for c in parsed.tool_calls] == [
        {"city": "Paris"},
        {"city": "Rome"},
    ]
    assert parsed.finish_reason == "tool_calls"


def test_reused_completions_extend_the_prompt(smollm2_tokenizer):
    renderer = get_renderer("smollm2", smollm2_tokenizer)
    first = [{"role": "user", "content": "What is 7 + 5?"}]
    prompt = renderer.render(first)
    sampled = smollm2_tokenizer.encode("12<|im_end|>", add_special_tokens=False)
    later = [*first, {"role": "assistant", "content": "12"}, {"role": "user", "content": "And 8 + 9?"}]
    grown = renderer.render(later, completions={1: sampled})
    assert grown[: len(prompt) + len(sampled)] == prompt + sampled
    assert grown == renderer.render(later)
    assert renderer.stop_token_ids == [
        smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>"),
        smollm2_tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    ]


def test_bad_tool_call_arguments_are_a_clear_error(smollm2_tokenizer):
    renderer = get_renderer("smollm2", smollm2_tokenizer)
    bad = [
        {"role": "user", "content": "x"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}],
        },
    ]
    with pytest.raises(
        RendererError, match=r"messages\.1\.tool_calls\.0: tool call arguments are not valid JSON"
    ):
        renderer.render(bad)
    with pytest.raises(RendererError, match="no message"):
        renderer.render([], TOOLS)

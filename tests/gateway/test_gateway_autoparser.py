"""`tool_call_parser: auto`: the parser is chosen by reading a rendered probe turn back."""

# ruff: noqa: F811
from __future__ import annotations

import json

import pytest

from platoon.gateway.autoparser import AutoParserError, choose_tool_call_parser, probe_turn
from platoon.gateway.renderers import Qwen3InstructRenderer, get_renderer, register_renderer
from platoon.gateway.toolcalls import tool_call_parser_names
from tokenizer_fixtures import llama3_tokenizer, qwen3_tokenizer, toy_tokenizer  # noqa: F401


class _QwenWithLlamaDefault(Qwen3InstructRenderer):
    """Qwen's format, misconfigured with the Llama 3 parser as its default."""

    name = "test_qwen_llama_default"
    default_tool_call_parser = "llama3"


class _FunctionSyntax(Qwen3InstructRenderer):
    """Writes calls as `CALL name(arguments)`, which no registered parser reads."""

    name = "test_function_syntax"

    def _texts(self, messages, tools, add_generation_prompt):
        out = []
        for index, role, text in super()._texts(messages, tools, add_generation_prompt):
            if role == "assistant" and "<tool_call>" in text:
                calls = messages[index]["tool_calls"]
                body = "".join(f"CALL {c['function']['name']}({c['function']['arguments']})\n" for c in calls)
                text = "<|im_start|>assistant\n" + body + "<|im_end|>\n"
            out.append((index, role, text))
        return out


register_renderer(_QwenWithLlamaDefault.name, _QwenWithLlamaDefault)
register_renderer(_FunctionSyntax.name, _FunctionSyntax)


def test_the_probe_has_three_varied_calls():
    turn = probe_turn()
    arguments = [json.loads(c["function"]["arguments"]) for c in turn["tool_calls"]]
    assert len(arguments) == 3
    values = [v for a in arguments for v in a.values()]
    assert {type(v) for v in values} >= {str, int, float, bool, list}
    assert any(isinstance(v, str) and not v.isascii() for v in values)


@pytest.mark.parametrize("renderer", ["qwen3", "qwen3_instruct"])
def test_qwen_formats_choose_hermes(toy_tokenizer, qwen3_tokenizer, renderer):
    assert choose_tool_call_parser(renderer, toy_tokenizer) == "hermes"
    assert choose_tool_call_parser(renderer, qwen3_tokenizer) == "hermes"


@pytest.mark.slow
def test_llama3_chooses_llama3_with_one_call_per_turn(llama3_tokenizer):
    assert choose_tool_call_parser("llama3", llama3_tokenizer) == "llama3"


def test_the_choice_reads_the_probe_back_exactly(qwen3_tokenizer):
    name = choose_tool_call_parser("qwen3", qwen3_tokenizer)
    renderer = get_renderer("qwen3", qwen3_tokenizer, tool_call_parser=name)
    turn = probe_turn()
    segments = renderer.render_segments([{"role": "user", "content": "Go."}, turn])
    tokens = [t for s in segments if s.message == 1 for t in s.tokens][len(renderer.generation_prompt()) :]
    parsed = renderer.parse(tokens)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls] == [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in turn["tool_calls"]
    ]


def test_a_wrong_default_parser_is_passed_over(toy_tokenizer):
    assert get_renderer(_QwenWithLlamaDefault.name, toy_tokenizer).tool_call_parser.name == "llama3"
    assert choose_tool_call_parser(_QwenWithLlamaDefault.name, toy_tokenizer) == "hermes"


def test_no_fitting_parser_is_a_clear_error(toy_tokenizer):
    with pytest.raises(AutoParserError) as error:
        choose_tool_call_parser(_FunctionSyntax.name, toy_tokenizer)
    message = str(error.value)
    assert message.startswith(f"no tool-call parser reads back {_FunctionSyntax.name}'s tool calls exactly")
    assert all(f"{name}:" in message for name in tool_call_parser_names())
    assert message.endswith("set tool_call_parser explicitly")


def test_a_format_without_tools_is_a_clear_error(toy_tokenizer):
    with pytest.raises(AutoParserError, match="role_colon cannot render a tool-calling turn"):
        choose_tool_call_parser("role_colon", toy_tokenizer)

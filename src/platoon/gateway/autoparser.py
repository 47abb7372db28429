"""`tool_call_parser: auto`: pick the parser that reads a renderer's own tool calls back.

A renderer writes tool calls in its chat format; a parser reads them out of sampled text. They
only fit if a turn survives the round trip, so the choice is made by experiment: render a probe
assistant turn with three tool calls (varied argument types, non-ASCII text), parse the tokens
back with each registered parser, and keep the first that returns exactly the probe's calls
and no leftover text. The renderer's own default parser is tried first, then the others by
name. A format that renders one call per turn (Llama 3) is probed with one call.
"""

from __future__ import annotations

import json

from platoon.gateway.renderers import Renderer, RendererError, get_renderer
from platoon.gateway.shapes import AssistantMessage, Message, Tokenizer
from platoon.gateway.toolcalls import tool_call_parser_names

__all__ = ["AutoParserError", "choose_tool_call_parser", "probe_turn"]


class AutoParserError(ValueError):
    """No registered tool-call parser reads the renderer's tool calls back exactly."""


PROBE_TOOLS: list[dict[str, object]] = [
    {
        "type": "function",
        "function": {
            "name": "search_files",
            "description": "Search files for a pattern.",
            "parameters": {
                "type": "object",
                "properties": {
                    "pattern": {"type": "string"},
                    "max_results": {"type": "integer"},
                    "case_sensitive": {"type": "boolean"},
                },
                "required": ["pattern"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
                "required": ["path", "text"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Submit an answer.",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "number"}, "notes": {"type": "array"}},
                "required": ["answer"],
            },
        },
    },
]

_PROBE_CALLS: list[tuple[str, dict[str, object]]] = [
    ("search_files", {"pattern": "def main(", "max_results": 3, "case_sensitive": False}),
    ("write_file", {"path": "notes/résumé.txt", "text": 'line one\nline "two"\t{braces}'}),
    ("submit", {"answer": 42.5, "notes": ["ok", {"nested": None}]}),
]


def probe_turn(calls: int = 3) -> AssistantMessage:
    """The assistant turn the probe renders: `calls` tool calls and no text."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": f"call_probe_{n}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
            }
            for n, (name, arguments) in enumerate(_PROBE_CALLS[:calls])
        ],
    }


def choose_tool_call_parser(renderer_name: str, tokenizer: Tokenizer) -> str:
    """The name of the first parser for which parse(render(probe)) == probe.

    Raises `AutoParserError` (naming what each parser did) when none does.
    """
    default = get_renderer(renderer_name, tokenizer)
    turn, completion = _probe_completion(default, renderer_name)
    expected = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in turn["tool_calls"]]
    names = tool_call_parser_names()
    first = default.tool_call_parser.name if default.tool_call_parser else None
    if first in names:
        names = [first] + [n for n in names if n != first]
    tried = []
    for name in names:
        parsed = get_renderer(renderer_name, tokenizer, tool_call_parser=name).parse(completion, PROBE_TOOLS)
        got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls]
        if got == expected and not parsed.content and not parsed.errors:
            return name
        tried.append(
            f"{name}: {len(got)} of {len(expected)} calls"
            + (f" ({parsed.errors[0]})" if parsed.errors else "")
        )
    raise AutoParserError(
        f"no tool-call parser reads back {renderer_name}'s tool calls exactly ({'; '.join(tried)}); "
        "set tool_call_parser explicitly"
    )


def _probe_completion(renderer: Renderer, renderer_name: str) -> tuple[AssistantMessage, list[int]]:
    """The probe turn, and the tokens a model would sample to write it."""
    messages: list[Message] = [{"role": "user", "content": "Use the tools."}]
    problem: RendererError | None = None
    for calls in (3, 1):
        turn = probe_turn(calls)
        try:
            segments = renderer.render_segments([*messages, turn], PROBE_TOOLS, add_generation_prompt=False)
            break
        except RendererError as exc:
            problem = exc
    else:
        raise AutoParserError(f"{renderer_name} cannot render a tool-calling turn: {problem}")
    tokens = [t for s in segments if s.message == 1 for t in s.tokens]
    opening = renderer.generation_prompt()
    if tokens[: len(opening)] == opening:
        return turn, tokens[len(opening) :]
    # The turn's header merged with its first tokens: cut it from the text instead.
    text = renderer.decode(tokens)
    header = renderer.decode(opening)
    return turn, list(renderer.tokenizer.encode(text.removeprefix(header), add_special_tokens=False))

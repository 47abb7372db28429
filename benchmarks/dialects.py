"""Time to read a request body of each HTTP dialect: JSON bytes to the messages, tools and
params the gateway samples with (what `gateway/http.py` does before it renders).

The bodies are what agents send: a 20-turn tool-using chat (an OpenAI chat harness), a Codex
Responses body (instructions, developer and user messages, reasoning items with encrypted
content, function calls and outputs, function tools with strict schemas) and a Claude Code
Messages body (system blocks with cache_control, a system message between turns, thinking,
tool_use and tool_result blocks, adaptive thinking, context management). Their shapes are those
the real agents sent to the gateway in `tests/envs/harbor/test_cli_agents.py`.

Run: python benchmarks/dialects.py [--turns T] [--seconds S]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from platoon.gateway import dialects
from platoon.gateway.http import _parse

SCHEMA = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"}, "description": "The command to run."},
        "workdir": {"type": "string", "description": "The working directory."},
        "timeout_ms": {"type": "number", "description": "The timeout in milliseconds."},
    },
    "required": ["command"],
    "additionalProperties": False,
}
OUTPUT = "".join(f"src/module_{n}.py:{n * 7}: def function_{n}(argument):\n" for n in range(12))


def chat_body(turns: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful software engineer. " * 20},
        {"role": "user", "content": "Find the bug in the parser and fix it. " * 4},
    ]
    for n in range(turns):
        call = {
            "id": f"call_{n}",
            "type": "function",
            "function": {"name": "shell", "arguments": json.dumps({"command": ["grep", "-rn", f"x{n}"]})},
        }
        messages.append({"role": "assistant", "content": f"Looking at step {n}.", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{n}", "content": OUTPUT})
    tool = {"type": "function", "function": {"name": "shell", "description": "Run.", "parameters": SCHEMA}}
    return {
        "model": "platoon-policy",
        "messages": messages,
        "tools": [tool],
        "temperature": 0.7,
        "max_completion_tokens": 2048,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def codex_body(turns: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "<permissions instructions>sandbox</permissions>"}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "<environment_context>cwd</environment_context>"}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the parser."}]},
    ]
    for n in range(turns):
        items += [
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": f"**Checking step {n}**"}],
                "content": None,
                "encrypted_content": "gAAAAB" + "x" * 400,
            },
            {
                "type": "function_call",
                "status": "completed",
                "id": f"fc_{n}",
                "name": "exec_command",
                "arguments": json.dumps({"cmd": f"rg x{n}", "workdir": "/repo"}),
                "call_id": f"call_{n}",
            },
            {"type": "function_call_output", "id": f"fco_{n}", "call_id": f"call_{n}", "output": OUTPUT},
        ]
    items.append(
        {
            "type": "message",
            "status": "completed",
            "id": "msg_last",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Found it.", "annotations": []}],
        }
    )
    tools = [
        {
            "type": "function",
            "name": name,
            "description": "Runs a command.",
            "strict": False,
            "parameters": SCHEMA,
        }
        for name in ("exec_command", "write_stdin", "update_plan", "view_image")
    ]
    return {
        "model": "platoon-policy",
        "instructions": "You are Codex, based on GPT-5. " * 60,
        "input": items,
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a0b1-0000-7000-8000-000000000000",
        "client_metadata": {"session_id": "0199a0b1", "turn_id": "0199a0b2"},
    }


def claude_body(turns: int) -> dict[str, Any]:
    cache = {"type": "ephemeral"}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Fix the parser.", "cache_control": cache}]},
        {"role": "system", "content": "# Environment\nYou are in /repo."},
    ]
    for n in range(turns):
        messages += [
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": f"Step {n}.", "signature": "sig" * 40},
                    {"type": "text", "text": f"Looking at step {n}."},
                    {
                        "type": "tool_use",
                        "id": f"toolu_{n}",
                        "name": "Bash",
                        "input": {"command": f"rg x{n}"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"tool_use_id": f"toolu_{n}", "type": "tool_result", "content": OUTPUT, "is_error": False}
                ],
            },
        ]
    tools = [
        {"name": name, "description": "Runs a command.", "input_schema": SCHEMA} for name in ("Bash", "Read")
    ]
    return {
        "model": "platoon-policy",
        "max_tokens": 32000,
        "system": [
            {"type": "text", "text": "You are Claude Code.", "cache_control": cache},
            {"type": "text", "text": "You are an interactive CLI tool. " * 60, "cache_control": cache},
        ],
        "messages": messages,
        "tools": tools,
        "metadata": {"user_id": "user_abc_account__session_0199"},
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "stream": True,
    }


def per_call(read: Callable[[], Any], seconds: float) -> float:
    """Microseconds per call: the fastest of many short runs (the least disturbed by other
    processes on the machine), over about `seconds` in all."""
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 0.01:
        read()
        n += 1
    best = float("inf")
    for _ in range(max(1, int(seconds / 0.01))):
        start = time.perf_counter()
        for _ in range(n):
            read()
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def main(turns: int, seconds: float) -> None:
    cases = [
        ("chat completions", chat_body(turns), dialects.chat_request),
        ("responses (codex)", codex_body(turns), dialects.responses_request),
        ("messages (claude code)", claude_body(turns), dialects.anthropic_request),
    ]
    print(f"{turns} turns; JSON bytes to (messages, tools, params): parse + dialect")
    for name, body, request in cases:
        raw = json.dumps(body).encode()
        total = per_call(lambda raw=raw, request=request: request(_parse(raw)), seconds)
        parsed = _parse(raw)
        dialect = per_call(lambda parsed=parsed, request=request: request(parsed), seconds)
        print(
            f"  {name:<24} {len(raw) / 1024:6.1f} KiB   total {total:8.1f} us   "
            f"of which the dialect {dialect:7.1f} us"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=1.0, help="time spent per measurement")
    args = parser.parse_args()
    main(args.turns, args.seconds)

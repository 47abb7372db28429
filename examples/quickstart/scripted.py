"""A scripted policy for trying the quickstart without a model: binary search, written as the
tool calls a Qwen3 model would sample. `--policy scripted:scripted:binary_search`."""

from __future__ import annotations

import json


def binary_search(messages: list[dict]) -> str:
    lo, hi = 1, 100
    guess = None
    for message in messages:
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                arguments = call["function"]["arguments"]
                guess = (json.loads(arguments) if isinstance(arguments, str) else arguments)["number"]
        elif message.get("role") == "tool" and guess is not None:
            if "higher" in message["content"]:
                lo = guess + 1
            elif "lower" in message["content"]:
                hi = guess - 1
    call = {"name": "guess", "arguments": {"number": (lo + hi) // 2}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

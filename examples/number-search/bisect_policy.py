"""A scripted policy for number search: binary search, written as the tool calls a Qwen3 model
would sample. `--policy scripted:bisect_policy:bisect` (with this directory on PYTHONPATH)."""

from __future__ import annotations

import json
import re


def bisect(messages: list[dict]) -> str:
    found = (
        re.search(r"between (-?\d+) and (-?\d+)", str(messages[0].get("content", ""))) if messages else None
    )
    lo, hi = (int(found.group(1)), int(found.group(2))) if found else (0, 1023)
    guess = None
    for message in messages[1:]:
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

"""A scripted expert for the real-model example's sums (`examples/real-model/arithmetic.py`):
the sum written out as the model itself writes it when it gets one right ("7 + 5 = 12"), and
nothing after it, as the reward wants. `--policy scripted:sums_expert:answer`."""

from __future__ import annotations

import re


def answer(messages: list[dict]) -> str:
    asked = re.search(r"What is (\d+) \+ (\d+)\?", " ".join(str(m.get("content", "")) for m in messages))
    if asked is None:
        return "0"
    a, b = int(asked.group(1)), int(asked.group(2))
    return f"{a} + {b} = {a + b}"

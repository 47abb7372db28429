"""Sums of small numbers, answered in one reply and checked exactly: a task a real 135M model
starts bad at and learns in minutes on a laptop CPU (`train.yaml`).

SmolLM2-135M-Instruct knows that 7 + 5 is 12 (asked greedily it writes "7 + 5 = 12" three times
in four), but sampled as RL samples it, at temperature 1, it rambles past its answer and gets
about one problem in ten. The reward is 1 when the last number of the reply is the sum, else 0:
the model must give the sum and stop there. The test split holds sums never trained on.
"""

from __future__ import annotations

import random
import re
from typing import Any

from openreward.environments import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel

import platoon as pt

# Every pair (a, b) of 1..9 with a <= b: 45 problems; 15 of them, drawn once, are the test split.
_PAIRS = [(a, b) for a in range(1, 10) for b in range(a, 10)]
_TEST = set(random.Random(7).sample(_PAIRS, 15))


def last_number(text: str) -> int | None:
    """The last integer written in `text`, if any."""
    numbers = re.findall(r"-?\d+", text)
    return int(numbers[-1]) if numbers else None


class Answer(BaseModel):
    text: str


class Sums(Environment):
    """Add two numbers; the reward is 1 when the reply's last number is the sum."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        pairs = [p for p in _PAIRS if (p in _TEST) == (split == "test")]
        return [{"id": f"{a}+{b}", "a": a, "b": b} for a, b in pairs]

    def get_prompt(self) -> list[TextBlock]:
        a, b = self.task_spec["a"], self.task_spec["b"]
        return [TextBlock(text=f"What is {a} + {b}? Reply with only the number.")]

    @tool
    async def submit(self, args: Answer) -> ToolOutput:
        """Submit the reply; it is right when its last number is the sum."""
        right = last_number(args.text) == self.task_spec["a"] + self.task_spec["b"]
        return ToolOutput(
            blocks=[TextBlock(text="right" if right else "wrong")], reward=float(right), finished=True
        )


@pt.harness("example-answer")
async def answer(ctx: pt.AgentContext) -> pt.AgentResult:
    """One model call, its reply submitted as the answer."""
    reply = await ctx.chat([{"role": "user", "content": ctx.instruction}])
    await ctx.call_tool("submit", {"text": reply.text})
    return pt.AgentResult("completed", final_message=reply.text)

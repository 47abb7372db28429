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


def _splits(pairs: list[tuple[int, int]], held_out: int) -> dict[str, list[tuple[int, int]]]:
    """The pairs split once, by a fixed draw: `held_out` of them are the test split."""
    test = set(random.Random(7).sample(pairs, held_out))
    return {"train": [p for p in pairs if p not in test], "test": [p for p in pairs if p in test]}


# Every pair (a, b) of 1..9 with a <= b: 45 problems, 15 of them held out as the test split.
_ONE_DIGIT = _splits([(a, b) for a in range(1, 10) for b in range(a, 10)], 15)
# Two-digit sums (10..99): 120 problems drawn once, 30 held out; 20 steps take it only to about 0.35.
_TWO_DIGIT = _splits(
    random.Random(11).sample([(a, b) for a in range(10, 100) for b in range(10, 100)], 120), 30
)


def last_number(text: str) -> int | None:
    """The last integer written in `text`, if any."""
    numbers = re.findall(r"-?\d+", text)
    return int(numbers[-1]) if numbers else None


class Answer(BaseModel):
    text: str


class Sums(Environment):
    """Add two numbers from 1 to 9; the reward is 1 when the reply's last number is the sum."""

    pairs = _ONE_DIGIT

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return [{"id": f"{a}+{b}", "a": a, "b": b} for a, b in cls.pairs[split]]

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


class TwoDigitSums(Sums):
    """The same with numbers from 10 to 99 (`service: python://arithmetic:TwoDigitSums`)."""

    pairs = _TWO_DIGIT


@pt.harness("example-answer")
async def answer(ctx: pt.AgentContext) -> pt.AgentResult:
    """One model call, its reply submitted as the answer."""
    reply = await ctx.chat([{"role": "user", "content": ctx.instruction}])
    await ctx.call_tool("submit", {"text": reply.text})
    return pt.AgentResult("completed", final_message=reply.text)

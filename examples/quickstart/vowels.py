"""A task a tiny random-init model can learn on a laptop CPU, for `train-local.yaml`.

The agent answers once and submits its answer; the reward is the share of its letters that are
vowels. It is a shaped reward (every answer scores between 0 and 1, a random one about 0.25),
which is what makes a few minutes of CPU training enough to see the curve rise. The code path is
the one every run takes: an ORS environment, a function harness, the gateway, the grader,
credit, and the embedded Tinker-compatible training service.
"""

from __future__ import annotations

from typing import Any

from openreward.environments import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel

import platoon as pt


class Answer(BaseModel):
    text: str


def vowel_share(text: str) -> float:
    letters = [c for c in text.lower() if c.isascii() and c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


class Vowels(Environment):
    """Say something; the more of its letters are vowels, the higher the reward."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return [{"id": f"{split}-{i}"} for i in range(16)]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Say something with as many vowels as you can.")]

    @tool
    async def submit(self, args: Answer) -> ToolOutput:
        """Submit the answer; the reward is the share of its letters that are vowels."""
        return ToolOutput(blocks=[TextBlock(text="ok")], reward=vowel_share(args.text), finished=True)


@pt.harness("example-say")
async def say(ctx: pt.AgentContext) -> pt.AgentResult:
    """One model call, its text submitted as the answer."""
    reply = await ctx.chat([{"role": "user", "content": ctx.instruction}])
    await ctx.call_tool("submit", {"text": reply.text})
    return pt.AgentResult("completed", final_message=reply.text)

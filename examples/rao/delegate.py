"""The RAO example on a laptop CPU (`cpu.yaml`): a task a tiny random-init model can learn,
written by a tree of agents, so that both depths train and their rewards rise.

`Relay` asks for a line of words full of vowels (the reward is the share of the line's letters
that are vowels, a shaped reward every answer scores on). Its root agent (`rao-cpu-relay`)
delegates: it spawns one subagent (`rao-cpu-word`) per word, each on a fresh session of the same
task and graded there on its own word (`child_reward: own`), then writes a word of its own and
submits the whole line, graded as the episode. The delegation is scripted (a random model never
writes a `spawn_subagent` call); the words, the root's and the subagents', are the policy's.
"""

from __future__ import annotations

import re
from typing import Any

import anyio
from openreward.environments import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel

import platoon as pt

WORDS = re.compile(r"a line of (\d+) words")
WORD = "Say one word with as many vowels as you can."


class Line(BaseModel):
    text: str


def vowel_share(text: str) -> float:
    letters = [c for c in text.lower() if c.isascii() and c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


class Relay(Environment):
    """Write a line of 2 or 3 words; the more of its letters are vowels, the higher the reward."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return [{"id": f"{split}-{i}", "words": 2 + i % 2} for i in range(16)]

    def get_prompt(self) -> list[TextBlock]:
        words = self.task_spec["words"]
        return [TextBlock(text=f"Write a line of {words} words with as many vowels as you can.")]

    @tool
    async def submit(self, args: Line) -> ToolOutput:
        """Submit the line; the reward is the share of its letters that are vowels."""
        return ToolOutput(blocks=[TextBlock(text="ok")], reward=vowel_share(args.text), finished=True)


@pt.harness("rao-cpu-word")
async def word(ctx: pt.AgentContext) -> pt.AgentResult:
    """A subagent: one model call, its text submitted to its own session."""
    reply = await ctx.chat([{"role": "user", "content": WORD}])
    await ctx.call_tool("submit", {"text": reply.text})
    return pt.AgentResult("completed", final_message=reply.text)


@pt.harness("rao-cpu-relay")
async def relay(ctx: pt.AgentContext) -> pt.AgentResult:
    """The root: a subagent per word but one, its own word last, the line submitted."""
    match = WORDS.search(ctx.instruction)
    if match is None:
        return pt.AgentResult("error", reason="the instruction names no number of words")
    words: list[str] = []

    async def delegate() -> None:
        result = await ctx.spawn(WORD, harness="rao-cpu-word")
        words.append(result.final_message or "")

    async with anyio.create_task_group() as tg:
        for _ in range(int(match.group(1)) - 1):
            tg.start_soon(delegate)
    reply = await ctx.chat([{"role": "user", "content": WORD}])
    line = " ".join([*words, reply.text])
    await ctx.call_tool("submit", {"text": line})
    return pt.AgentResult("completed", final_message=line)

"""A two-player game against a frozen opponent (`cpu.yaml`): one policy trains, the other only
plays.

`Duel` is a word game refereed by the environment: each player says one word, and the word with
the larger share of vowels wins. Both players act in one environment session (`fork: shared`):
the opponent moves first (`open`), and the environment keeps its word; the learner then answers
(`answer`) without seeing it, and the environment grades the learner on the difference,
`learner's share - opponent's share`: 0 for a draw, above 0 for a win, 1 at most.

The learner is every episode's root agent (`duel-learner`); it opens the opponent as a subagent
with the role "opponent" (`duel-opponent`), which `agents.policy` maps to a frozen policy: the
base model, sampled and never trained. The learner's reward rises as it learns to beat it.
"""

from __future__ import annotations

import hashlib
from typing import Any

from openreward.environments import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel

import platoon as pt

PROMPT = "Say one word with as many vowels as you can."


class Word(BaseModel):
    text: str


def vowel_share(text: str) -> float:
    letters = [c for c in text.lower() if c.isascii() and c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


class Duel(Environment):
    """One round of the vowel game: the opponent opens, the learner answers and is graded."""

    def __init__(
        self, task_spec: dict[str, Any] | None = None, secrets: dict[str, str] | None = None
    ) -> None:
        super().__init__(task_spec or {}, secrets or {})
        self.opening: str | None = None  # the opponent's word, once played

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return [{"id": f"{split}-{i}"} for i in range(16)]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=PROMPT)]

    @tool
    async def open(self, args: Word) -> ToolOutput:
        """The opponent's move: its word, kept until the learner answers."""
        if self.opening is not None:
            return ToolOutput(blocks=[TextBlock(text="the opponent has already played")])
        self.opening = args.text
        return ToolOutput(blocks=[TextBlock(text="played")])

    @tool
    async def answer(self, args: Word) -> ToolOutput:
        """The learner's move: graded against the opponent's word, which ends the round."""
        theirs = vowel_share(self.opening or "")
        mine = vowel_share(args.text)
        verdict = "won" if mine > theirs else "lost" if mine < theirs else "drew"
        text = f"you {verdict}: {mine:.2f} against {theirs:.2f}"
        return ToolOutput(blocks=[TextBlock(text=text)], reward=mine - theirs, finished=True)


@pt.harness("duel-opponent")
async def opponent(ctx: pt.AgentContext) -> pt.AgentResult:
    """The opponent: one model call, its word played first.

    It samples with a seed of the task's, so every attempt at a task (the group its rewards
    are compared within) meets the same opening, as in duplicate bridge: the learner's
    attempts differ by their own play alone. Another task, another opening."""
    seed = int.from_bytes(hashlib.sha256(ctx.task.task_id.encode()).digest()[:4], "big")
    reply = await ctx.chat([{"role": "user", "content": PROMPT}], seed=seed)
    await ctx.call_tool("open", {"text": reply.text})
    return pt.AgentResult("completed", final_message=reply.text)


@pt.harness("duel-learner")
async def learner(ctx: pt.AgentContext) -> pt.AgentResult:
    """The learner: the opponent opened as a subagent, then its own word as the answer."""
    await ctx.spawn(PROMPT, harness="duel-opponent", role="opponent")
    reply = await ctx.chat([{"role": "user", "content": PROMPT}])
    result = await ctx.call_tool("answer", {"text": reply.text})
    return pt.AgentResult("completed", final_message=result.as_text())

"""Two roles, two policies (`cpu.yaml`): a planner that delegates part of its work to an
executor, each played by a model of its own and each graded on its own part.

`Duet` asks for a short line in two voices: the planner's words full of vowels, the executor's
full of consonants (each reward is the share of its letters that are, a shaped reward every
answer scores on). The root agent, the planner (`duet-planner`), delegates one word to an
executor (`duet-executor`, opened with the role "executor"), writes a word of its own and submits
it: the planner's grade is the episode's reward. The executor submits its word on a session of
its own (`fork: fresh`) and is graded there (`child_reward: own`).

The two tastes pull one model two ways; two policies each learn their own. The delegation is
scripted (a random model never writes a `spawn_subagent` call); every word is sampled from the
policy of the agent that writes it.
"""

from __future__ import annotations

from typing import Any

from openreward.environments import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel

import platoon as pt

PLANNER = "Say one word with as many vowels as you can."
EXECUTOR = "Say one word with as many consonants as you can."


class Words(BaseModel):
    text: str


def letters(text: str) -> list[str]:
    return [c for c in text.lower() if c.isascii() and c.isalpha()]


def vowel_share(text: str) -> float:
    found = letters(text)
    return sum(c in "aeiou" for c in found) / len(found) if found else 0.0


def consonant_share(text: str) -> float:
    found = letters(text)
    return sum(c not in "aeiou" for c in found) / len(found) if found else 0.0


class Duet(Environment):
    """A line in two voices: `vowels` grades the planner's word, `consonants` the executor's."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return [{"id": f"{split}-{i}"} for i in range(16)]

    def get_prompt(self) -> list[TextBlock]:
        return [
            TextBlock(
                text="Write a line in two voices: vowels from the planner, consonants from the executor."
            )
        ]

    @tool
    async def vowels(self, args: Words) -> ToolOutput:
        """Submit the planner's words; the reward is the share of their letters that are vowels."""
        return ToolOutput(blocks=[TextBlock(text="ok")], reward=vowel_share(args.text), finished=True)

    @tool
    async def consonants(self, args: Words) -> ToolOutput:
        """Submit the executor's word; the reward is the share of its letters that are consonants."""
        return ToolOutput(blocks=[TextBlock(text="ok")], reward=consonant_share(args.text), finished=True)


@pt.harness("duet-executor")
async def executor(ctx: pt.AgentContext) -> pt.AgentResult:
    """The executor: one model call, its word submitted to its own session."""
    reply = await ctx.chat([{"role": "user", "content": EXECUTOR}])
    await ctx.call_tool("consonants", {"text": reply.text})
    return pt.AgentResult("completed", final_message=reply.text)


@pt.harness("duet-planner")
async def planner(ctx: pt.AgentContext) -> pt.AgentResult:
    """The planner: the executor's word delegated, its own word written and submitted."""
    delegated = await ctx.spawn(EXECUTOR, harness="duet-executor", role="executor")
    reply = await ctx.chat([{"role": "user", "content": PLANNER}])
    await ctx.call_tool("vowels", {"text": reply.text})
    line = f"{reply.text} / {delegated.final_message or ''}"
    return pt.AgentResult("completed", final_message=line)

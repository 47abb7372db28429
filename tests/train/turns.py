"""A task whose reward arrives turn by turn, for the per-turn credit tests.

The agent speaks `turns` times (an option, `TURNS` by default); after each answer the `say` tool
pays that answer's vowel share divided by `turns`, so the episode's reward (their sum) is the mean
share. Each turn's reward depends on that turn alone: outcome credit gives every turn the
episode's advantage, noise from the other turns included, while per-turn credit with
`turn_discount: 0` gives each turn its own. With `noise`, turns after the first pay a random
amount whatever was said (a harder case for both, kept for experiments).
"""

from __future__ import annotations

import random
from typing import Any

import learnable  # noqa: F401 - puts the quickstart on the path
from openreward.environments import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel
from vowels import vowel_share

import platoon as pt

__all__ = ["TURNS", "VowelTurns", "turns_config"]

TURNS = 4


class Answer(BaseModel):
    text: str


class VowelTurns(Environment):
    """Say something, `TURNS` times; each answer is paid its vowel share as it comes."""

    platoon_reward = "sum"
    turns = TURNS
    noise = False  # turns after the first pay a random amount, whatever was said

    @classmethod
    def configure(cls, turns: int = TURNS, noise: bool = False) -> type[VowelTurns]:
        return type("VowelTurns", (cls,), {"turns": turns, "noise": noise})

    def __init__(self, task_spec: dict[str, Any], secrets: dict[str, str] | None = None) -> None:
        super().__init__(task_spec, secrets=secrets or {})
        self.turn = 0

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return [{"id": f"{split}-{i}"} for i in range(16)]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Say something with as many vowels as you can.")]

    @tool
    async def say(self, args: Answer) -> ToolOutput:
        """Say one answer; it is paid its vowel share at once."""
        self.turn += 1
        paid = random.random() if self.noise and self.turn > 1 else vowel_share(args.text)
        reward = paid / self.turns
        return ToolOutput(blocks=[TextBlock(text="again")], reward=reward, finished=self.turn >= self.turns)


@pt.harness("say-turns")
async def say_turns(ctx: pt.AgentContext) -> pt.AgentResult:
    """One model call per turn in one conversation, each answer said through the tool, until
    the environment says the episode is over."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": ctx.instruction}]
    while True:
        reply = await ctx.chat(messages)
        result = await ctx.call_tool("say", {"text": reply.text})
        if result.finished:
            return pt.AgentResult("completed", final_message=reply.text)
        messages += [{"role": "assistant", "content": reply.text}, {"role": "user", "content": result.output}]


def first_turn(episode: Any) -> float:
    """The vowel share of the root agent's first answer."""
    replies = episode.root_replies()
    return vowel_share(replies[0]) if replies else 0.0


def turns_config(
    tiny_model: str,
    steps: int,
    *,
    credit: str,
    seed: int = 1,
    turns: int = TURNS,
    noise: bool = False,
    lr: float = 0.02,
    tokens: int = 8,
    **workflow: Any,
) -> dict:
    return {
        "environments": [
            {
                "name": "turns",
                "service": "python://turns:VowelTurns",
                "harness": "say-turns",
                "package": "turns",
                "service_kwargs": {"options": {"turns": turns, "noise": noise}},
                # the first turn's pay, kept as a part of weight 0: the learnable part of the reward
                "reward": {
                    "rules": [
                        {"rule": "env"},
                        {"rule": "python", "ref": "turns:first_turn", "weight": 0, "name": "first_turn"},
                    ]
                },
            }
        ],
        "train": {
            "backend": "local",
            "reproducible": True,
            "model_name": tiny_model,
            "renderer_name": "qwen3_instruct",
            "lora_rank": 16,
            "batch_size": 2,
            "max_training_steps": steps,
            "save_every": 0,
            "seed": seed,
            "loss_fn": "importance_sampling",
            "optimizer": {"learning_rate": lr},
            "workflow_config": {
                "group_size": 8,
                "credit": credit,
                "rollout_config": {"max_steps": turns, "inference_params": {"max_completion_tokens": tokens}},
                **workflow,
            },
        },
        "stats": {"experiment_name": "turns", "trial_name": f"{credit}-{seed}"},
    }

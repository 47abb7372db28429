"""An environment a tiny random-init model can learn, for the end-to-end training test.

The policy answers once; the `submit` tool rewards the share of the answer's letters that
are vowels. A random model scores about 0.2-0.3, and every sample gets a graded reward, so
the signal is dense enough for a few dozen steps of importance sampling to move it.
"""

from __future__ import annotations

from typing import Any

from openreward.environments import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel

import platoon as pt


class Submission(BaseModel):
    text: str


def vowel_share(text: str) -> float:
    letters = [c for c in text.lower() if c.isalpha() and c.isascii()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


class Vowels(Environment):
    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return [{"id": f"{split}-{i}"} for i in range(16)]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Say something.")]

    @tool
    async def submit(self, args: Submission) -> ToolOutput:
        """Submit the answer."""
        return ToolOutput(blocks=[TextBlock(text="ok")], reward=vowel_share(args.text), finished=True)


@pt.harness("say-and-submit")
async def say_and_submit(ctx: pt.AgentContext) -> pt.AgentResult:
    reply = await ctx.chat([{"role": "user", "content": ctx.instruction}])
    await ctx.call_tool("submit", {"text": reply.text})
    return pt.AgentResult("completed", final_message=reply.text)


def learn_config(tiny_model: str, steps: int, **train_overrides) -> dict:
    return {
        "environments": [
            {
                "name": "vowels",
                "service": "python://learnable:Vowels",
                "harness": "say-and-submit",
                "package": "learnable",
            }
        ],
        "train": {
            "backend": "local",
            "model_name": tiny_model,
            "renderer_name": "qwen3_instruct",
            "lora_rank": 16,
            "batch_size": 4,
            "max_training_steps": steps,
            "save_every": 0,
            "seed": 1,
            "loss_fn": "importance_sampling",
            "optimizer": {"learning_rate": 0.02},
            "workflow_config": {
                "group_size": 8,
                "rollout_config": {"max_steps": 1, "inference_params": {"max_completion_tokens": 8}},
            },
            **train_overrides,
        },
        "stats": {"experiment_name": "learn", "trial_name": "t"},
    }

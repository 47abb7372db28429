"""Guess the number: an ORS environment whose one tool answers higher or lower."""

from __future__ import annotations

import random
from typing import Any

from openreward.environments import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel, Field


class Guess(BaseModel):
    number: int = Field(description="Your guess, from 1 to 100.")


class GuessTheNumber(Environment):
    """Find the secret number from 1 to 100; each wrong guess says higher or lower."""

    # An episode that ends without a correct guess is graded 0 (the sum of its rewards),
    # not left ungraded.
    platoon_reward = "sum"

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        if split == "train":
            return [{"id": f"train-{n}", "secret": n} for n in range(1, 101)]
        rng = random.Random(7)
        return [{"id": f"test-{i}", "secret": rng.randint(1, 100)} for i in range(20)]

    def get_prompt(self) -> list[TextBlock]:
        return [
            TextBlock(
                text="Find the secret number from 1 to 100 with as few guesses as possible. "
                "Call the guess tool; it answers whether the secret is higher or lower."
            )
        ]

    @tool
    async def guess(self, args: Guess) -> ToolOutput:
        """Guess the number; the answer says whether the secret is higher or lower."""
        secret = self.task_spec["secret"]
        if args.number == secret:
            return ToolOutput(blocks=[TextBlock(text="Correct!")], reward=1.0, finished=True)
        return ToolOutput(blocks=[TextBlock(text="higher" if args.number < secret else "lower")], reward=0.0)

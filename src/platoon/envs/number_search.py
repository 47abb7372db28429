"""Number search, the environment that ships with platoon (`env: platoon-number-search@1`).

Find a secret integer in `[lo, hi]` with a `guess` tool that answers `higher`, `lower` or
`correct`. A correct guess gives reward 1.0 and finishes the episode; every other guess gives
0.0, and the session is graded by the sum (`platoon_reward = "sum"`), so an agent that runs
out of steps scores 0 rather than going ungraded. Binary search needs at most
ceil(log2(hi - lo + 1)) guesses: 10 for the default range.

Tasks are deterministic: the same seed gives the same secrets on every machine.
`configure(lo=, hi=, train_size=, test_size=, seed=)` returns a variant with other settings
(`service_kwargs: {options: {hi: 99}}` in a config).
"""

from __future__ import annotations

import random
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from platoon.envs._sdk import Environment, TextBlock, ToolOutput, tool

__all__ = ["Guess", "NumberSearch"]


class Guess(BaseModel):
    number: int = Field(description="Your guess.")


class NumberSearch(Environment):
    """Guess a secret integer; each answer says whether it is higher or lower."""

    version: ClassVar[int] = 1
    platoon_reward: ClassVar[str] = "sum"
    lo: ClassVar[int] = 0
    hi: ClassVar[int] = 1023
    train_size: ClassVar[int] = 10_000
    test_size: ClassVar[int] = 1_000
    seed: ClassVar[int] = 42

    @classmethod
    def configure(
        cls,
        *,
        lo: int | None = None,
        hi: int | None = None,
        train_size: int | None = None,
        test_size: int | None = None,
        seed: int | None = None,
    ) -> type[NumberSearch]:
        """A variant of this environment with other settings; the name stays the same."""
        settings: dict[str, Any] = {
            "lo": cls.lo if lo is None else lo,
            "hi": cls.hi if hi is None else hi,
            "train_size": cls.train_size if train_size is None else train_size,
            "test_size": cls.test_size if test_size is None else test_size,
            "seed": cls.seed if seed is None else seed,
        }
        if settings["lo"] > settings["hi"]:
            raise ValueError(f"lo ({settings['lo']}) must not be greater than hi ({settings['hi']})")
        if settings["train_size"] < 0 or settings["test_size"] < 0:
            raise ValueError("train_size and test_size must not be negative")
        # The SDK caches splits and tasks in class attributes found by hasattr, which a
        # subclass would inherit: give the variant caches of its own.
        settings |= {"_tasks_cache": {}, "_tasks_cache_locks": {}, "_splits_cache": ["train", "test"]}
        return type(cls.__name__, (cls,), {"__module__": cls.__module__, **settings})

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        sizes = {"train": cls.train_size, "test": cls.test_size}
        if split not in sizes:
            raise ValueError(f"unknown split {split!r}")
        rng = random.Random(f"platoon-number-search:{cls.seed}:{split}")
        return [
            {"id": f"{split}-{index}", "lo": cls.lo, "hi": cls.hi, "secret": rng.randint(cls.lo, cls.hi)}
            for index in range(sizes[split])
        ]

    async def get_prompt(self) -> list[TextBlock]:
        lo, hi = self.task_spec["lo"], self.task_spec["hi"]
        text = (
            f"I am thinking of an integer between {lo} and {hi}, inclusive. Find it with the guess tool: "
            "each answer says whether the secret number is higher or lower than your guess, or correct."
        )
        return [TextBlock(text=text)]

    @tool
    async def guess(self, args: Guess) -> ToolOutput:
        """Guess the secret number; the answer is higher, lower or correct."""
        lo, hi, secret = self.task_spec["lo"], self.task_spec["hi"], self.task_spec["secret"]
        if not lo <= args.number <= hi:
            text = f"{args.number} is out of range: the number is between {lo} and {hi}"
            return ToolOutput(blocks=[TextBlock(text=text)], reward=0.0)
        if args.number == secret:
            return ToolOutput(blocks=[TextBlock(text="correct")], reward=1.0, finished=True)
        answer = "higher" if secret > args.number else "lower"
        return ToolOutput(blocks=[TextBlock(text=answer)], reward=0.0)

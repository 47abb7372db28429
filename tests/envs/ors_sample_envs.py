"""ORS environments for the env service tests (imported as `ors_sample_envs:Class`).

Each records its live instances (set up and not torn down) so a test can assert that no
session was left open, on the platoon side and on the environment's own.
"""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
from openreward.environments import (
    Environment,
    ListToolsOutput,
    TextBlock,
    ToolOutput,
    ToolSpec,
    terminal,
    tool,
)
from pydantic import BaseModel


class Guess(BaseModel):
    number: int


class Answer(BaseModel):
    answer: str


class Seconds(BaseModel):
    seconds: float


class Tracked(Environment):
    live: ClassVar[set[int]]
    setups: ClassVar[int]
    teardowns: ClassVar[int]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.live, cls.setups, cls.teardowns = set(), 0, 0

    async def setup(self) -> None:
        type(self).setups += 1
        type(self).live.add(id(self))

    async def teardown(self) -> None:
        type(self).teardowns += 1
        type(self).live.discard(id(self))


class GuessTheNumber(Tracked):
    """The seed quickstart's environment: find a secret from 1 to 20."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "test"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return [{"id": f"{split}-{n}", "secret": n} for n in range(1, 21)]

    def get_prompt(self) -> list[TextBlock]:  # a plain function: the SDK runs it in a thread
        return [TextBlock(text="Find the secret number from 1 to 20."), TextBlock(text="Use guess.")]

    @tool
    async def guess(self, args: Guess) -> ToolOutput:
        """Guess the number; the answer says whether the secret is higher or lower."""
        secret = self.task_spec["secret"]
        if args.number == secret:
            return ToolOutput(blocks=[TextBlock(text="Correct!")], reward=1.0, finished=True)
        return ToolOutput(blocks=[TextBlock(text="higher" if args.number < secret else "lower")])


class Notes:
    """A class toolset: its tools are merged into the environment's."""

    def __init__(self, env: Environment) -> None:
        self.env = env

    @tool
    async def note(self, args: Answer) -> ToolOutput:
        """Write a note."""
        self.env.notes.append(args.answer)
        return ToolOutput(blocks=[TextBlock(text=f"{len(self.env.notes)} notes")])


class Workshop(Tracked):
    """Every ORS feature the backends pass on: secrets, toolsets, task tools, a terminal tool,
    sum rewards, plain-function tools, tools that raise or hang, and copyable state."""

    toolsets = (Notes,)
    platoon_reward = "sum"

    def __init__(self, task_spec: Any = {}, secrets: dict[str, str] = {}) -> None:  # noqa: B006
        super().__init__(task_spec, secrets)
        self.secrets = secrets
        self.notes: list[str] = []
        self.count = 0

    async def setup(self) -> None:
        await super().setup()
        await anyio.sleep(self.task_spec.get("setup_delay", 0))

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train", "holdout"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return [{"target": 3, "bonus": split == "holdout"}, {"target": 5, "bonus": False}]

    async def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=f"Count to {self.task_spec['target']}.")]

    def list_task_tools(self) -> ListToolsOutput:
        if not self.task_spec.get("bonus"):
            return ListToolsOutput(tools=[])
        return ListToolsOutput(tools=[ToolSpec(name="bonus", description="A task tool.", input_schema=None)])

    @tool
    async def inc(self) -> ToolOutput:
        """Add one to the counter; reward 0.5 each time."""
        self.count += 1
        return ToolOutput(blocks=[TextBlock(text=str(self.count))], reward=0.5)

    @tool
    async def secret(self) -> ToolOutput:
        """Say the API key the session was given."""
        return ToolOutput(blocks=[TextBlock(text=self.secrets.get("API_KEY", "none"))])

    @tool
    def sync_inc(self) -> ToolOutput:
        """A plain-function tool."""
        self.count += 1
        return ToolOutput(blocks=[TextBlock(text=str(self.count))])

    @tool(shared=False)
    async def bonus(self) -> ToolOutput:
        """Only listed for bonus tasks."""
        return ToolOutput(blocks=[TextBlock(text="bonus")], reward=10.0)

    @tool
    async def echo(self, args: Answer) -> ToolOutput:
        """Say it back."""
        return ToolOutput(blocks=[TextBlock(text=args.answer)])

    @tool
    async def boom(self) -> ToolOutput:
        """Raise."""
        raise RuntimeError("kaboom")

    @tool
    async def nap(self, args: Seconds) -> ToolOutput:
        """Sleep."""
        await anyio.sleep(args.seconds)
        return ToolOutput(blocks=[TextBlock(text="rested")])

    @terminal
    @tool
    async def submit(self, args: Answer) -> ToolOutput:
        """Submit the final answer."""
        right = args.answer.strip() == str(self.task_spec["target"])
        return ToolOutput(
            blocks=[TextBlock(text="right" if right else "wrong")],
            reward=1.0 if right else 0.0,
            finished=True,
        )


class BrokenSetup(Tracked):
    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return [{"id": "only"}]

    async def setup(self) -> None:
        await super().setup()
        raise ValueError("no sandbox for you")

    async def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="unreachable")]

    @tool
    async def noop(self) -> ToolOutput:
        """Nothing."""
        return ToolOutput(blocks=[])

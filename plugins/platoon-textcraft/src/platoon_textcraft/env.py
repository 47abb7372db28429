"""TextCraft, a Minecraft-like crafting environment, as an ORS ``Environment``.

The agent fetches base items, crafts its way up a recipe tree and calls ``finish``; the reward is 1
if the target is in the inventory then. A session can be forked for a subagent that works on a
sub-target: by default the child changes the parent's live inventory and is graded on its own target.
"""

from __future__ import annotations

import threading
import uuid
import weakref
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import msgspec
from openreward.environments import Environment, Split, TextBlock, ToolOutput, tool
from pydantic import BaseModel, Field

from platoon_textcraft import crafting
from platoon_textcraft.crafting import CraftError, Inventory
from platoon_textcraft.recipes import WorldSettings
from platoon_textcraft.tasks import TaskError, TaskSettings, TaskSpec, make_task, num_tasks, split_names

__all__ = [
    "CraftArgs",
    "GetBaseArgs",
    "ItemArgs",
    "TextCraft",
    "TextCraftSynth",
    "shared_inventory",
]

MAX_COUNT = 10_000
ForkMode = Literal["shared", "copy", "fresh"]

# Sessions that name the same shared_inventory_key hold the same Inventory; it lives as long as one does.
_inventories: weakref.WeakValueDictionary[str, Inventory] = weakref.WeakValueDictionary()
_inventories_lock = threading.Lock()


def shared_inventory(key: str) -> Inventory | None:
    """The live inventory registered under ``key`` in this process, if a session still holds it."""
    return _inventories.get(key)


def _attach(key: str, initial: dict[str, int]) -> Inventory:
    with _inventories_lock:
        inventory = _inventories.get(key)
        if inventory is None:
            inventory = _inventories[key] = Inventory(initial)
        return inventory


class CraftArgs(BaseModel):
    target: str = Field(description="The item to craft, e.g. 'oak plank'.")
    count: int = Field(1, ge=1, le=MAX_COUNT, description="How many to make at least.")


class GetBaseArgs(BaseModel):
    item: str = Field(description="The base item to fetch.")
    count: int = Field(1, ge=1, le=MAX_COUNT, description="How many to fetch.")


class ItemArgs(BaseModel):
    item: str = Field(description="The item to look up.")


class TextCraft(Environment):
    """Craft a target item from base items through a synthetic recipe tree (depth 1 to 4)."""

    settings: ClassVar[TaskSettings] = TaskSettings()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The SDK caches splits and tasks in class attributes it finds with hasattr, which a
        # subclass would inherit from its parent; give every variant caches of its own.
        cls._splits_cache = cls.list_splits()
        cls._tasks_cache = {}
        cls._tasks_cache_locks = {}

    def __init__(
        self, task_spec: Mapping[str, Any] | None = None, secrets: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(task_spec=task_spec or {}, secrets=dict(secrets or {}))
        self.spec = TaskSpec.parse(self.task_spec)
        self.world = self.spec.build_world()
        for item in (self.spec.target, *self.spec.inventory):
            if not self.world.has(item):
                raise TaskError(f"task {self.spec.id or self.spec.target!r} names unknown item {item!r}")
        self.target = self.spec.target
        self.count = self.spec.count
        self.inventory_key = self.spec.shared_inventory_key or uuid.uuid4().hex
        # The live Inventory; not called `inventory`, which is the tool's name.
        self.stock = _attach(self.inventory_key, self.spec.inventory)

    @classmethod
    def variant(cls, name: str, **settings: Any) -> type[TextCraft]:
        """A subclass named ``name`` whose tasks come from this class's ``TaskSettings`` with these
        fields changed (``world=`` a dict changes only the ``WorldSettings`` fields it names)."""
        merged = msgspec.to_builtins(cls.settings)
        given = msgspec.to_builtins(settings)
        merged.update({**given, "world": {**merged.get("world", {}), **given.get("world", {})}})
        try:
            new = msgspec.convert(merged, TaskSettings)
        except msgspec.ValidationError as exc:
            raise TaskError(f"bad TextCraft settings: {exc}") from None
        return type(name, (cls,), {"settings": new, "__module__": cls.__module__})

    # Tasks. The per-index methods skip listing a whole split, so any task is cheap to reach.

    @classmethod
    def list_splits(cls) -> list[Split]:
        return [Split(name=name, type=kind) for name, kind in split_names(cls.settings)]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return [make_task(split, i, cls.settings) for i in range(num_tasks(split, cls.settings))]

    @classmethod
    async def num_tasks(cls, split: str) -> int:
        return num_tasks(split, cls.settings)

    @classmethod
    async def get_task(cls, split: str, index: int) -> dict[str, Any]:
        return make_task(split, index, cls.settings)

    @classmethod
    async def get_task_range(
        cls, split: str, start: int | None = None, stop: int | None = None
    ) -> list[dict[str, Any]]:
        indices = range(num_tasks(split, cls.settings))[slice(start, stop)]
        return [make_task(split, i, cls.settings) for i in indices]

    # The episode.

    def get_prompt(self) -> list[TextBlock]:
        goal = f"{self.count} {self.target}"
        lines = []
        if self.spec.parent_targets:
            chain = " -> ".join(self.spec.parent_targets)
            lines.append(f"You are a subagent. The agents above you are crafting: {chain}.")
            lines.append(f"Your own goal: craft {goal}.")
        else:
            lines.append(f"Craft {goal}.")
        lines += [
            "",
            "Base items can be fetched in any amount with get_base. Every other item is crafted "
            "with craft, which uses up the inputs of one of its recipes for each batch it makes. "
            "get_info shows how an item is made, and inventory shows what you have.",
            f"Call finish once the inventory holds {goal}: finish ends your task and grades it.",
            "",
            f"Base items: {', '.join(self.world.base_items)}.",
        ]
        if self.spec.parent_targets and self.spec.shared_inventory_key:
            lines.append(
                "The inventory is shared with the agent that gave you this task: leave your items in it."
            )
        lines.append(self.stock.describe())
        return [TextBlock(text="\n".join(lines))]

    @tool
    async def craft(self, args: CraftArgs) -> ToolOutput:
        """Craft at least `count` of `target` from the inputs of one of its recipes in the inventory."""
        if not self.world.has(args.target):
            return self._error(crafting.unknown_item(args.target, self.world.items))
        if self.world.is_base(args.target):
            return self._error(
                f"{args.target} is a base item: fetch it with get_base instead of crafting it."
            )
        rules = [(r.inputs, r.count) for r in self.world.recipes_for(args.target)]
        return self._run(crafting.craft, self.stock, args.target, args.count, rules)

    @tool
    async def get_base(self, args: GetBaseArgs) -> ToolOutput:
        """Fetch `count` of a base item into the inventory."""
        if not self.world.has(args.item):
            return self._error(crafting.unknown_item(args.item, self.world.items))
        return self._run(crafting.fetch, self.stock, args.item, args.count, self.world.base_items)

    @tool
    async def get_info(self, args: ItemArgs) -> ToolOutput:
        """Show the recipes that make an item, or that it is a base item."""
        item = args.item
        if not self.world.has(item):
            return self._error(crafting.unknown_item(item, self.world.items))
        if self.world.is_base(item):
            text = f"{item} is a base item: fetch it with get_base."
        else:
            recipes = self.world.recipes_for(item)
            listed = "\n".join(f"- {r.describe()}" for r in recipes)
            text = f"{item} is crafted ({len(recipes)} recipe{'s' * (len(recipes) > 1)}):\n{listed}"
        return ToolOutput(blocks=[TextBlock(text=text)], metadata={"item": item})

    @tool(concurrent=True)
    async def inventory(self) -> ToolOutput:
        """Show every item in the inventory with its count."""
        return self._output(self.stock.describe())

    @tool(exclusive=True)
    async def finish(self) -> ToolOutput:
        """End the task: it succeeds if the inventory holds the goal."""
        reward = self.grade()
        have = self.stock.count(self.target)
        verdict = "Goal reached" if reward else "Goal not reached"
        text = f"{verdict}: the inventory holds {have} of the {self.count} {self.target} needed."
        return self._output(text, reward=reward, finished=True)

    def grade(self) -> float:
        """1.0 if the inventory holds this session's own goal, else 0.0 (it does not end the session)."""
        return 1.0 if self.stock.count(self.target) >= self.count else 0.0

    # Subagents.

    def child_task_spec(
        self, sub_target: str, count: int | None = None, mode: ForkMode = "shared"
    ) -> dict[str, Any]:
        """The task spec of a subagent session on ``sub_target``: an item name, or text naming one
        (``"craft 2 iron gear"``). ``mode`` is ``shared`` (this live inventory), ``copy`` (a
        snapshot of it) or ``fresh`` (the task's starting inventory)."""
        found = self.world.find_item(sub_target)
        if found is None:
            raise TaskError(f"cannot fork: {sub_target!r} names no item of this task")
        item, written = found
        count = count if count is not None else written or 1
        if count < 1:
            raise TaskError(f"cannot fork: count must be at least 1, got {count}")
        spec = msgspec.structs.replace(
            self.spec,
            id=f"{self.spec.id or self.target}/{item}",
            target=item,
            count=count,
            parent_targets=[*self.spec.parent_targets, f"{self.count} {self.target}"],
        )
        if mode == "shared":
            spec.shared_inventory_key = self.inventory_key
        elif mode == "copy":
            spec.shared_inventory_key, spec.inventory = None, self.stock.snapshot()
        elif mode == "fresh":
            spec.shared_inventory_key = None
        else:
            raise TaskError(f"cannot fork: mode must be shared, copy or fresh, got {mode!r}")
        return spec.to_builtins()

    def fork(self, sub_target: str, count: int | None = None, mode: ForkMode = "shared") -> TextCraft:
        """A new session of this class for a subagent (see ``child_task_spec``)."""
        return type(self)(task_spec=self.child_task_spec(sub_target, count, mode))

    def _run(self, action: Any, *args: Any) -> ToolOutput:
        try:
            return self._output(action(*args))
        except CraftError as exc:
            return self._error(str(exc))

    def _output(self, text: str, **fields: Any) -> ToolOutput:
        return ToolOutput(
            blocks=[TextBlock(text=text)], metadata={"inventory": self.stock.snapshot()}, **fields
        )

    def _error(self, text: str) -> ToolOutput:
        return ToolOutput(blocks=[TextBlock(text=text)], metadata={"error": True})


class TextCraftSynth(TextCraft):
    """TextCraft-Synth: deeper, wider recipe trees (depth 1 to 8) for training recursive agents."""

    settings = TaskSettings(
        max_depth=8,
        world=WorldSettings(num_base=8, width=4, max_inputs=3, max_input_count=2, max_output_count=4),
    )

"""TextCraft tasks: the splits, and the task spec each (split, index, seed) deterministically becomes.

Splits (for settings with depths ``min_depth..max_depth``):

- ``train`` and ``test``: depths mixed uniformly, ``train_size`` / ``test_size`` tasks;
- ``train-depth{d}`` and ``test-depth{d}``: every task at depth ``d`` (a curriculum, and the
  per-difficulty eval report).

Every task has its own world, seeded from ``(seed, split, index)``, so no two splits share a task.
"""

from __future__ import annotations

import random
import re
from typing import Any

import msgspec

from platoon_textcraft.recipes import RecipeError, World, WorldSettings, generate_world, target_of

__all__ = [
    "Generator",
    "TaskError",
    "TaskIndexError",
    "TaskSettings",
    "TaskSpec",
    "make_task",
    "num_tasks",
    "split_names",
]


class TaskError(ValueError):
    """A split, an index or a task spec that names no TextCraft task."""


class TaskIndexError(TaskError, IndexError):
    """An index past the end of a split (an IndexError, as the ORS server expects)."""


class TaskSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a TextCraft variant's task generator makes."""

    seed: int = 0
    min_depth: int = 1
    max_depth: int = 4
    train_size: int = 10_000
    test_size: int = 500
    max_target_count: int = 2
    world: WorldSettings = WorldSettings()

    def __post_init__(self) -> None:
        if not 1 <= self.min_depth <= self.max_depth:
            raise TaskError(f"need 1 <= min_depth <= max_depth, got {self.min_depth}..{self.max_depth}")
        if self.train_size < 0 or self.test_size < 0 or self.max_target_count < 1:
            raise TaskError("split sizes must be >= 0 and max_target_count >= 1")


class Generator(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A world rebuilt from a seed: three integers in a task spec instead of every recipe."""

    seed: int
    depth: int
    settings: WorldSettings = WorldSettings()


class TaskSpec(msgspec.Struct, kw_only=True):
    """The JSON a TextCraft session is created from (the ORS ``task_spec``).

    The world is either ``generator`` (synthetic tasks) or ``world`` written out in full (hand-made
    tasks). ``shared_inventory_key`` names a process-wide inventory that every session with the
    same key changes together (how subagents share their parent's inventory); ``inventory`` is
    the starting inventory when the key is new.
    """

    target: str
    count: int = 1
    id: str = ""
    generator: Generator | None = None
    world: dict[str, Any] | None = None
    inventory: dict[str, int] = {}
    shared_inventory_key: str | None = None
    parent_targets: list[str] = []
    split: str | None = None
    index: int | None = None
    depth: int | None = None

    @classmethod
    def parse(cls, data: object) -> TaskSpec:
        try:
            spec = msgspec.convert(data, cls)
        except msgspec.ValidationError as exc:
            raise TaskError(f"bad TextCraft task_spec: {exc}") from None
        if (spec.generator is None) == (spec.world is None):
            raise TaskError("a TextCraft task_spec needs exactly one of 'generator' and 'world'")
        if spec.count < 1:
            raise TaskError(f"task_spec count must be at least 1, got {spec.count}")
        return spec

    def build_world(self) -> World:
        try:
            if self.generator is not None:
                gen = self.generator
                return generate_world(gen.seed, gen.depth, gen.settings)
            return World.from_builtins(self.world)
        except RecipeError as exc:
            raise TaskError(f"bad TextCraft world in task {self.id or self.target!r}: {exc}") from None

    def to_builtins(self) -> dict[str, Any]:
        # Drop unset optional keys so task specs stay short on the wire.
        return {
            key: value
            for key, value in msgspec.to_builtins(self).items()
            if value is not None and value != [] and value != {}
        }


_DEPTH_SPLIT = re.compile(r"^(train|test)-depth(\d+)$")


def split_names(settings: TaskSettings) -> list[tuple[str, str]]:
    """``(name, ORS split type)`` for every split, in a stable order."""
    depths = range(settings.min_depth, settings.max_depth + 1)
    return [
        ("train", "train"),
        ("test", "test"),
        *((f"train-depth{d}", "train") for d in depths),
        *((f"test-depth{d}", "test") for d in depths),
    ]


def num_tasks(split: str, settings: TaskSettings) -> int:
    kind, _ = _parse_split(split, settings)
    return settings.train_size if kind == "train" else settings.test_size


def make_task(split: str, index: int, settings: TaskSettings) -> dict[str, Any]:
    """The task spec of task ``index`` of ``split``: the same for the same arguments, everywhere."""
    kind, depth = _parse_split(split, settings)
    size = settings.train_size if kind == "train" else settings.test_size
    if not 0 <= index < size:
        raise TaskIndexError(f"index {index} out of range for split {split!r} of {size} tasks")
    rng = random.Random(f"textcraft-task/{settings.seed}/{split}/{index}")
    if depth is None:
        depth = rng.randint(settings.min_depth, settings.max_depth)
    world_seed = rng.getrandbits(48)
    count = rng.randint(1, settings.max_target_count)
    world = generate_world(world_seed, depth, settings.world)
    spec = TaskSpec(
        id=f"{split}-{index}",
        split=split,
        index=index,
        depth=depth,
        target=target_of(world),
        count=count,
        generator=Generator(world_seed, depth, settings.world),
    )
    return spec.to_builtins()


def _parse_split(split: str, settings: TaskSettings) -> tuple[str, int | None]:
    if split in ("train", "test"):
        return split, None
    match = _DEPTH_SPLIT.match(split)
    if match and settings.min_depth <= int(match.group(2)) <= settings.max_depth:
        return match.group(1), int(match.group(2))
    names = ", ".join(name for name, _ in split_names(settings))
    raise TaskError(f"unknown TextCraft split {split!r}; the splits are {names}")

"""Synthetic crafting worlds: base items, recipes, and the depth of an item's crafting tree.

Everything here is pure and seeded: the same ``(seed, depth, settings)`` always gives the same
world, so tasks can be made in any number and rebuilt anywhere from a few integers.
"""

from __future__ import annotations

import functools
import math
import random
import re
from collections.abc import Iterable

import msgspec

__all__ = [
    "Action",
    "Recipe",
    "RecipeError",
    "World",
    "WorldSettings",
    "generate_world",
    "solve",
    "target_of",
]


class RecipeError(ValueError):
    """A world or a request about it is malformed (unknown item, cyclic recipes, bad settings)."""


class Recipe(msgspec.Struct, frozen=True):
    """``inputs`` (item -> count) make ``count`` of ``output`` in one craft."""

    output: str
    count: int
    inputs: dict[str, int]

    def describe(self) -> str:
        parts = " + ".join(f"{n} {item}" for item, n in self.inputs.items())
        return f"{parts} -> {self.count} {self.output}"


class WorldSettings(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, omit_defaults=True
):
    """Shape of a generated world. ``width`` crafted items per level keeps the number of distinct
    crafts of any target below ``width * depth`` however deep it is."""

    num_base: int = 6
    width: int = 3
    max_inputs: int = 3
    max_input_count: int = 2
    max_output_count: int = 4
    alt_recipe_prob: float = 0.25

    def __post_init__(self) -> None:
        if self.num_base < 1 or self.width < 1 or self.max_inputs < 1:
            raise RecipeError("num_base, width and max_inputs must be at least 1")
        if self.max_input_count < 1 or self.max_output_count < 1:
            raise RecipeError("max_input_count and max_output_count must be at least 1")
        if not 0.0 <= self.alt_recipe_prob <= 1.0:
            raise RecipeError(f"alt_recipe_prob must be in [0, 1], got {self.alt_recipe_prob}")


class Action(msgspec.Struct, frozen=True):
    """One step of a plan: ``op`` is ``get`` (fetch a base item) or ``craft``."""

    op: str
    item: str
    count: int


class _WorldData(msgspec.Struct, forbid_unknown_fields=True):
    base_items: list[str]
    recipes: list[Recipe]


class World:
    """The items of one task and how each crafted item is made (an item may have several recipes).

    Its wire form (``to_builtins``/``from_builtins``) is ``{"base_items": [...], "recipes":
    [{"output", "count", "inputs": {item: n}}]}``, which the Harbor CLI reads with the stdlib.
    """

    __slots__ = ("_by_output", "_depth", "base_items", "recipes")

    def __init__(self, base_items: Iterable[str], recipes: Iterable[Recipe]) -> None:
        self.base_items = tuple(base_items)
        self.recipes = tuple(recipes)
        if len(set(self.base_items)) != len(self.base_items):
            raise RecipeError("base items must be distinct")
        by_output: dict[str, list[Recipe]] = {}
        for recipe in self.recipes:
            if recipe.output in self.base_items:
                raise RecipeError(f"{recipe.output!r} is a base item and cannot also be crafted")
            if recipe.count < 1 or not recipe.inputs or min(recipe.inputs.values()) < 1:
                raise RecipeError(f"bad recipe for {recipe.output!r}: counts must be positive")
            by_output.setdefault(recipe.output, []).append(recipe)
        self._by_output = {item: tuple(rs) for item, rs in by_output.items()}
        for recipe in self.recipes:
            for item in recipe.inputs:
                if item not in self.base_items and item not in self._by_output:
                    raise RecipeError(f"recipe for {recipe.output!r} uses unknown item {item!r}")
        self._depth = _depths(self.base_items, self._by_output)

    @classmethod
    def from_builtins(cls, data: object) -> World:
        try:
            parsed = msgspec.convert(data, _WorldData)
        except msgspec.ValidationError as exc:
            raise RecipeError(f"bad world: {exc}") from None
        return cls(parsed.base_items, parsed.recipes)

    def to_builtins(self) -> dict:
        return msgspec.to_builtins(_WorldData(list(self.base_items), list(self.recipes)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, World):
            return NotImplemented
        return self.base_items == other.base_items and self.recipes == other.recipes

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"World({len(self.base_items)} base items, {len(self.recipes)} recipes)"

    @property
    def items(self) -> tuple[str, ...]:
        """Every item, base items first, then crafted items by depth (then name)."""
        crafted = sorted(self._by_output, key=lambda item: (self._depth[item], item))
        return (*self.base_items, *crafted)

    def has(self, item: str) -> bool:
        return item in self._depth

    def is_base(self, item: str) -> bool:
        return item in self.base_items

    def recipes_for(self, item: str) -> tuple[Recipe, ...]:
        return self._by_output.get(item, ())

    def depth(self, item: str) -> int:
        """0 for a base item, else 1 + the deepest input of its shallowest recipe."""
        try:
            return self._depth[item]
        except KeyError:
            raise RecipeError(f"unknown item {item!r}") from None

    def find_item(self, text: str) -> tuple[str, int | None] | None:
        """The item named in free text (``"craft 2 iron gear"``) and the count written before it.

        The longest item name wins, so ``"iron gear box"`` is not read as ``"iron gear"``.
        """
        lowered = " ".join(text.lower().split())
        for item in sorted(self._depth, key=len, reverse=True):
            match = re.search(rf"(?:(\d+)\s*(?:x\s+)?)?\b{re.escape(item.lower())}\b", lowered)
            if match:
                return item, int(match.group(1)) if match.group(1) else None
        return None


def _depths(base_items: tuple[str, ...], table: dict[str, tuple[Recipe, ...]]) -> dict[str, int]:
    depth = dict.fromkeys(base_items, 0)
    pending = set(table)
    while pending:
        ready = {}
        for item in pending:
            makeable = [r for r in table[item] if all(i in depth for i in r.inputs)]
            if makeable:
                ready[item] = 1 + min(max(depth[i] for i in r.inputs) for r in makeable)
        if not ready:
            raise RecipeError(f"recipes are cyclic: {sorted(pending)[:5]}")
        depth.update(ready)
        pending -= set(ready)
    return depth


_MATERIALS = (
    "oak", "birch", "spruce", "iron", "copper", "gold", "tin", "obsidian", "amber", "jade",
    "cobalt", "silver", "quartz", "ember", "frost", "moss", "coral", "ash", "slate", "ruby",
    "onyx", "pearl", "bronze", "cedar", "maple", "granite", "marble", "willow", "opal", "zinc",
    "basalt", "cinder", "dune", "glacier", "lunar", "solar", "storm", "thorn", "velvet", "amethyst",
)  # fmt: skip
_RAW = ("log", "ore", "dust", "stone", "fiber", "shard", "seed", "clay", "sap", "pebble", "resin", "wool")
_CRAFTED = (
    "plank", "ingot", "gear", "rod", "plate", "block", "lantern", "bolt", "hinge", "brick",
    "tile", "rope", "wheel", "frame", "lens", "pipe", "chain", "hammer", "chest", "bucket",
    "anvil", "compass", "furnace", "ladder", "spring", "valve", "banner", "helmet", "shield", "beacon",
    "engine", "crate", "cart", "drum", "loom", "kiln", "press", "clock", "statue", "totem",
)  # fmt: skip


class _Names:
    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._used: set[str] = set()

    def draw(self, nouns: tuple[str, ...]) -> str:
        while True:
            name = f"{self._rng.choice(_MATERIALS)} {self._rng.choice(nouns)}"
            if name not in self._used:
                self._used.add(name)
                return name


@functools.lru_cache(maxsize=4096)
def generate_world(seed: int, depth: int, settings: WorldSettings | None = None) -> World:
    """A world of ``settings.width`` crafted items at each level 1..``depth``, each made from at
    least one item of the level below; ``target_of(world)`` is an item exactly ``depth`` deep and
    the rest are distractors."""
    settings = settings or WorldSettings()
    if depth < 1:
        raise RecipeError(f"depth must be at least 1, got {depth}")
    # Names are drawn at random without reuse; keep well inside the name space so drawing stays fast.
    if settings.num_base > 200 or settings.width * depth > 600:
        raise RecipeError(
            f"world too large: {settings.num_base} base items, depth {depth}, width {settings.width}"
        )
    rng = random.Random(f"textcraft-world/{seed}/{depth}")
    names = _Names(rng)
    levels = [[names.draw(_RAW) for _ in range(settings.num_base)]]
    recipes: list[Recipe] = []
    for _ in range(depth):
        below = [item for items in levels for item in items]
        made = []
        for _ in range(settings.width):
            item = names.draw(_CRAFTED)
            recipes.append(_recipe(rng, item, levels[-1], below, settings))
            if rng.random() < settings.alt_recipe_prob:
                recipes.append(_recipe(rng, item, levels[-1], below, settings))
            made.append(item)
        levels.append(made)
    return World(base_items=tuple(levels[0]), recipes=tuple(recipes))


def target_of(world: World) -> str:
    """The target a generated world was made for: the first item of its deepest level."""
    deepest = max(world.depth(r.output) for r in world.recipes)
    return next(r.output for r in world.recipes if world.depth(r.output) == deepest)


def _recipe(
    rng: random.Random, output: str, previous: list[str], below: list[str], settings: WorldSettings
) -> Recipe:
    # One input from the level just below pins the depth; the rest come from anywhere below.
    first = rng.choice(previous)
    others = [item for item in below if item != first]
    extra = rng.sample(others, min(len(others), rng.randint(0, settings.max_inputs - 1)))
    inputs = {item: _small(rng, settings.max_input_count) for item in [first, *extra]}
    return Recipe(output=output, count=rng.randint(1, settings.max_output_count), inputs=inputs)


def _small(rng: random.Random, most: int) -> int:
    # Counts skew to 1 so quantities stay tractable several levels up.
    return min(most, 1 + int(rng.expovariate(1.5)))


def solve(world: World, target: str, count: int = 1, have: dict[str, int] | None = None) -> list[Action]:
    """A shortest-in-crafts plan that ends with ``count`` of ``target``, given inventory ``have``:
    fetch every base item needed once, then craft each needed item once, deepest last. It always
    uses an item's first recipe."""
    if not world.has(target):
        raise RecipeError(f"unknown item {target!r}")
    available = dict(have or {})
    need: dict[str, int] = {target: count}
    order = sorted(world.items, key=lambda item: -world.depth(item))
    crafts: list[Action] = []
    gets: list[Action] = []
    for item in order:
        missing = need.get(item, 0) - available.get(item, 0)
        if missing <= 0:
            continue
        if world.is_base(item):
            gets.append(Action("get", item, missing))
            continue
        recipe = world.recipes_for(item)[0]
        batches = math.ceil(missing / recipe.count)
        crafts.append(Action("craft", item, batches * recipe.count))
        for ingredient, n in recipe.inputs.items():
            need[ingredient] = need.get(ingredient, 0) + batches * n
    return [*gets, *reversed(crafts)]

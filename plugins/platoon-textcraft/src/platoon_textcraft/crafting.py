"""The crafting rules and the inventory they change.

Standard library only: the Harbor export ships this file verbatim next to its command-line tool,
so the rules a bash agent plays by are the ones the ORS environment enforces.
"""

from __future__ import annotations

import difflib
import math
import threading
from collections.abc import Collection, Mapping, Sequence

__all__ = ["CraftError", "Inventory", "craft", "fetch", "unknown_item"]

# A recipe as these rules see it: (inputs {item: count}, how many one craft makes).
RecipeRule = tuple[Mapping[str, int], int]


class CraftError(Exception):
    """An action the rules refuse. The message is written for the agent and changes nothing."""


class Inventory:
    """Item counts that every session holding this object sees; each change is atomic, so a parent
    and its subagents can craft from one inventory at the same time."""

    def __init__(self, counts: Mapping[str, int] | None = None) -> None:
        self._lock = threading.Lock()
        self._counts = {item: n for item, n in (counts or {}).items() if n > 0}

    def count(self, item: str) -> int:
        with self._lock:
            return self._counts.get(item, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(sorted(self._counts.items()))

    def exchange(self, take: Mapping[str, int], give: Mapping[str, int]) -> dict[str, int]:
        """Remove ``take`` and add ``give`` in one step, or do nothing and return what is missing."""
        with self._lock:
            missing = {item: n - self._counts.get(item, 0) for item, n in take.items()}
            missing = {item: n for item, n in missing.items() if n > 0}
            if missing:
                return missing
            for item, n in take.items():
                self._counts[item] -= n
                if not self._counts[item]:
                    del self._counts[item]
            for item, n in give.items():
                self._counts[item] = self._counts.get(item, 0) + n
            return {}

    def describe(self) -> str:
        counts = self.snapshot()
        if not counts:
            return "The inventory is empty."
        return "Inventory: " + ", ".join(f"{n} {item}" for item, n in counts.items()) + "."


def fetch(inventory: Inventory, item: str, count: int, base_items: Collection[str]) -> str:
    """Add ``count`` of a base item (base items are in endless supply)."""
    _check_count(count)
    if item not in base_items:
        raise CraftError(f"{item} is not a base item, so it cannot be fetched; craft it instead.")
    inventory.exchange({}, {item: count})
    return f"Got {count} {item}; you now have {inventory.count(item)} {item}."


def craft(inventory: Inventory, item: str, count: int, recipes: Sequence[RecipeRule]) -> str:
    """Craft at least ``count`` of ``item`` with the first recipe whose inputs are all in the
    inventory; a craft makes whole batches, so it may make more than asked."""
    _check_count(count)
    if not recipes:
        raise CraftError(f"No recipe makes {item}.")
    shortfalls = []
    for inputs, makes in recipes:
        batches = math.ceil(count / makes)
        take = {ingredient: n * batches for ingredient, n in inputs.items()}
        missing = inventory.exchange(take, {item: batches * makes})
        if not missing:
            used = ", ".join(f"{n} {ingredient}" for ingredient, n in take.items())
            extra = f" (one craft makes {makes})" if batches * makes != count else ""
            return (
                f"Crafted {batches * makes} {item}{extra} from {used}; "
                f"you now have {inventory.count(item)} {item}."
            )
        shortfalls.append(
            ", ".join(f"{n} more {ingredient} (need {take[ingredient]})" for ingredient, n in missing.items())
        )
    if len(shortfalls) == 1:
        raise CraftError(f"Cannot craft {count} {item}: missing {shortfalls[0]}.")
    options = "; ".join(f"recipe {i} needs {text}" for i, text in enumerate(shortfalls, 1))
    raise CraftError(f"Cannot craft {count} {item} with any of its {len(recipes)} recipes: {options}.")


def unknown_item(item: str, known: Collection[str]) -> str:
    """The message for an item name that is not in this world, with the closest names."""
    close = difflib.get_close_matches(item, list(known), n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(name) for name in close)}?" if close else ""
    return f"Unknown item {item!r}.{hint}"


def _check_count(count: int) -> None:
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise CraftError(f"count must be a positive whole number, got {count!r}.")

"""``textcraft``: TextCraft as a command-line tool, for bash agents in a Harbor task container.

Standard library only: the Harbor export copies this file and ``crafting.py`` into each task.
The state file records every action that succeeded; ``grade`` replays them against the recipes,
so editing the file by hand earns nothing that the rules would not have given.

    textcraft goal | inventory | info ITEM | get [N] ITEM | craft [N] ITEM | grade

``--world`` (default ``$TEXTCRAFT_WORLD``, else /opt/textcraft/world.json) and ``--state``
(default ``$TEXTCRAFT_STATE``, else /app/inventory.json) locate the files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

if __package__:
    from platoon_textcraft import crafting
else:  # run as a script in a task container, where crafting.py sits next to this file
    import crafting  # type: ignore[no-redef]

DEFAULT_WORLD = "/opt/textcraft/world.json"
DEFAULT_STATE = "/app/inventory.json"


class Game:
    """One task's recipes and the inventory that the recorded actions produce."""

    def __init__(self, world: dict, actions: list) -> None:
        self.task = world["task"]
        self.base_items = list(world["base_items"])
        self.recipes: dict[str, list] = {}
        for recipe in world["recipes"]:
            self.recipes.setdefault(recipe["output"], []).append((recipe["inputs"], recipe["count"]))
        self.items = [*self.base_items, *self.recipes]
        self.inventory = crafting.Inventory(self.task.get("inventory") or {})
        self.actions: list = []
        for op, item, count in actions:
            self.apply(op, item, count)

    def apply(self, op: str, item: str, count: int) -> str:
        """Run one action; raise CraftError (and record nothing) if the rules refuse it."""
        if item not in self.items:
            raise crafting.CraftError(crafting.unknown_item(item, self.items))
        if op == "get":
            message = crafting.fetch(self.inventory, item, count, self.base_items)
        elif op == "craft":
            if item not in self.recipes:
                raise crafting.CraftError(f"{item} is a base item: fetch it with `textcraft get` instead.")
            message = crafting.craft(self.inventory, item, count, self.recipes[item])
        else:
            raise crafting.CraftError(f"unknown action {op!r}")
        self.actions.append([op, item, count])
        return message

    def info(self, item: str) -> str:
        if item not in self.items:
            raise crafting.CraftError(crafting.unknown_item(item, self.items))
        if item not in self.recipes:
            return f"{item} is a base item: fetch it with `textcraft get N {item}`."
        lines = [f"{item} is crafted from:"]
        for inputs, makes in self.recipes[item]:
            lines.append("- " + " + ".join(f"{n} {i}" for i, n in inputs.items()) + f" -> {makes} {item}")
        return "\n".join(lines)

    def reward(self) -> int:
        return int(self.inventory.count(self.task["target"]) >= self.task["count"])


def load_state(path: Path) -> list:
    if not path.exists():
        return []
    return json.loads(path.read_text())["actions"]


def save_state(path: Path, game: Game) -> None:
    # Write then rename, so an interrupted command never leaves a torn state file.
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"actions": game.actions, "inventory": game.inventory.snapshot()}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".textcraft-")
    with os.fdopen(fd, "w") as handle:
        json.dump(state, handle, indent=1)
    os.replace(tmp, path)


def _item_and_count(words: list[str]) -> tuple[str, int]:
    if len(words) > 1 and words[0].isdigit():
        return " ".join(words[1:]), int(words[0])
    return " ".join(words), 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="textcraft", description="Craft items from base items by recipes.")
    parser.add_argument("--world", default=os.environ.get("TEXTCRAFT_WORLD", DEFAULT_WORLD))
    parser.add_argument("--state", default=os.environ.get("TEXTCRAFT_STATE", DEFAULT_STATE))
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("goal", help="what to craft")
    commands.add_parser("inventory", help="what you have")
    for name, text in (
        ("info", "how an item is made"),
        ("get", "fetch N of a base item"),
        ("craft", "craft N of an item"),
    ):
        commands.add_parser(name, help=text).add_argument("words", nargs="+", metavar="[N] ITEM")
    commands.add_parser("grade", help="print 1 if the goal is in the inventory, else 0")
    args = parser.parse_args(argv)

    world = json.loads(Path(args.world).read_text())
    state = Path(args.state)
    try:
        game = Game(world, load_state(state))
    except (crafting.CraftError, ValueError, KeyError, TypeError) as exc:
        if args.command == "grade":
            print(0)  # a state file the rules cannot replay earns nothing
            return 0
        print(f"textcraft: the state file {state} is damaged: {exc}", file=sys.stderr)
        return 1
    task = game.task
    try:
        if args.command == "goal":
            print(f"Craft {task['count']} {task['target']}. Base items: {', '.join(game.base_items)}.")
        elif args.command == "inventory":
            print(game.inventory.describe())
        elif args.command == "grade":
            print(game.reward())
        elif args.command == "info":
            print(game.info(" ".join(args.words)))
        else:
            item, count = _item_and_count(args.words)
            print(game.apply(args.command, item, count))
            save_state(state, game)
    except crafting.CraftError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

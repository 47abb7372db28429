"""TextCraft: a Minecraft-like crafting environment for platoon, with synthetic recipe trees of any depth."""

from platoon_textcraft.crafting import CraftError, Inventory
from platoon_textcraft.env import TextCraft, TextCraftSynth, shared_inventory
from platoon_textcraft.recipes import Action, Recipe, RecipeError, World, WorldSettings, generate_world, solve
from platoon_textcraft.tasks import TaskError, TaskSettings, TaskSpec

__all__ = [
    "Action",
    "CraftError",
    "Inventory",
    "Recipe",
    "RecipeError",
    "TaskError",
    "TaskSettings",
    "TaskSpec",
    "TextCraft",
    "TextCraftSynth",
    "World",
    "WorldSettings",
    "generate_world",
    "shared_inventory",
    "solve",
]

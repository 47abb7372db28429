import msgspec
import pytest
from platoon_textcraft.crafting import CraftError, Inventory, craft, fetch
from platoon_textcraft.recipes import (
    Recipe,
    RecipeError,
    World,
    WorldSettings,
    generate_world,
    solve,
    target_of,
)


def play(world: World, plan, have=None) -> Inventory:
    inventory = Inventory(have)
    for action in plan:
        if action.op == "get":
            fetch(inventory, action.item, action.count, world.base_items)
        else:
            rules = [(r.inputs, r.count) for r in world.recipes_for(action.item)]
            craft(inventory, action.item, action.count, rules)
    return inventory


def test_generation_is_deterministic_per_seed():
    a = generate_world.__wrapped__(7, 4, WorldSettings())
    b = generate_world.__wrapped__(7, 4, WorldSettings())
    assert a == b and a is not b
    assert a.to_builtins() == b.to_builtins()
    assert generate_world(8, 4) != a


@pytest.mark.parametrize("depth", [1, 2, 3, 5, 8])
def test_target_depth_is_the_requested_depth(depth):
    settings = WorldSettings(width=4, num_base=8)
    for seed in range(20):
        world = generate_world(seed, depth, settings)
        assert world.depth(target_of(world)) == depth
        assert max(world.depth(item) for item in world.items) == depth
        assert len(world.base_items) == 8
        assert {r.output for r in world.recipes} == set(world.items[8:])
        assert len(world.items) == 8 + 4 * depth


@pytest.mark.parametrize("depth", [1, 3, 6])
def test_solve_plan_crafts_the_target(depth):
    for seed in range(30):
        world = generate_world(seed, depth)
        target = target_of(world)
        plan = solve(world, target, 3)
        assert play(world, plan).count(target) >= 3
        crafted = [a.item for a in plan if a.op == "craft"]
        assert len(crafted) == len(set(crafted)) <= 3 * depth  # each item crafted once


def test_solve_uses_what_is_already_held():
    world = generate_world(3, 2)
    target = target_of(world)
    assert solve(world, target, 1, {target: 1}) == []
    partial = solve(world, target, 2, {target: 1})
    assert play(world, partial, {target: 1}).count(target) >= 2


def test_world_round_trips_through_json():
    world = generate_world(11, 3)
    data = msgspec.json.decode(msgspec.json.encode(world.to_builtins()))
    assert World.from_builtins(data) == world


def test_depth_uses_the_shallowest_recipe():
    world = World(
        ["log", "ore"],
        [
            Recipe("plank", 1, {"log": 1}),
            Recipe("gear", 1, {"plank": 1}),
            Recipe("gear", 1, {"ore": 2}),
        ],
    )
    assert world.depth("log") == 0
    assert world.depth("plank") == 1
    assert world.depth("gear") == 1
    assert len(world.recipes_for("gear")) == 2
    assert world.items == ("log", "ore", "gear", "plank")


@pytest.mark.parametrize(
    ("base", "recipes", "message"),
    [
        (["a"], [Recipe("b", 1, {"c": 1})], "unknown item 'c'"),
        (["a"], [Recipe("a", 1, {"a": 1})], "is a base item"),
        (["a"], [Recipe("b", 1, {"c": 1}), Recipe("c", 1, {"b": 1})], "cyclic"),
        (["a"], [Recipe("b", 0, {"a": 1})], "counts must be positive"),
        (["a", "a"], [], "distinct"),
    ],
)
def test_malformed_worlds_are_refused(base, recipes, message):
    with pytest.raises(RecipeError, match=message):
        World(base, recipes)


def test_bad_settings_and_requests_are_refused():
    with pytest.raises(RecipeError, match="alt_recipe_prob"):
        WorldSettings(alt_recipe_prob=2.0)
    with pytest.raises(RecipeError, match="depth must be at least 1"):
        generate_world(0, 0)
    with pytest.raises(RecipeError, match="world too large"):
        generate_world(0, 300, WorldSettings(width=3))
    with pytest.raises(RecipeError, match="unknown item"):
        generate_world(0, 2).depth("nothing")
    with pytest.raises(RecipeError, match="bad world"):
        World.from_builtins({"base_items": "log"})


def test_find_item_reads_names_and_counts_from_text():
    world = World(
        ["iron ore"],
        [Recipe("iron gear", 1, {"iron ore": 1}), Recipe("iron gear box", 1, {"iron gear": 2})],
    )
    assert world.find_item("iron gear") == ("iron gear", None)
    assert world.find_item("Please craft 3 Iron  Gear Box for me") == ("iron gear box", 3)
    assert world.find_item("get 2 x iron gear") == ("iron gear", 2)
    assert world.find_item("a wooden sword") is None


def test_craft_is_atomic_and_explains_what_is_missing():
    inventory = Inventory({"log": 1, "ore": 5})
    rules = [({"log": 2, "ore": 1}, 2)]
    with pytest.raises(CraftError, match=r"Cannot craft 3 plank: missing 3 more log \(need 4\)"):
        craft(inventory, "plank", 3, rules)
    assert inventory.snapshot() == {"log": 1, "ore": 5}  # nothing consumed
    inventory.exchange({}, {"log": 3})
    message = craft(inventory, "plank", 3, rules)
    assert "Crafted 4 plank (one craft makes 2)" in message
    assert inventory.snapshot() == {"ore": 3, "plank": 4}


def test_craft_falls_back_to_a_recipe_that_fits():
    inventory = Inventory({"ore": 2})
    rules = [({"log": 1}, 1), ({"ore": 2}, 1)]
    assert "from 2 ore" in craft(inventory, "gear", 1, rules)
    with pytest.raises(CraftError, match="any of its 2 recipes: recipe 1 needs 1 more log"):
        craft(inventory, "gear", 1, rules)


@pytest.mark.parametrize("count", [0, -1, 1.5, True])
def test_counts_must_be_positive_whole_numbers(count):
    with pytest.raises(CraftError, match="positive whole number"):
        fetch(Inventory(), "log", count, ["log"])

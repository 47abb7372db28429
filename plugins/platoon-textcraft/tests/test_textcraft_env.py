import anyio
import pytest
from platoon_textcraft.env import TextCraft, TextCraftSynth, shared_inventory
from platoon_textcraft.recipes import Recipe, World, solve
from platoon_textcraft.tasks import TaskError, TaskIndexError, make_task

pytestmark = pytest.mark.anyio

# A hand-written world: 2 log -> 4 plank; 1 plank + 1 ore -> 1 gear (or 3 ore -> 1 gear);
# 2 gear + 1 plank -> 1 engine.
WORLD = World(
    ["log", "ore"],
    [
        Recipe("plank", 4, {"log": 2}),
        Recipe("gear", 1, {"plank": 1, "ore": 1}),
        Recipe("gear", 1, {"ore": 3}),
        Recipe("engine", 1, {"gear": 2, "plank": 1}),
    ],
).to_builtins()


def make_env(target="engine", count=1, **spec):
    return TextCraft(task_spec={"id": "hand", "target": target, "count": count, "world": WORLD, **spec})


async def call(env, name, **args):
    result = (await env._call_tool(name, args)).root
    assert result.ok, result
    return result.output


def text(output) -> str:
    return output.blocks[0].text


async def run_plan(env, plan):
    for action in plan:
        if action.op == "get":
            out = await call(env, "get_base", item=action.item, count=action.count)
        else:
            out = await call(env, "craft", target=action.item, count=action.count)
        assert not out.metadata.get("error"), text(out)


async def test_scripted_solution_earns_reward_one():
    env = make_env(count=2)
    await run_plan(env, solve(env.world, "engine", 2))
    done = await call(env, "finish")
    assert (done.reward, done.finished) == (1.0, True)
    assert "Goal reached" in text(done)


async def test_finishing_early_earns_zero_and_ends_the_episode():
    env = make_env()
    await call(env, "get_base", item="log", count=2)
    done = await call(env, "finish")
    assert (done.reward, done.finished) == (0.0, True)
    assert "holds 0 of the 1 engine" in text(done)
    refused = (await env._call_tool("craft", {"target": "plank"})).root
    assert not refused.ok and refused.reason == "episode_finished"


@pytest.mark.parametrize("split", ["train", "test-depth1", "test-depth4"])
async def test_generated_tasks_are_solvable(split):
    for index in range(10):
        env = TextCraft(task_spec=await TextCraft.get_task(split, index))
        await run_plan(env, solve(env.world, env.target, env.count))
        assert env.grade() == 1.0
        assert (await call(env, "finish")).reward == 1.0


async def test_tools_and_their_errors():
    env = make_env()
    out = await call(env, "get_info", item="gear")
    assert text(out) == "gear is crafted (2 recipes):\n- 1 plank + 1 ore -> 1 gear\n- 3 ore -> 1 gear"
    assert text(await call(env, "get_info", item="log")) == "log is a base item: fetch it with get_base."
    assert text(await call(env, "get_info", item="gaer")) == "Unknown item 'gaer'. Did you mean 'gear'?"
    assert text(await call(env, "inventory")) == "The inventory is empty."

    missing = await call(env, "craft", target="engine")
    assert missing.metadata == {"error": True}
    assert text(missing) == "Cannot craft 1 engine: missing 2 more gear (need 2), 1 more plank (need 1)."
    assert "base item" in text(await call(env, "craft", target="log"))
    assert "not a base item" in text(await call(env, "get_base", item="plank"))
    assert "Unknown item" in text(await call(env, "get_base", item="stick"))

    got = await call(env, "get_base", item="log", count=3)
    assert text(got) == "Got 3 log; you now have 3 log."
    assert got.metadata == {"inventory": {"log": 3}}
    made = await call(env, "craft", target="plank", count=1)
    assert text(made) == "Crafted 4 plank (one craft makes 4) from 2 log; you now have 4 plank."
    assert text(await call(env, "inventory")) == "Inventory: 1 log, 4 plank."

    bad = (await env._call_tool("get_base", {"item": "log", "count": 0})).root
    assert not bad.ok and bad.reason == "input_validation"
    unknown = (await env._call_tool("smelt", {})).root
    assert not unknown.ok and unknown.reason == "not_found"


async def test_tool_list_and_prompt():
    tools = TextCraft.list_tools()
    assert sorted(t.name for t in tools.tools) == ["craft", "finish", "get_base", "get_info", "inventory"]
    schema = next(t for t in tools.tools if t.name == "craft").input_schema
    assert schema["required"] == ["target"] and schema["properties"]["count"]["minimum"] == 1
    prompt = make_env(count=2, inventory={"ore": 1}).get_prompt()[0].text
    assert prompt.startswith("Craft 2 engine.")
    assert "Base items: log, ore." in prompt and "Inventory: 1 ore." in prompt


async def test_forked_sessions_share_the_inventory_and_are_graded_on_their_own_target():
    parent = make_env()
    child = parent.fork("gear", count=2)
    assert child.stock is parent.stock and child.inventory_key == parent.inventory_key
    assert child.get_prompt()[0].text.startswith(
        "You are a subagent. The agents above you are crafting: 1 engine.\nYour own goal: craft 2 gear."
    )
    await call(child, "get_base", item="ore", count=6)
    await call(child, "craft", target="gear", count=2)
    assert parent.stock.count("gear") == 2  # the parent sees the child's work
    assert (await call(child, "finish")).reward == 1.0
    assert parent.grade() == 0.0  # the child finished its own episode, not the parent's
    await call(parent, "get_base", item="log", count=2)
    await call(parent, "craft", target="plank")
    await call(parent, "craft", target="engine")
    assert (await call(parent, "finish")).reward == 1.0
    assert child.grade() == 0.0  # the parent used the gears up


async def test_grandchild_and_concurrent_crafting_on_one_inventory():
    parent = make_env()
    child = parent.fork("craft 2 gear")
    grandchild = child.fork("plank")
    assert grandchild.spec.parent_targets == ["1 engine", "2 gear"]
    assert (child.target, child.count) == ("gear", 2)
    await call(parent, "get_base", item="ore", count=300)

    async def gears(env):
        for _ in range(50):
            await call(env, "craft", target="gear")

    async with anyio.create_task_group() as tg:
        for env in (parent, child, grandchild):
            tg.start_soon(gears, env)
    assert parent.stock.snapshot() == {"gear": 100}  # 300 ore, 3 each, no lost updates


async def test_copy_and_fresh_forks_do_not_share():
    parent = make_env(inventory={"ore": 1})
    await call(parent, "get_base", item="log", count=2)
    copy = parent.fork("plank", mode="copy")
    fresh = parent.fork("plank", mode="fresh")
    assert copy.stock.snapshot() == {"log": 2, "ore": 1}
    assert fresh.stock.snapshot() == {"ore": 1}
    await call(copy, "craft", target="plank")
    assert parent.stock.snapshot() == {"log": 2, "ore": 1}
    assert "shared" not in copy.get_prompt()[0].text


async def test_task_spec_key_reaches_a_live_inventory_across_sessions():
    parent = make_env()
    # What an env server does when a program creates the child from a task spec alone.
    child = TextCraft(task_spec=parent.child_task_spec("gear"))
    assert child.stock is parent.stock
    assert shared_inventory(parent.inventory_key) is parent.stock
    named = make_env(shared_inventory_key="team-1", inventory={"log": 5})
    again = make_env(target="gear", shared_inventory_key="team-1", inventory={"ore": 9})
    assert again.stock is named.stock and named.stock.snapshot() == {"log": 5}


async def test_bad_task_specs_and_forks_raise_task_error():
    with pytest.raises(TaskError, match="exactly one of 'generator' and 'world'"):
        TextCraft(task_spec={"target": "engine"})
    with pytest.raises(TaskError, match="bad TextCraft task_spec"):
        TextCraft(task_spec={"target": 3, "world": WORLD})
    with pytest.raises(TaskError, match="unknown item 'rocket'"):
        make_env(target="rocket")
    with pytest.raises(TaskError, match="bad TextCraft world"):
        TextCraft(task_spec={"target": "x", "world": {"base_items": ["x"], "recipes": "no"}})
    with pytest.raises(TaskError, match="names no item"):
        make_env().fork("a rocket")
    with pytest.raises(TaskError, match="mode must be"):
        make_env().fork("gear", mode="borrow")


async def test_splits_and_tasks_are_deterministic():
    names = [s.name for s in TextCraft.list_splits()]
    assert names[:2] == ["train", "test"] and "test-depth4" in names and "test-depth5" not in names
    assert {s.type for s in TextCraft.list_splits()} == {"train", "test"}
    first = await TextCraft.get_task("train", 3)
    assert first == make_task("train", 3, TextCraft.settings)
    assert first != await TextCraft.get_task("test", 3)
    assert await TextCraft.num_tasks("test-depth2") == TextCraft.settings.test_size
    assert await TextCraft.get_task_range("test", 2, 5) == [
        await TextCraft.get_task("test", i) for i in (2, 3, 4)
    ]
    for index in range(20):
        task = await TextCraft.get_task("test-depth3", index)
        env = TextCraft(task_spec=task)
        assert task["depth"] == env.world.depth(env.target) == 3
    depths = {(await TextCraft.get_task("train", i))["depth"] for i in range(60)}
    assert depths == {1, 2, 3, 4}
    with pytest.raises(TaskIndexError):
        await TextCraft.get_task("test", TextCraft.settings.test_size)
    with pytest.raises(TaskError, match="unknown TextCraft split 'valid'"):
        await TextCraft.get_task("valid", 0)


async def test_variants_have_their_own_settings_and_caches():
    assert "test-depth8" in [s.name for s in TextCraftSynth.list_splits()]
    assert "test-depth8" not in [s.name for s in TextCraft.list_splits()]
    small = TextCraft.variant("SmallCraft", seed=5, train_size=3, max_depth=2, world={"width": 2})
    assert small.name() == "SmallCraft" and small.settings.world.width == 2
    assert len(await small._list_tasks_cached("train")) == 3
    assert len(await TextCraft._list_tasks_cached("test-depth1")) == TextCraft.settings.test_size
    assert (await small.get_task("train", 0)) != (await TextCraft.get_task("train", 0))
    wide = TextCraftSynth.variant("WideSynth", world={"width": 5})
    assert (wide.settings.world.width, wide.settings.world.num_base, wide.settings.max_depth) == (5, 8, 8)
    for bad, message in [
        ({"max_depth": 0}, "min_depth"),
        ({"colour": 1}, "unknown field"),
        ({"world": {"width": 0}}, "width"),
    ]:
        with pytest.raises(TaskError, match=message):
            TextCraft.variant("Bad", **bad)
    synth = TextCraftSynth(task_spec=await TextCraftSynth.get_task("test-depth8", 0))
    assert synth.world.depth(synth.target) == 8 and len(synth.world.base_items) == 8

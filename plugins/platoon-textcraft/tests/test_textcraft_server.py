"""TextCraft behind the openreward SDK's own server, driven by the SDK's client over loopback."""

import socket
import threading
import time

import pytest
import uvicorn
from openreward import AsyncOpenReward
from openreward.api.environments.types import Task
from openreward.environments import Server
from platoon_textcraft.env import TextCraft
from platoon_textcraft.recipes import Recipe, World

pytestmark = pytest.mark.anyio

WORLD = World(
    ["log", "ore"], [Recipe("plank", 4, {"log": 2}), Recipe("gear", 1, {"plank": 1, "ore": 1})]
).to_builtins()


@pytest.fixture(scope="module")
def base_url():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(Server([TextCraft]).app, host="127.0.0.1", port=port, log_level="error")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the ORS server did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


async def test_sessions_on_the_sdk_server_share_an_inventory_by_key(base_url):
    env = AsyncOpenReward(api_key="test").environments.get("textcraft", base_url=base_url)
    assert "test-depth3" in await env.list_splits()  # the client returns split names
    shared = {"world": WORLD, "shared_inventory_key": "server-test"}
    parent = Task("textcraft", "textcraft", {"target": "gear", "count": 2, **shared}, None)
    child = Task("textcraft", "textcraft", {"target": "plank", "parent_targets": ["2 gear"], **shared}, None)
    async with env.session(task=parent) as p, env.session(task=child) as c:
        assert "Your own goal: craft 1 plank." in (await c.get_prompt())[0].text
        await c.call_tool("get_base", {"item": "log", "count": 2})
        assert (await c.call_tool("craft", {"target": "plank"})).blocks[0].text.startswith("Crafted 4 plank")
        assert (await c.call_tool("finish", {})).reward == 1.0
        await p.call_tool("get_base", {"item": "ore", "count": 2})
        await p.call_tool("craft", {"target": "gear", "count": 2})  # from the child's planks
        done = await p.call_tool("finish", {})
        assert (done.reward, done.finished) == (1.0, True)
        assert done.metadata["inventory"] == {"gear": 2, "plank": 2}


async def test_generated_task_by_split_and_index(base_url):
    env = AsyncOpenReward(api_key="test").environments.get("textcraft", base_url=base_url)
    async with env.session(split="test-depth1", index=0) as session:
        tools = await session.list_tools()
        assert {t.name for t in tools} == {"craft", "finish", "get_base", "get_info", "inventory"}
        early = await session.call_tool("finish", {})
        assert (early.reward, early.finished) == (0.0, True)

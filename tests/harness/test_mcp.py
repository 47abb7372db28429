"""The tool plane: an episode's env tools over MCP (streamable HTTP), through the `mcp` client."""

from __future__ import annotations

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from platoon.bus import Bus
from platoon.bus.events import TaskRef, ToolCalled, ToolReturned, ToolSpec
from platoon.harness import AgentContext, Budget
from platoon.harness.mcp import serve_tools

pytestmark = pytest.mark.anyio

SCHEMA = {"type": "object", "properties": {"number": {"type": "integer"}}, "required": ["number"]}
TOOLS = [
    ToolSpec(name="guess", description="Guess the number.", input_schema=SCHEMA),
    ToolSpec(name="give_up"),
]


async def env(bus: Bus, calls: list[ToolCalled]) -> None:
    """An environment whose secret is 7."""

    async def answer(call: ToolCalled) -> None:
        calls.append(call)
        number = call.arguments.get("number")
        reply = dict(
            reply_to=call.request_id, episode_id=call.episode_id, agent_id=call.agent_id, name=call.name
        )
        if call.name != "guess":
            await bus.publish(ToolReturned(**reply, error=f"no tool {call.name}"))
        elif not isinstance(number, int):
            await bus.publish(ToolReturned(**reply, error="number must be an integer"))
        elif number == 7:
            await bus.publish(ToolReturned(**reply, output="Correct!", reward=1.0, finished=True))
        else:
            await bus.publish(ToolReturned(**reply, output="higher" if number < 7 else "lower", reward=0.0))

    bus.subscribe(ToolCalled, answer)


def context(bus: Bus) -> AgentContext:
    return AgentContext(
        bus=bus,
        task=TaskRef(env="guess", split="train", task_id="0"),
        episode_id="ep",
        agent_id="ep/root",
        instruction="Guess.",
        tools=TOOLS,
        budget=Budget(None),
        request_timeout=5,
    )


async def test_an_mcp_client_lists_and_calls_the_env_tools():
    calls: list[ToolCalled] = []
    async with Bus() as bus:
        await env(bus, calls)
        async with serve_tools(context(bus)) as url:
            assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")
            async with streamable_http_client(url) as (read, write, _), ClientSession(read, write) as session:
                await session.initialize()
                listed = await session.list_tools()
                low = await session.call_tool("guess", {"number": 3})
                bad = await session.call_tool("guess", {"number": "three"})
                unknown = await session.call_tool("jump", {})
                right = await session.call_tool("guess", {"number": 7})

    assert [(t.name, t.description, t.inputSchema) for t in listed.tools] == [
        ("guess", "Guess the number.", SCHEMA),
        ("give_up", "", {"type": "object", "properties": {}}),
    ]
    assert (low.content[0].text, low.isError, low.meta) == (
        "higher",
        False,
        {"platoon/finished": False, "platoon/reward": 0.0},
    )
    assert (bad.content[0].text, bad.isError) == ("Error: number must be an integer", True)
    assert (unknown.content[0].text, unknown.isError) == ("Error: no tool jump", True)
    assert (right.content[0].text, right.meta) == (
        "Correct!",
        {"platoon/finished": True, "platoon/reward": 1.0},
    )
    # Every call went through the agent's context, so the env saw whose it was.
    assert [(c.agent_id, c.name, c.arguments) for c in calls] == [
        ("ep/root", "guess", {"number": 3}),
        ("ep/root", "guess", {"number": "three"}),
        ("ep/root", "jump", {}),
        ("ep/root", "guess", {"number": 7}),
    ]


async def test_only_the_secret_path_serves_and_the_server_stops():
    async with Bus() as bus:
        async with serve_tools(context(bus)) as url:
            base = url.rsplit("/", 2)[0]
            async with httpx.AsyncClient() as client:
                guessed = await client.post(f"{base}/mcp", json={})
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.ConnectError):
                await client.post(url, json={})
    assert guessed.status_code == 404

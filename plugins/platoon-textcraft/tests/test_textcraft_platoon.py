"""TextCraft under platoon: the recursive program, `platoon-react` and a scripted policy that
delegates the sub-targets of its plan to subagents crafting from the parent's inventory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from platoon_textcraft.env import TextCraft
from platoon_textcraft.recipes import solve
from platoon_textcraft.tasks import TaskSpec, make_task

from platoon.bus import Bus, running
from platoon.bus.events import (
    AgentFinished,
    AgentSpawned,
    EpisodeGraded,
    EpisodeRequested,
    Event,
    TaskRef,
    ToolCalled,
    new_id,
)
from platoon.config import load_config
from platoon.config.schema import AgentsConfig
from platoon.envs import build_env_service
from platoon.gateway import Gateway, GatewayPolicy, GatewaySettings
from platoon.gateway.renderers import get_renderer
from platoon.programs import EntrySettings, EpisodeRunner, Grader
from platoon.testing.policies import ScriptedSamplerFactory
from platoon.testing.tokenizers import toy_tokenizer

pytestmark = pytest.mark.anyio

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SPLIT, INDEX = "test-depth2", 1  # birch valve: two intermediate items, each a subagent's target


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def delegating_policy(spec: dict[str, Any]):
    """The root fetches every base item of the plan, gives each intermediate craft to a
    subagent (`craft N item`), crafts the target and finishes; a subagent crafts its item."""
    world = TaskSpec.parse(spec).build_world()
    plan = solve(world, spec["target"], spec["count"])
    *subtargets, last = [a for a in plan if a.op == "craft"]
    root_steps = [call("get_base", item=a.item, count=a.count) for a in plan if a.op == "get"]
    root_steps += [call("spawn_subagent", instruction=f"craft {a.count} {a.item}") for a in subtargets]
    root_steps += [call("craft", target=last.item, count=last.count), call("finish")]

    def policy(messages: list[dict[str, Any]]) -> str:
        instruction = next(m["content"] for m in messages if m["role"] == "user")
        turn = sum(1 for m in messages if m["role"] == "assistant")
        if instruction.startswith("Craft "):
            return root_steps[turn] if turn < len(root_steps) else "done"
        # A subagent's instruction is the environment's prompt for its subtask.
        goal = instruction.split("Your own goal: craft ", 1)[1].split(".\n", 1)[0]
        count, item = goal.split(" ", 1)
        return call("craft", target=item, count=int(count)) if turn == 0 else f"crafted {item}"

    return policy, len(subtargets)


async def play(agents: dict[str, Any], **service: Any) -> list[Event]:
    spec = make_task(SPLIT, INDEX, TextCraft.settings)
    policy, _ = delegating_policy(spec)
    tokenizer = toy_tokenizer()
    entry = EntrySettings(
        name="textcraft",
        harness="platoon-react",
        program="recursive",
        agents=AgentsConfig(**agents),
        max_steps=30,
    )
    components = [
        build_env_service("textcraft", **service),
        Gateway(
            GatewayPolicy(
                get_renderer("qwen3_instruct", tokenizer), ScriptedSamplerFactory(tokenizer, policy)
            ),
            GatewaySettings(serve_http=False),
        ),
        EpisodeRunner([entry], request_timeout=30),
        Grader(),
    ]
    episode_id = new_id()
    events: list[Event] = []
    async with Bus() as bus, running(bus, components), bus.stream(Event) as stream:
        task = TaskRef(env="textcraft", split=SPLIT, task_id=spec["id"], index=INDEX)
        await bus.publish(EpisodeRequested(episode_id=episode_id, group_id=new_id(), task=task))
        async for event in stream:
            if getattr(event, "episode_id", None) == episode_id:
                events.append(event)
            if isinstance(event, EpisodeGraded) and event.episode_id == episode_id:
                break
    return events


async def test_subagents_craft_sub_targets_from_the_shared_inventory():
    events = await play(
        {"max_depth": 1, "fork": "shared", "child_reward": "own"},
        service="python://platoon_textcraft.env:TextCraft",
    )
    spawned = [e for e in events if isinstance(e, AgentSpawned)]
    root, children = spawned[0], spawned[1:]
    assert len(children) == 2 and {c.parent_id for c in children} == {root.agent_id}
    # The root fetched every base item; the children only crafted, from that inventory.
    calls = [e for e in events if isinstance(e, ToolCalled)]
    assert {e.name for e in calls if e.agent_id == root.agent_id} == {
        "get_base",
        "spawn_subagent",
        "craft",
        "finish",
    }
    for child in children:
        assert [e.name for e in calls if e.agent_id == child.agent_id] == ["craft"]
    # Each child is graded on its own target, the episode on the task's.
    own = {e.agent_id: e.reward for e in events if isinstance(e, AgentFinished)}
    assert [own[c.agent_id] for c in children] == [1.0, 1.0]
    assert next(e for e in events if isinstance(e, EpisodeGraded)).reward == 1.0


async def test_fresh_subagents_have_nothing_to_craft_from():
    events = await play({"max_depth": 1, "fork": "fresh", "child_reward": "own"}, env="platoon-textcraft")
    children = [e for e in events if isinstance(e, AgentSpawned)][1:]
    own = {e.agent_id: e.reward for e in events if isinstance(e, AgentFinished)}
    assert [own[c.agent_id] for c in children] == [0.0, 0.0]
    assert next(e for e in events if isinstance(e, EpisodeGraded)).reward == 0.0


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_the_ready_configs_load(name):
    config = load_config(CONFIGS / name)
    assert config.environments
    assert all(e.env in ("platoon-textcraft", "textcraft-synth") for e in config.environments)

"""Which policy plays each agent of a recursive episode (RFC 0001): the runner and the program
choose by depth, harness or role, the gateway samples that policy, and an agent no policy is
mapped for is refused with the reason, never played by another policy."""

from __future__ import annotations

from typing import Any

import pytest
from tree_helpers import Notes, Tree

from platoon import harness
from platoon.bus import Bus, running
from platoon.bus.events import AgentSpawned, EpisodeFinished, ModelCallFinished
from platoon.config.schema import AgentsConfig, PolicyChoice
from platoon.envs.ors import OrsBackend
from platoon.envs.service import EnvService
from platoon.gateway import Gateway, GatewayPolicy, GatewaySettings
from platoon.gateway.renderers import get_renderer
from platoon.harness import AgentContext, AgentResult
from platoon.programs import EntrySettings, EpisodeRunner, Grader
from platoon.testing.policies import ScriptedSamplerFactory

pytestmark = pytest.mark.anyio


@harness("policy-test-lead")
async def lead(ctx: AgentContext) -> AgentResult:
    """Says something, then opens a child per role it is given and reports how each ended."""
    said = (await ctx.chat([{"role": "user", "content": "lead"}])).text
    ended = []
    for role in ("executor", "stranger"):
        result = await ctx.spawn(f"help as {role}", harness="policy-test-helper", role=role)
        ended.append(result.final_message or result.reason or "")
    return AgentResult("completed", final_message=" | ".join([said, *ended]))


@harness("policy-test-helper")
async def helper(ctx: AgentContext) -> AgentResult:
    return AgentResult(
        "completed", final_message=(await ctx.chat([{"role": "user", "content": "help"}])).text
    )


def of(events, kind):
    return [e for e in events if isinstance(e, kind)]


async def play(tokenizer: Any, choice: PolicyChoice, *, default: str = "planner") -> list[Any]:
    def policy(name: str) -> GatewayPolicy:
        return GatewayPolicy(
            get_renderer("qwen3_instruct", tokenizer), ScriptedSamplerFactory(tokenizer, lambda m, n=name: n)
        )

    entry = EntrySettings(
        name="notes",
        harness="policy-test-lead",
        program="recursive",
        agents=AgentsConfig(max_depth=1, policy=choice),
        max_steps=10,
        default_policy=default,
    )
    components = [
        EnvService("notes", OrsBackend(Notes), tool_timeout=10),
        Gateway(
            {
                "planner": GatewayPolicy(
                    get_renderer("qwen3_instruct", tokenizer),
                    ScriptedSamplerFactory(tokenizer, lambda m: "planner"),
                ),
                "executor": policy("executor"),
            },
            GatewaySettings(serve_http=False),
        ),
        EpisodeRunner([entry], request_timeout=30),
        Grader(),
    ]
    async with Bus() as bus, running(bus, components):
        return await Tree(bus).play()


async def test_roles_choose_the_policy_and_an_unknown_role_is_refused(toy_tokenizer):
    events = await play(
        toy_tokenizer, PolicyChoice(by="role", map={"root": "planner", "executor": "executor"})
    )
    spawned = {e.agent_id: e for e in of(events, AgentSpawned)}
    assert sorted((e.depth, e.policy) for e in spawned.values()) == [(0, "planner"), (1, "executor")]
    calls = of(events, ModelCallFinished)
    assert [(c.policy, c.completion_text) for c in calls] == [
        ("planner", "planner"),
        ("executor", "executor"),
    ]
    assert all(c.policy == spawned[c.agent_id].policy for c in calls)
    [finished] = of(events, EpisodeFinished)
    assert finished.final_message == (
        "planner | executor | spawn failed: no policy for the agent with role 'stranger': "
        "agents.policy.map names 'root', 'executor'"
    )


async def test_depth_chooses_the_policy_of_every_agent_at_it(toy_tokenizer):
    events = await play(toy_tokenizer, PolicyChoice(by="depth", map={"0": "planner", "1": "executor"}))
    assert sorted((e.depth, e.policy) for e in of(events, AgentSpawned)) == [
        (0, "planner"),
        (1, "executor"),
        (1, "executor"),
    ]
    assert of(events, EpisodeFinished)[0].final_message == "planner | executor | executor"


async def test_a_root_no_policy_is_mapped_for_ends_its_episode_as_an_error(toy_tokenizer):
    events = await play(toy_tokenizer, PolicyChoice(by="harness", map={"policy-test-helper": "executor"}))
    [finished] = of(events, EpisodeFinished)
    assert finished.status == "error"
    assert "no policy for the agent with harness 'policy-test-lead'" in (finished.reason or "")
    assert of(events, ModelCallFinished) == []

"""Several policies at one gateway (RFC 0001): each agent is sampled from the policy it was
opened for, every call says which, updates switch only their own policy, and a policy the
gateway does not serve is refused."""

# ruff: noqa: F811
from __future__ import annotations

import anthropic
import openai
import pytest
from test_gateway import Factory, running_gateway

from platoon.bus.events import AgentOpened, AgentOpenRequested, PolicyUpdated
from platoon.gateway import GatewayPolicy
from platoon.gateway.renderers import get_renderer
from platoon.testing.policies import ScriptedSampler, ScriptedSamplerFactory
from tokenizer_fixtures import llama3_tokenizer, toy_tokenizer  # noqa: F401

pytestmark = pytest.mark.anyio


def _policies(tokenizer, *, frozen: bool = False) -> dict[str, GatewayPolicy]:
    executor = Factory(per_version=lambda v: ScriptedSampler(tokenizer, [f"executor v{v}"] * 8, version=v))
    return {
        "executor": GatewayPolicy(get_renderer("qwen3_instruct", tokenizer), executor),
        "opponent": GatewayPolicy(
            get_renderer("qwen3_instruct", tokenizer),
            ScriptedSamplerFactory(tokenizer, ["opponent"] * 8),
            frozen=True,
        ),
    }


async def test_each_agent_samples_its_own_policy_and_its_calls_say_which(toy_tokenizer):
    async with running_gateway(
        toy_tokenizer, ["planner"] * 8, policy="planner", policies=_policies(toy_tokenizer)
    ) as gw:
        planner = await gw.context("e1", "e1/root", policy="planner")
        executor = await gw.context("e1", "e1/child", policy="executor", depth=1, parent_id="e1/root")
        opponent = await gw.context("e1", "e1/rival", policy="opponent", depth=1, parent_id="e1/root")
        said = [
            (await ctx.chat([{"role": "user", "content": "go"}])).text
            for ctx in (planner, executor, opponent)
        ]
        assert said == ["planner", "executor v0", "opponent"]
        records = await gw.settled()
        assert [(r.agent_id, r.policy) for r in records] == [
            ("e1/root", "planner"),
            ("e1/child", "executor"),
            ("e1/rival", "opponent"),
        ]


async def test_an_update_switches_only_its_policy(toy_tokenizer):
    async with running_gateway(
        toy_tokenizer, ["planner"] * 8, policy="planner", policies=_policies(toy_tokenizer)
    ) as gw:
        # Agents of a step whose episodes ask for version 3: the executor's waits for its update,
        # and a frozen policy is always current whatever version the episode asks for.
        executor = await gw.context("e2", "e2/child", policy="executor", policy_version=3)
        opponent = await gw.context("e2", "e2/rival", policy="opponent", policy_version=3)
        await gw.bus.publish(PolicyUpdated(version=3, sampler_path="tinker://x/3", policy="executor"))
        await gw.bus.drained()
        assert (await executor.chat([{"role": "user", "content": "go"}])).text == "executor v3"
        assert (await opponent.chat([{"role": "user", "content": "go"}])).text == "opponent"
        assert gw.gateway.policies["planner"].sampler.version == 0
        records = await gw.settled()
        assert [(r.policy, r.policy_version) for r in records] == [("executor", 3), ("opponent", 0)]


async def test_a_policy_the_gateway_does_not_serve_is_refused_not_replaced(toy_tokenizer):
    async with running_gateway(
        toy_tokenizer, ["planner"] * 8, policy="planner", policies=_policies(toy_tokenizer)
    ) as gw:
        reply = await gw.bus.request(AgentOpenRequested(episode_id="e3", agent_id="a", policy="judge"))
        assert isinstance(reply, AgentOpened)
        assert reply.key == "" and "policy 'judge' is not served here" in (reply.error or "")
        assert "a" not in gw.gateway.by_agent


async def test_one_policy_is_the_default_and_its_calls_say_so(toy_tokenizer):
    async with running_gateway(toy_tokenizer, ["hi"]) as gw:
        ctx = await gw.context("e4")
        await ctx.chat([{"role": "user", "content": "go"}])
        [record] = await gw.settled()
        assert record.policy == "default"


async def test_agents_may_name_any_served_policys_model(toy_tokenizer):
    policies = _policies(toy_tokenizer)
    policies["executor"].model_name = "Qwen/Qwen3-1.7B"
    async with running_gateway(
        toy_tokenizer, ["planner"], policy="planner", model_name="Qwen/Qwen3-4B", policies=policies
    ) as gw:
        assert {"Qwen/Qwen3-4B", "Qwen/Qwen3-1.7B", "platoon-policy"} <= gw.gateway.model_names


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_agent_on_a_second_policy_gets_its_own_tokenizers_texts_and_counts(
    toy_tokenizer, llama3_tokenizer, anyio_backend
):
    """Logprob token texts and counted tokens over HTTP come from the agent's own policy: an agent
    of a policy whose tokenizer differs from the first policy's reads its own tokens."""
    llama = get_renderer("llama3", llama3_tokenizer)
    policies = {
        "llama": GatewayPolicy(
            llama, ScriptedSamplerFactory(llama3_tokenizer, ["Forty two."] * 4, stop_token="<|eot_id|>")
        )
    }
    messages = [{"role": "user", "content": "Guess a number."}]
    async with running_gateway(
        toy_tokenizer, ["toy"] * 4, policy="toy", policies=policies, serve_http=True
    ) as gw:
        opened = await gw.open("e5", policy="llama")
        async with openai.AsyncOpenAI(base_url=opened.base_url, api_key=opened.key, max_retries=0) as client:
            reply = await client.chat.completions.create(
                model="platoon-policy", messages=messages, logprobs=True
            )
        async with anthropic.AsyncAnthropic(
            base_url=opened.base_url.removesuffix("/v1"), api_key=opened.key, max_retries=0
        ) as claude:
            counted = await claude.messages.count_tokens(model="platoon-policy", messages=messages)
        [record] = await gw.settled()

    assert record.policy == "llama" and reply.choices[0].message.content == "Forty two."
    texts = [entry.token for entry in reply.choices[0].logprobs.content]
    assert texts == [llama3_tokenizer.decode([t]) for t in record.completion_tokens]
    assert counted.input_tokens == len(llama.render(messages)) == len(record.prompt_tokens)

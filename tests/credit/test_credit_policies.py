"""Credit per policy (RFC 0001): one policy's batch is today's exactly; with several, each
policy's datums hold only its agents' calls, with baselines, weights and normalisation of
its own.

The group: two rollouts of one task, a root (the planner) and subagents (the executor):

    A (reward 1)                  B (reward 0)
    a0  depth 0, planner          b0  depth 0, planner
    a1  depth 1, executor, own 1  b1  depth 1, executor, own 0.5
    a2  depth 1, executor, own 0
"""

import msgspec
import pytest

from platoon.credit import AgentTrace, Call, CreditConfig, Rollout, assign_credit

TOKENS = {0: 4, 1: 2}


def agent(agent_id, parent_id, depth, reward=None, policy="default"):
    completion = [depth + 10] * TOKENS[depth]
    calls = [Call(prompt_tokens=[1], completion_tokens=completion, logprobs=[-0.1] * len(completion))]
    return AgentTrace(
        agent_id=agent_id, parent_id=parent_id, depth=depth, calls=calls, reward=reward, policy=policy
    )


def group(root="default", child="default"):
    a = Rollout(
        episode_id="A",
        group_id="task",
        reward=1.0,
        agents=[
            agent("a0", None, 0, policy=root),
            agent("a1", "a0", 1, 1.0, child),
            agent("a2", "a0", 1, 0.0, child),
        ],
    )
    b = Rollout(
        episode_id="B",
        group_id="task",
        reward=0.0,
        agents=[agent("b0", None, 0, policy=root), agent("b1", "b0", 1, 0.5, child)],
    )
    return [a, b]


CONFIGS = [
    CreditConfig(),
    CreditConfig(subagent_reward="own", normalization="token_mean"),
    CreditConfig(subagent_reward="mix", depth_weighting="inverse_count", std_scaling=True),
    CreditConfig(baseline="leave_one_out", depth_weighting="discount", gamma=0.5),
]


@pytest.mark.parametrize("cfg", CONFIGS)
def test_one_policy_gets_todays_datums_and_advantages_bit_for_bit(cfg):
    today = assign_credit([group()], cfg)
    assert assign_credit([group()], cfg, policy="default") == today
    # a run whose one policy has a name of its own: the same datums, the same statistics
    named = assign_credit([group("solo", "solo")], cfg, policy="solo")
    assert msgspec.to_builtins(named) == msgspec.to_builtins(today)


def by_agent(result):
    return {d.agent_id: d for d in result.datums}


def sampled_advantages(datum):
    return {round(a, 9) for a, w in zip(datum.advantages, datum.weights, strict=True) if w}


def test_each_policy_trains_only_its_own_agents_against_its_own_baselines():
    cfg = CreditConfig(subagent_reward="own")
    planner = assign_credit([group("planner", "executor")], cfg, policy="planner")
    executor = assign_credit([group("planner", "executor")], cfg, policy="executor")
    assert set(by_agent(planner)) == {"a0", "b0"}
    assert set(by_agent(executor)) == {"a1", "a2", "b1"}
    # the planner: episode rewards 1 and 0 around their mean
    assert [sampled_advantages(by_agent(planner)[a]) for a in ("a0", "b0")] == [{0.5}, {-0.5}]
    # the executor: own grades 1, 0, 0.5 around their mean 0.5
    assert [sampled_advantages(by_agent(executor)[a]) for a in ("a1", "a2", "b1")] == [{0.5}, {-0.5}, {0.0}]
    assert planner.stats["agents"] == 2 and executor.stats["agents"] == 3
    assert planner.stats["trained_tokens"] == 8 and executor.stats["trained_tokens"] == 6
    assert "depth/1/reward_mean" not in planner.stats and executor.stats["depth/1/reward_mean"] == 0.5


def test_normalisation_is_over_each_policys_own_tokens():
    cfg = CreditConfig(normalization="token_mean")
    planner = assign_credit([group("planner", "executor")], cfg, policy="planner")
    executor = assign_credit([group("planner", "executor")], cfg, policy="executor")
    # root credit: each agent answers to its episode's advantage (+-0.5), over its policy's tokens
    assert sampled_advantages(by_agent(planner)["a0"]) == {round(0.5 / 8, 9)}
    assert sampled_advantages(by_agent(executor)["a1"]) == {round(0.5 / 6, 9)}


def test_a_group_constant_for_one_policy_is_dropped_for_it_alone():
    # the episodes tie, the executors' own grades do not: under `own` only the executor learns
    tie = [msgspec.structs.replace(r, reward=1.0) for r in group("planner", "executor")]
    cfg = CreditConfig(subagent_reward="own")
    assert assign_credit([tie], cfg, policy="planner").datums == []
    assert assign_credit([tie], cfg, policy="planner").stats["groups_removed_constant"] == 1
    assert len(assign_credit([tie], cfg, policy="executor").datums) == 3

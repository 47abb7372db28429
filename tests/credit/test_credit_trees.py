"""A 3-level agent tree under every reward mode and depth weighting, against hand-computed values.

The group (two rollouts of one task):

    A (reward 1)            B (reward 0)
    a0  depth 0, 4 tokens   b0  depth 0, 4 tokens
    a1  depth 1, own 1.0    b1  depth 1, own 0.5
    a2  depth 2, own 0.0    b2  depth 2, ungraded
    a3  depth 1, ungraded
    (subagents 2 tokens at depth 1, 1 token at depth 2)

Trained tokens by depth T = {0: 8, 1: 6, 2: 2}, 16 in all; agents n = {0: 2, 1: 3, 2: 2}.
"""

import msgspec
import pytest

from platoon.credit import (
    AgentTrace,
    Call,
    CreditConfig,
    CreditError,
    Rollout,
    assign_credit,
    depth_weights,
    get_credit_rule,
    own_reward,
    tree_advantages,
)

TOKENS = {0: 4, 1: 2, 2: 1}


def agent(agent_id, parent_id, depth, reward=None):
    completion = [depth + 10] * TOKENS[depth]
    calls = [Call(prompt_tokens=[1], completion_tokens=completion, logprobs=[-0.1] * len(completion))]
    return AgentTrace(agent_id=agent_id, parent_id=parent_id, depth=depth, calls=calls, reward=reward)


def tree_group():
    a = Rollout(
        episode_id="A",
        group_id="task",
        reward=1.0,
        agents=[
            agent("a0", None, 0),
            agent("a1", "a0", 1, 1.0),
            agent("a2", "a1", 2, 0.0),
            agent("a3", "a0", 1),
        ],
    )
    b = Rollout(
        episode_id="B",
        group_id="task",
        reward=0.0,
        agents=[agent("b0", None, 0), agent("b1", "b0", 1, 0.5), agent("b2", "b1", 2)],
    )
    return [a, b]


def advantages_by_agent(cfg):
    result = assign_credit([tree_group()], cfg)
    out = {}
    for datum in result.datums:
        [value] = {a for a, w in zip(datum.advantages, datum.weights, strict=True) if w}
        assert all(a == 0 for a, w in zip(datum.advantages, datum.weights, strict=True) if not w)
        out[datum.agent_id] = value
    return out, result.stats


def test_own_reward_falls_back_to_the_episode_reward():
    a, b = tree_group()
    assert [own_reward(a, x) for x in a.agents] == [1.0, 1.0, 0.0, 1.0]
    assert [own_reward(b, x) for x in b.agents] == [0.0, 0.5, 0.0]


def test_root_mode_gives_every_agent_its_rollouts_advantage():
    adv, _ = advantages_by_agent(CreditConfig(subagent_reward="root"))
    assert adv == {"a0": 0.5, "a1": 0.5, "a2": 0.5, "a3": 0.5, "b0": -0.5, "b1": -0.5, "b2": -0.5}


def test_own_mode_compares_subagents_at_the_same_depth():
    adv, _ = advantages_by_agent(CreditConfig(subagent_reward="own"))
    # depth 1 pool: a1 1.0, a3 1.0 (ungraded -> episode), b1 0.5; mean 5/6
    # depth 2 pool: a2 0.0, b2 0.0 (ungraded -> episode); mean 0
    assert adv == pytest.approx(
        {"a0": 0.5, "b0": -0.5, "a1": 1 / 6, "a3": 1 / 6, "b1": -1 / 3, "a2": 0, "b2": 0}
    )


def test_own_mode_with_leave_one_out():
    adv, _ = advantages_by_agent(CreditConfig(subagent_reward="own", baseline="leave_one_out"))
    # a1: 1 - mean(1, .5) = .25; b1: .5 - mean(1, 1) = -.5; roots: 1 - 0 and 0 - 1
    assert adv == pytest.approx({"a0": 1.0, "b0": -1.0, "a1": 0.25, "a3": 0.25, "b1": -0.5, "a2": 0, "b2": 0})


def test_mix_mode_blends_the_two_advantages():
    adv, _ = advantages_by_agent(CreditConfig(subagent_reward="mix", mix_alpha=0.25))
    # a1: .25 * 1/6 + .75 * .5 = 10/24; b1: .25 * -1/3 + .75 * -.5 = -11/24; a2: .75 * .5
    assert adv == pytest.approx(
        {"a0": 0.5, "b0": -0.5, "a1": 10 / 24, "a3": 10 / 24, "b1": -11 / 24, "a2": 0.375, "b2": -0.375}
    )


def test_mix_meets_root_and_own_at_the_ends():
    assert advantages_by_agent(CreditConfig(subagent_reward="mix", mix_alpha=0.0))[0] == pytest.approx(
        advantages_by_agent(CreditConfig(subagent_reward="root"))[0]
    )
    assert advantages_by_agent(CreditConfig(subagent_reward="mix", mix_alpha=1.0))[0] == pytest.approx(
        advantages_by_agent(CreditConfig(subagent_reward="own"))[0]
    )


def test_inverse_count_depth_weighting():
    adv, stats = advantages_by_agent(CreditConfig(depth_weighting="inverse_count"))
    # raw 1/n_d = 1/2, 1/3, 1/2; sum T_d/n_d = 4 + 2 + 1 = 7; w_d = raw * 16/7
    w0, w1, w2 = 8 / 7, 16 / 21, 8 / 7
    assert adv == pytest.approx(
        {
            "a0": 0.5 * w0,
            "b0": -0.5 * w0,
            "a1": 0.5 * w1,
            "a3": 0.5 * w1,
            "b1": -0.5 * w1,
            "a2": 0.5 * w2,
            "b2": -0.5 * w2,
        }
    )
    assert stats["depth/1/weight"] == pytest.approx(w1)
    assert (stats["depth/0/agents"], stats["depth/1/agents"], stats["depth/2/agents"]) == (2, 3, 2)
    # the token-weighted mean weight is 1
    assert 8 * w0 + 6 * w1 + 2 * w2 == pytest.approx(16)


def test_discount_depth_weighting():
    adv, _ = advantages_by_agent(CreditConfig(depth_weighting="discount", gamma=0.5))
    # raw 1, .5, .25; sum T_d * raw = 8 + 3 + .5 = 11.5; w_d = raw * 16/11.5
    w0, w1, w2 = 32 / 23, 16 / 23, 8 / 23
    assert adv["a0"] == pytest.approx(0.5 * w0)
    assert adv["b1"] == pytest.approx(-0.5 * w1)
    assert adv["a2"] == pytest.approx(0.5 * w2)


def test_token_mean_normalisation_divides_by_the_batch_tokens():
    adv, stats = advantages_by_agent(CreditConfig(normalization="token_mean"))
    assert stats["trained_tokens"] == 16
    assert adv["a0"] == pytest.approx(0.5 / 16)
    assert adv["b2"] == pytest.approx(-0.5 / 16)


def test_own_mode_inverse_count_and_token_mean_compose():
    adv, _ = advantages_by_agent(
        CreditConfig(subagent_reward="own", depth_weighting="inverse_count", normalization="token_mean")
    )
    assert adv["b1"] == pytest.approx(-1 / 3 * 16 / 21 / 16)
    assert adv["a0"] == pytest.approx(0.5 * 8 / 7 / 16)


def test_inverse_count_counts_agents_not_datums():
    # one agent whose context was compacted: 2 datums, still one agent at its depth
    calls = [
        Call(prompt_tokens=[1], completion_tokens=[2], logprobs=[0.0]),
        Call(prompt_tokens=[5], completion_tokens=[6], logprobs=[0.0]),
    ]
    rollouts = [
        Rollout(
            episode_id=f"e{i}",
            group_id="g",
            reward=float(i),
            agents=[
                AgentTrace(agent_id="r", parent_id=None, depth=0, calls=calls[:1]),
                AgentTrace(agent_id="c", parent_id="r", depth=1, calls=calls),
            ],
        )
        for i in range(2)
    ]
    result = assign_credit([rollouts], CreditConfig(depth_weighting="inverse_count"))
    assert result.stats["datums"] == 6
    assert result.stats["depth/1/agents"] == 2
    # T = {0: 2, 1: 4}, n = {0: 2, 1: 2}: equal counts, so both weights are 1
    assert result.stats["depth/0/weight"] == pytest.approx(1.0)
    assert result.stats["depth/1/weight"] == pytest.approx(1.0)


def test_depth_weights_directly():
    assert depth_weights({0: 1, 1: 4}, {0: 10, 1: 10}, method="none") == {0: 1.0, 1: 1.0}
    # raw 1, 1/4; sum T_d raw_d = 12.5; w = raw * 20/12.5
    assert depth_weights({0: 1, 1: 4}, {0: 10, 1: 10}, method="inverse_count") == pytest.approx(
        {0: 1.6, 1: 0.4}
    )
    assert depth_weights({}, {}, method="discount", gamma=0.5) == {}
    with pytest.raises(CreditError, match="unknown depth_weighting"):
        depth_weights({0: 1}, {0: 1}, method="linear")


def test_tree_advantages_with_std_scaling():
    # root pool 1, 0: std .5, so the roots get +-1; depth-1 pool 1, 1, .5: std sqrt(2)/6
    [a, b] = tree_advantages(tree_group(), get_credit_rule("mean"), mode="own", std_scaling=True, eps=1e-12)
    std1 = 2**0.5 / 6
    assert a == pytest.approx({"a0": 1.0, "a1": (1 / 6) / std1, "a2": 0.0, "a3": (1 / 6) / std1})
    assert b == pytest.approx({"b0": -1.0, "b1": (-1 / 3) / std1, "b2": 0.0})


def test_tied_episodes_still_teach_subagents_under_own():
    a, b = tree_group()
    b = msgspec.structs.replace(b, reward=1.0)
    assert assign_credit([[a, b]], CreditConfig(subagent_reward="root")).stats["groups_removed_constant"] == 1
    result = assign_credit([[a, b]], CreditConfig(subagent_reward="own"))
    assert result.stats["groups_kept"] == 1
    by_agent = {d.agent_id: d.advantages[-1] for d in result.datums}
    # depth 1: a1 1, a3 1, b1 .5 -> mean 5/6; depth 2: a2 0, b2 1 (ungraded -> episode 1)
    assert by_agent == pytest.approx(
        {"a0": 0, "b0": 0, "a1": 1 / 6, "a3": 1 / 6, "b1": -1 / 3, "a2": -0.5, "b2": 0.5}
    )


def test_malformed_trees_are_refused():
    def rollout(*agents, reward=1.0):
        return Rollout(episode_id="e", group_id="g", reward=reward, agents=list(agents))

    with pytest.raises(CreditError, match="agent 'c' has depth 2, expected 1"):
        assign_credit([[rollout(agent("r", None, 0), agent("c", "r", 2))]])
    with pytest.raises(CreditError, match="unknown parent 'x'"):
        assign_credit([[rollout(agent("r", None, 0), agent("c", "x", 1))]])
    with pytest.raises(CreditError, match="two agents with id 'r'"):
        assign_credit([[rollout(agent("r", None, 0), agent("r", None, 0))]])
    with pytest.raises(CreditError, match="non-finite reward"):
        assign_credit([[rollout(agent("r", None, 0), reward=float("nan"))]])


def test_the_stats_give_each_depths_mean_own_reward():
    _, stats = advantages_by_agent(CreditConfig(subagent_reward="own"))
    # depth 1: a1 1.0, a3 ungraded (its episode's 1.0), b1 0.5; depth 2: a2 0.0, b2 ungraded (0.0)
    assert stats["depth/0/reward_mean"] == 0.5
    assert stats["depth/1/reward_mean"] == pytest.approx(2.5 / 3)
    assert stats["depth/2/reward_mean"] == 0.0

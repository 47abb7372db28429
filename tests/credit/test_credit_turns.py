"""Per-turn credit: returns from turn rewards (the rest of the episode's reward on the last
turn), baselines per turn of the group, each call's tokens carrying its own advantage."""

import pytest

from platoon.credit import (
    AgentTrace,
    Call,
    CreditConfig,
    CreditError,
    Rollout,
    assign_credit,
    merge_calls,
    turn_returns,
)


def calls(n, *, tokens=2, judge_after=None):
    out, prompt = [], [1, 2]
    for k in range(n):
        completion = [10 + k] * tokens
        out.append(Call(prompt_tokens=list(prompt), completion_tokens=completion, logprobs=[-0.5] * tokens))
        prompt = prompt + completion + [3]  # each call extends the last: one datum
        if judge_after == k:
            out.append(Call(prompt_tokens=[9], completion_tokens=[8], logprobs=[-1.0], kind="judge"))
    return out


def rollout(episode_id, reward, turn_rewards, *, n=None, child=False):
    n = len(turn_rewards) if n is None else n
    agents = [AgentTrace(agent_id="root", parent_id=None, depth=0, calls=calls(n), turn_rewards=turn_rewards)]
    if child:
        agents.append(AgentTrace(agent_id="kid", parent_id="root", depth=1, calls=calls(1)))
    return Rollout(episode_id=episode_id, group_id="g", reward=reward, agents=agents)


def test_returns_discount_and_the_rest_of_the_reward_goes_to_the_last_turn():
    assert turn_returns(rollout("a", 1.0, [0.25, 0.25, 0.25])) == pytest.approx([1.0, 0.75, 0.5])
    assert turn_returns(rollout("a", 1.0, [0.25, 0.25, 0.25]), 0.0) == pytest.approx([0.25, 0.25, 0.5])
    assert turn_returns(rollout("a", 1.0, [0.0, 1.0, 0.0]), 0.5) == pytest.approx([0.5, 1.0, 0.0])
    # no turn rewards: the outcome on the last turn, discounted back
    assert turn_returns(rollout("a", 2.0, [], n=3), 0.5) == pytest.approx([0.5, 1.0, 2.0])
    assert turn_returns(Rollout(episode_id="x", group_id="g", reward=1.0, agents=[])) == []


def by_call(result, episode_id):
    """The advantage of each call's sampled tokens, in order, from the root's datum."""
    (datum,) = [d for d in result.datums if d.episode_id == episode_id and d.agent_id == "root"]
    return [a for a, w in zip(datum.advantages, datum.weights, strict=True) if w][1::2]


def test_each_turn_is_compared_with_the_group_at_the_same_turn():
    group = [rollout("a", 0.5, [0.5, 0.0]), rollout("b", 0.5, [0.0, 0.5])]
    outcome = assign_credit([group], CreditConfig())
    assert outcome.datums == []  # the outcome ties: a constant group, nothing to learn
    per_turn = assign_credit([group], CreditConfig(credit="per_turn", turn_discount=0.0))
    assert by_call(per_turn, "a") == pytest.approx([0.25, -0.25])
    assert by_call(per_turn, "b") == pytest.approx([-0.25, 0.25])
    undiscounted = assign_credit([group], CreditConfig(credit="per_turn"))
    assert by_call(undiscounted, "a") == pytest.approx([0.0, -0.25])  # returns [0.5, 0] vs [0.5, 0.5]


def test_turns_only_some_rollouts_reach_pool_among_those_that_do():
    group = [rollout("a", 1.0, [0.0, 0.0, 1.0]), rollout("b", 0.0, [0.0]), rollout("c", 0.5, [0.0, 0.5])]
    result = assign_credit(
        [group], CreditConfig(credit="per_turn", turn_discount=0.0, baseline="leave_one_out")
    )
    assert by_call(result, "a") == pytest.approx([0.0, -0.5, 0.0])
    assert by_call(result, "b") == pytest.approx([0.0])
    assert by_call(result, "c") == pytest.approx([0.0, 0.5])


def test_subagents_keep_outcome_credit_and_judge_calls_never_train():
    group = [rollout("a", 1.0, [1.0], child=True), rollout("b", 0.0, [0.0], child=True)]
    result = assign_credit([group], CreditConfig(credit="per_turn"))
    kids = {
        d.episode_id: set(a for a, w in zip(d.advantages, d.weights, strict=True) if w)
        for d in result.datums
        if d.agent_id == "kid"
    }
    assert kids == {"a": {0.5}, "b": {-0.5}}
    judged = merge_calls(calls(2, judge_after=0), call_advantages=[1.0, 2.0])
    assert [a for a, w in zip(judged[0].advantages, judged[0].weights, strict=True) if w] == [
        1.0,
        1.0,
        2.0,
        2.0,
    ]
    with pytest.raises(CreditError, match="2 call advantages for 3"):
        merge_calls(calls(3), call_advantages=[1.0, 2.0])


def test_per_turn_with_std_scaling_and_token_mean():
    group = [rollout("a", 1.0, [1.0, 0.0]), rollout("b", 0.0, [0.0, 0.0])]
    result = assign_credit(
        [group],
        CreditConfig(
            credit="per_turn", turn_discount=0.0, std_scaling=True, std_eps=1e-12, normalization="token_mean"
        ),
    )
    tokens = result.stats["trained_tokens"]
    assert tokens == 8
    assert by_call(result, "a") == pytest.approx([1.0 / tokens, 0.0])


def test_bad_options():
    with pytest.raises(CreditError, match="credit must be one of"):
        CreditConfig(credit="per_step")
    with pytest.raises(CreditError, match="turn_discount"):
        CreditConfig(turn_discount=1.5)

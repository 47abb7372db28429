import pytest

from platoon.credit import (
    AgentTrace,
    Call,
    CreditConfig,
    CreditError,
    Rollout,
    assign_credit,
    get_credit_rule,
    group_advantages,
    leave_one_out_baseline,
    mean_baseline,
    register_credit_rule,
)


def test_mean_baseline():
    assert mean_baseline([1.0, 0.0, 1.0, 0.0]) == [0.5, -0.5, 0.5, -0.5]
    assert mean_baseline([3.0, 1.0, 2.0]) == [1.0, -1.0, 0.0]
    assert mean_baseline([0.7]) == [0.0]
    assert mean_baseline([]) == []


def test_leave_one_out_baseline():
    # 1 - mean(0, 1, 0) = 2/3; 0 - mean(1, 1, 0) = -2/3
    assert leave_one_out_baseline([1.0, 0.0, 1.0, 0.0]) == pytest.approx([2 / 3, -2 / 3, 2 / 3, -2 / 3])
    # 3 - 1.5, 1 - 2.5, 2 - 2
    assert leave_one_out_baseline([3.0, 1.0, 2.0]) == pytest.approx([1.5, -1.5, 0.0])
    assert leave_one_out_baseline([0.7]) == [0.0]


def test_std_scaling_divides_by_population_std():
    mean = get_credit_rule("mean")
    loo = get_credit_rule("leave_one_out")
    # rewards 1,0,1,0: population std 0.5
    assert group_advantages([1.0, 0.0, 1.0, 0.0], mean, std_scaling=True, eps=1e-12) == pytest.approx(
        [1.0, -1.0, 1.0, -1.0]
    )
    assert group_advantages([1.0, 0.0, 1.0, 0.0], loo, std_scaling=True, eps=1e-12) == pytest.approx(
        [4 / 3, -4 / 3, 4 / 3, -4 / 3]
    )
    # rewards 3,1,2: std sqrt(2/3)
    assert group_advantages([3.0, 1.0, 2.0], mean, std_scaling=True, eps=0.0) == pytest.approx(
        [1.5**0.5, -(1.5**0.5), 0.0]
    )
    # the eps keeps a tied group finite and at zero
    assert group_advantages([2.0, 2.0], mean, std_scaling=True) == [0.0, 0.0]


def test_registry_custom_rule_is_used_by_assign_credit():
    @register_credit_rule("test-raw-reward")
    def raw(rewards):
        return list(rewards)

    assert get_credit_rule("test-raw-reward") is raw
    call = Call(prompt_tokens=[7], completion_tokens=[8], logprobs=[-0.5])
    rollouts = [
        Rollout(
            episode_id=f"e{i}",
            group_id="g",
            reward=reward,
            agents=[AgentTrace(agent_id="root", parent_id=None, depth=0, calls=[call])],
        )
        for i, reward in enumerate([0.25, 0.75])
    ]
    result = assign_credit([rollouts], CreditConfig(baseline="test-raw-reward"))
    assert [d.advantages for d in result.datums] == [[0.25], [0.75]]


def test_registry_errors():
    with pytest.raises(CreditError, match=r"unknown credit rule 'nope'.*leave_one_out"):
        get_credit_rule("nope")
    with pytest.raises(CreditError, match="already registered"):
        register_credit_rule("mean")(lambda rewards: list(rewards))
    # registering the same function again is harmless (re-imported plugins)
    assert register_credit_rule("mean")(mean_baseline) is mean_baseline


def test_a_rule_returning_the_wrong_shape_is_refused():
    with pytest.raises(CreditError, match="returned 1 advantages for 2 rewards"):
        group_advantages([1.0, 0.0], lambda rewards: [0.0])
    with pytest.raises(CreditError, match="non-finite"):
        group_advantages([1.0, 0.0], lambda rewards: [float("nan"), 0.0])

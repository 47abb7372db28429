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


def median(rewards):
    """r - median(r), for the config tests below (`module:attr` and a registered name)."""
    ordered = sorted(rewards)
    mid = len(ordered) // 2
    middle = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return [r - middle for r in rewards]


def test_a_config_selects_a_registered_rule_or_one_by_module_and_attribute(tmp_path):
    from platoon.config import validate_config

    register_credit_rule("test-median")(median)
    for baseline in ("test-median", "test_credit_baselines:median"):
        config = validate_config(
            {
                "environments": [
                    {"name": "e", "env": "platoon-number-search@1", "harness": "number-searcher"}
                ],
                "train": {
                    "model_name": "m",
                    "renderer_name": "qwen3_instruct",
                    "workflow_config": {"baseline": baseline},
                },
            },
            base_dir=tmp_path,
        )
        cfg = CreditConfig(baseline=config.train.workflow_config.baseline)
        assert get_credit_rule(cfg.baseline)([1.0, 0.0, 0.0, 0.0, 5.0]) == [1.0, 0.0, 0.0, 0.0, 5.0]


def test_an_unknown_rule_is_refused_when_the_credit_settings_are_made():
    with pytest.raises(CreditError, match=r"unknown credit rule 'test-medain'.*'test-median'"):
        register_credit_rule("test-median")(median)
        CreditConfig(baseline="test-medain")
    with pytest.raises(CreditError, match=r"credit rule 'test_credit_baselines:nope': .*'nope'"):
        CreditConfig(baseline="test_credit_baselines:nope")
    with pytest.raises(CreditError, match="not a function"):
        CreditConfig(baseline="test_credit_baselines:pytest")

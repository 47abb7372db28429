import msgspec
import pytest

from platoon.credit import AgentTrace, Call, CreditConfig, CreditError, Rollout, assign_credit


def single(episode_id, reward, tokens=2, group_id="g", version=0):
    completion = list(range(10, 10 + tokens))
    calls = [
        Call(
            prompt_tokens=[1, 2],
            completion_tokens=completion,
            logprobs=[-0.5] * tokens,
            policy_version=version,
        )
    ]
    return Rollout(
        episode_id=episode_id,
        group_id=group_id,
        reward=reward,
        agents=[AgentTrace(agent_id="root", parent_id=None, depth=0, calls=calls)],
    )


def advantages(result):
    return {d.episode_id: d.advantages[-1] for d in result.datums}


def test_one_group_mean_and_leave_one_out():
    group = [single("a", 1.0), single("b", 0.0), single("c", 1.0), single("d", 0.0)]
    assert advantages(assign_credit([group])) == {"a": 0.5, "b": -0.5, "c": 0.5, "d": -0.5}
    loo = assign_credit([group], CreditConfig(baseline="leave_one_out"))
    assert advantages(loo) == pytest.approx({"a": 2 / 3, "b": -2 / 3, "c": 2 / 3, "d": -2 / 3})
    scaled = assign_credit([group], CreditConfig(std_scaling=True, std_eps=1e-12))
    assert advantages(scaled) == pytest.approx({"a": 1.0, "b": -1.0, "c": 1.0, "d": -1.0})


def test_groups_are_centred_separately():
    g1 = [single("a", 1.0, group_id="t1"), single("b", 0.0, group_id="t1")]
    g2 = [single("c", 3.0, group_id="t2"), single("d", 1.0, group_id="t2"), single("e", 2.0, group_id="t2")]
    assert advantages(assign_credit([g1, g2])) == {"a": 0.5, "b": -0.5, "c": 1.0, "d": -1.0, "e": 0.0}


def test_a_singleton_group_under_leave_one_out_gets_zero():
    cfg = CreditConfig(baseline="leave_one_out", remove_constant_groups=False)
    assert advantages(assign_credit([[single("a", 1.0)]], cfg)) == {"a": 0.0}
    # one reward is a constant group, removed by default
    assert assign_credit([[single("a", 1.0)]]).stats["groups_removed_constant"] == 1


def test_constant_groups_removed_or_kept():
    mixed = [single("a", 1.0, group_id="m"), single("b", 0.0, group_id="m")]
    tied = [single("c", 1.0, group_id="t"), single("d", 1.0, group_id="t")]
    removed = assign_credit([mixed, tied])
    assert advantages(removed) == {"a": 0.5, "b": -0.5}
    assert (removed.stats["groups_kept"], removed.stats["groups_removed_constant"]) == (1, 1)
    kept = assign_credit([mixed, tied], CreditConfig(remove_constant_groups=False))
    assert advantages(kept) == {"a": 0.5, "b": -0.5, "c": 0.0, "d": 0.0}
    assert (kept.stats["groups_kept"], kept.stats["groups_removed_constant"]) == (2, 0)
    assert kept.stats["trained_tokens"] == 8


def test_empty_and_untrainable_groups_are_counted():
    no_calls = [
        Rollout(
            episode_id=f"x{i}",
            group_id="x",
            reward=float(i),
            agents=[AgentTrace(agent_id="root", parent_id=None, depth=0, calls=[])],
        )
        for i in range(2)
    ]
    result = assign_credit([[], no_calls, [single("a", 1.0), single("b", 0.0)]])
    assert result.stats["groups"] == 3
    assert result.stats["groups_kept"] == 1
    assert result.stats["groups_removed_empty"] == 1
    assert result.stats["groups_removed_no_datums"] == 1
    assert result.stats["datums"] == 2


def test_stats():
    group = [single("a", 1.0, tokens=3, version=2), single("b", 0.0, tokens=1, version=1), single("c", 0.5)]
    stats = assign_credit([group]).stats
    assert stats["rollouts"] == 3
    assert stats["reward_mean"] == 0.5
    assert stats["reward_std"] == pytest.approx((1 / 6) ** 0.5)
    assert stats["datums"] == 3
    assert stats["calls"] == 3
    assert stats["agents"] == 3
    assert stats["trained_tokens"] == 6
    # each sequence is 2 prompt + k sampled tokens, model_input drops the last
    assert stats["input_tokens"] == (2 + 3 - 1) + (2 + 1 - 1) + (2 + 2 - 1)
    # |adv| per trained token: 3 * .5 + 1 * .5 + 2 * 0, over 6
    assert stats["advantage_abs_mean"] == pytest.approx(2 / 6)
    assert stats["policy_version_min"] == 0
    assert stats["max_depth"] == 0
    assert all(isinstance(value, float) for value in stats.values())


def test_an_empty_batch():
    result = assign_credit([])
    assert result.datums == []
    assert result.stats["datums"] == 0
    assert result.stats["reward_mean"] == 0.0


def test_bad_batches_are_refused():
    with pytest.raises(CreditError, match="mixes group ids"):
        assign_credit([[single("a", 1.0, group_id="x"), single("b", 0.0, group_id="y")]])
    with pytest.raises(CreditError, match="episode 'a' appears twice"):
        assign_credit([[single("a", 1.0)], [single("a", 0.0)]])
    with pytest.raises(CreditError, match="unknown credit rule"):
        assign_credit([[single("a", 1.0)]], CreditConfig(baseline="median"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subagent_reward": "parent"}, "subagent_reward must be one of root, own, mix"),
        ({"depth_weighting": "linear"}, "depth_weighting must be one of"),
        ({"normalization": "mean"}, "normalization must be one of sum, token_mean"),
        ({"mix_alpha": 1.5}, r"mix_alpha must be in \[0, 1\]"),
        ({"gamma": 0.0}, r"gamma must be in \(0, 1\]"),
        ({"std_eps": 0.0}, "std_eps must be > 0"),
    ],
)
def test_config_is_checked(options, message):
    with pytest.raises(CreditError, match=message):
        CreditConfig(**options)


def test_config_from_plain_values():
    cfg = msgspec.convert(
        {
            "baseline": "leave_one_out",
            "subagent_reward": "mix",
            "mix_alpha": 0.3,
            "depth_weighting": "discount",
        },
        CreditConfig,
    )
    assert (cfg.subagent_reward, cfg.mix_alpha, cfg.depth_weighting) == ("mix", 0.3, "discount")
    with pytest.raises(msgspec.ValidationError, match="unknown field `alpha`"):
        msgspec.convert({"alpha": 0.3}, CreditConfig)
    with pytest.raises(msgspec.ValidationError, match="mix_alpha must be in"):
        msgspec.convert({"mix_alpha": 2.0}, CreditConfig)

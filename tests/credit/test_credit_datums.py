import msgspec
import numpy as np
import pytest

from platoon.credit import CreditError, Datum, filter_stale, merge_calls, to_tinker, with_advantage
from platoon.credit.traces import Call


def call(prompt, completion, version=0, kind="policy"):
    # logprob of token t is -t/10, so every expected array below is readable by eye
    return Call(
        prompt_tokens=prompt,
        completion_tokens=completion,
        logprobs=[-t / 10 for t in completion],
        policy_version=version,
        kind=kind,
    )


def test_extending_calls_merge_into_one_datum_with_exact_arrays():
    calls = [
        call([1, 2, 3], [4, 5]),
        call([1, 2, 3, 4, 5, 6, 7], [8, 9]),  # 6, 7: a tool result
    ]
    [datum] = merge_calls(calls, episode_id="e", group_id="g", agent_id="a", depth=1)
    assert datum.model_input == [1, 2, 3, 4, 5, 6, 7, 8]
    assert datum.target_tokens == [2, 3, 4, 5, 6, 7, 8, 9]
    assert datum.logprobs == [0.0, 0.0, -0.4, -0.5, 0.0, 0.0, -0.8, -0.9]
    assert datum.weights == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    assert datum.advantages == [0.0] * 8
    assert datum.num_trained_tokens == 4
    assert (datum.episode_id, datum.group_id, datum.agent_id, datum.depth) == ("e", "g", "a", 1)
    assert with_advantage(datum, 2.0).advantages == [0.0, 0.0, 2.0, 2.0, 0.0, 0.0, 2.0, 2.0]


def test_a_prompt_equal_to_the_previous_sequence_still_extends():
    [datum] = merge_calls([call([1], [2]), call([1, 2], [3])])
    assert datum.model_input == [1, 2]
    assert datum.target_tokens == [2, 3]
    assert datum.weights == [1.0, 1.0]


def test_compaction_in_the_middle_starts_a_second_datum():
    calls = [
        call([1, 2], [3]),
        call([1, 2, 3, 4], [5]),
        call([1, 20, 21], [22, 23]),  # history replaced by a summary (20, 21)
        call([1, 20, 21, 22, 23, 24], [25]),
    ]
    first, second = merge_calls(calls)
    assert first.model_input == [1, 2, 3, 4]
    assert first.target_tokens == [2, 3, 4, 5]
    assert first.weights == [0.0, 1.0, 0.0, 1.0]
    assert first.logprobs == [0.0, -0.3, 0.0, -0.5]
    assert second.model_input == [1, 20, 21, 22, 23, 24]
    assert second.target_tokens == [20, 21, 22, 23, 24, 25]
    assert second.weights == [0.0, 0.0, 1.0, 1.0, 0.0, 1.0]
    assert second.logprobs == pytest.approx([0.0, 0.0, -2.2, -2.3, 0.0, -2.5])
    assert (first.num_trained_tokens, second.num_trained_tokens) == (2, 3)


def test_a_truncated_prompt_starts_a_new_datum():
    # the harness dropped the oldest turn: the prompt no longer starts with the sequence
    first, second = merge_calls([call([1, 2], [3]), call([2, 3, 4], [5])])
    assert first.target_tokens == [2, 3]
    assert second.model_input == [2, 3, 4]
    assert second.target_tokens == [3, 4, 5]
    assert second.weights == [0.0, 0.0, 1.0]


def test_a_prompt_shorter_than_the_sequence_starts_a_new_datum():
    # a retry of the same prompt
    first, second = merge_calls([call([1, 2], [3, 4]), call([1, 2], [5])])
    assert first.target_tokens == [2, 3, 4]
    assert second.target_tokens == [2, 5]


def test_judge_calls_neither_train_nor_break_the_chain():
    calls = [
        call([1, 2], [3]),
        call([90, 91], [92], kind="judge"),
        call([1, 2, 3, 4], [5], kind="aux"),
    ]
    [datum] = merge_calls(calls)
    assert datum.model_input == [1, 2, 3, 4]
    assert datum.weights == [0.0, 1.0, 0.0, 1.0]
    assert merge_calls([call([1], [2], kind="judge")]) == []


def test_policy_version_is_the_oldest_merged_call():
    [datum] = merge_calls(
        [call([1], [2], version=4), call([1, 2], [3], version=3), call([1, 2, 3], [4], version=5)]
    )
    assert datum.policy_version == 3


def test_sequences_without_trainable_targets_yield_no_datum():
    assert merge_calls([call([1, 2], [])]) == []
    assert merge_calls([call([], [7])]) == []  # a lone first token predicts nothing
    [datum] = merge_calls([call([], [7, 8])])
    assert (datum.model_input, datum.target_tokens, datum.weights) == ([7], [8], [1.0])


def test_bad_records_are_refused():
    with pytest.raises(CreditError, match="2 completion tokens but 1 logprobs"):
        Call(prompt_tokens=[1], completion_tokens=[2, 3], logprobs=[0.0])
    with pytest.raises(CreditError, match="unknown call kind"):
        Call(prompt_tokens=[1], completion_tokens=[2], logprobs=[0.0], kind="tool")
    with pytest.raises(msgspec.ValidationError, match="kind"):
        msgspec.convert(
            {"prompt_tokens": [1], "completion_tokens": [2], "logprobs": [0.0], "kind": "tool"}, Call
        )
    with pytest.raises(ValueError, match="differ in length"):
        Datum(model_input=[1, 2], target_tokens=[2, 3], logprobs=[0.0], advantages=[0.0, 0.0], weights=[1, 1])


def test_datums_round_trip_through_msgpack():
    [datum] = merge_calls([call([1, 2], [3, 4])], episode_id="e", agent_id="a")
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(datum), type=Datum) == datum


def _datum(version):
    return Datum(
        model_input=[1],
        target_tokens=[2],
        logprobs=[-0.2],
        advantages=[1.0],
        weights=[1.0],
        policy_version=version,
    )


def test_filter_stale():
    datums = [_datum(5), _datum(4), _datum(3)]
    assert filter_stale(datums, current_version=5, max_staleness=1) == (datums[:2], 1)
    assert filter_stale(datums, current_version=5, max_staleness=0) == (datums[:1], 2)
    assert filter_stale(datums, current_version=5, max_staleness=None) == (datums, 0)
    assert filter_stale([], current_version=5, max_staleness=0) == ([], 0)
    with pytest.raises(CreditError, match="max_staleness must be >= 0"):
        filter_stale(datums, current_version=5, max_staleness=-1)


@pytest.fixture
def datum():
    [d] = merge_calls([call([1, 2, 3], [4, 5]), call([1, 2, 3, 4, 5, 6], [7])])
    return with_advantage(d, 0.5)


@pytest.mark.parametrize(
    ("loss_fn", "keys"),
    [
        ("cross_entropy", {"target_tokens", "weights"}),
        ("importance_sampling", {"target_tokens", "logprobs", "advantages"}),
        ("ppo", {"target_tokens", "logprobs", "advantages"}),
        ("cispo", {"target_tokens", "logprobs", "advantages"}),
        ("dro", {"target_tokens", "logprobs", "advantages"}),
        ("gspo", {"target_tokens", "logprobs", "advantages", "sequence_ratio_mask"}),
        ("custom", {"target_tokens", "logprobs", "advantages", "weights"}),
    ],
)
def test_to_tinker_sends_only_the_inputs_the_loss_reads(datum, loss_fn, keys):
    import tinker

    out = to_tinker(datum, loss_fn)
    assert isinstance(out, tinker.Datum)
    assert out.model_input.to_ints() == [1, 2, 3, 4, 5, 6]
    assert set(out.loss_fn_inputs) == keys
    for key, tensor in out.loss_fn_inputs.items():
        assert tensor.shape == [6]
        assert tensor.dtype == ("int64" if key == "target_tokens" else "float32")
    assert out.loss_fn_inputs["target_tokens"].tolist() == [2, 3, 4, 5, 6, 7]
    if "advantages" in keys:
        np.testing.assert_allclose(out.loss_fn_inputs["advantages"].to_numpy(), [0, 0, 0.5, 0.5, 0, 0.5])
        np.testing.assert_allclose(out.loss_fn_inputs["logprobs"].to_numpy(), [0, 0, -0.4, -0.5, 0, -0.7])
    if "weights" in keys:
        assert out.loss_fn_inputs["weights"].tolist() == [0, 0, 1, 1, 0, 1]


def test_to_tinker_refuses_unsupported_losses(datum):
    with pytest.raises(CreditError, match="unsupported loss_fn 'stable_reinforce'"):
        to_tinker(datum, "stable_reinforce")
    with pytest.raises(CreditError, match="unsupported loss_fn 'l2'"):
        to_tinker(datum, "l2")

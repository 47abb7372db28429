"""On-policy distillation's advantage: the teacher's reverse KL on the policy's own sampled
tokens only (datum by datum: prompts, tool results and other agents' tokens keep weight 0 and no
advantage), centred on the batch's mean, mixed with the task's by the weight."""

import pytest

from platoon.bus.events import Datum
from platoon.credit import CreditError, distill_advantages


def datum(logprobs, weights, advantage=1.0):
    n = len(logprobs)
    return Datum(
        model_input=list(range(n)),
        target_tokens=list(range(1, n + 1)),
        logprobs=logprobs,
        advantages=[advantage * w for w in weights],
        weights=weights,
        num_trained_tokens=int(sum(weights)),
    )


# an agent's turn, a tool result and its next turn: weights 0 on the prompt and the tool's tokens
TURNS = datum([0.0, -1.0, -0.5, 0.0, 0.0, -2.0], [0.0, 1.0, 1.0, 0.0, 0.0, 1.0])
OTHER = datum([-0.2, -0.1], [1.0, 1.0], advantage=-1.0)
TEACHER = [[-9.0, -3.0, -0.5, -7.0, -7.0, -2.5], [-0.2, None]]  # None: no divergence there
REVERSE_KL = [2.0, 0.0, 0.5, 0.0, 0.0]  # lp - teacher on the five sampled tokens, in order
MEAN = sum(REVERSE_KL) / 5


def test_the_teacher_alone_gives_each_sampled_token_minus_its_centred_reverse_kl():
    out, stats = distill_advantages([TURNS, OTHER], TEACHER, weight=1.0)
    assert stats == pytest.approx(
        {
            "distill/reverse_kl": MEAN,
            "distill/reverse_kl_max": 2.0,
            "distill/tokens": 5.0,
            "distill/weight": 1.0,
        }
    )
    assert out[0].advantages == pytest.approx([0.0, MEAN - 2.0, MEAN - 0.0, 0.0, 0.0, MEAN - 0.5])
    assert out[1].advantages == pytest.approx([MEAN - 0.0, MEAN - 0.0])
    for before, after in zip([TURNS, OTHER], out, strict=True):  # weight-0 tokens: no advantage
        assert [a for a, w in zip(after.advantages, after.weights, strict=True) if not w] == [0.0] * (
            len(before.weights) - before.num_trained_tokens
        )
        assert (after.weights, after.logprobs, after.target_tokens) == (
            before.weights,
            before.logprobs,
            before.target_tokens,
        )


def test_the_weight_mixes_the_task_advantage_with_the_teachers():
    out, _ = distill_advantages([TURNS, OTHER], TEACHER, weight=0.25, scale=0.1)
    teacher = [MEAN - 2.0, MEAN, MEAN - 0.5]
    assert out[0].advantages == pytest.approx(
        [0.0, 0.75 + 0.025 * teacher[0], 0.75 + 0.025 * teacher[1], 0.0, 0.0, 0.75 + 0.025 * teacher[2]]
    )
    assert out[1].advantages == pytest.approx([-0.75 + 0.025 * MEAN] * 2)
    task, stats = distill_advantages([TURNS], TEACHER[:1], weight=0.0)  # only the metric
    assert task[0].advantages == TURNS.advantages
    assert stats["distill/reverse_kl"] == pytest.approx(2.5 / 3)


def test_rows_that_do_not_line_up_are_refused():
    with pytest.raises(CreditError, match="1 teacher rows for 2 datums"):
        distill_advantages([TURNS, OTHER], TEACHER[:1], 1.0)
    with pytest.raises(CreditError, match="2 teacher logprobs for 6 targets"):
        distill_advantages([TURNS], [[-1.0, -1.0]], 1.0)
    with pytest.raises(CreditError, match=r"outside 0\.\.1"):
        distill_advantages([TURNS], TEACHER[:1], 1.5)

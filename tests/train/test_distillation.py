"""On-policy distillation end to end on the embedded backend: a tiny teacher trained by RL on the
vowels task (`learnable`) teaches a student from the same base model, with the teacher as its only
signal (weight 1.0: the task's reward is not used), and the student reaches the teacher's reward
while its reverse KL to the teacher falls. Every run is `train.reproducible`, so each is the same
run whatever the machine's load.

Whether the student gets there sooner than RL from the same start does not hold on every machine:
RL reaches 0.91 at step 8 on all of them, while the student's curve follows the last bits of the
arithmetic (at step 7: 0.49 to 0.97 over MKL's kernel branches; it reaches the teacher at step 7
to 9 on each), so that is measured in docs/how-to/distillation.md, not asserted here.
"""

from __future__ import annotations

import json
import time

import anyio
import pytest
from learnable import learn_config

from platoon.api import train
from platoon.config import AssemblyError, validate_config

pytestmark = pytest.mark.torch


def _train(run_dir, tiny_model, steps, **overrides) -> list[dict]:
    config = validate_config(learn_config(tiny_model, steps=steps, **overrides))
    anyio.run(lambda: train(config, run_dir=run_dir, console=False))
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _rewards(rows: list[dict]) -> list[float]:
    return [round(r["reward/mean"], 3) for r in rows]


@pytest.mark.learning
@pytest.mark.slow
def test_a_distilled_student_reaches_the_teachers_reward_as_its_divergence_falls(site, tiny_model):
    import learnable  # noqa: F401 - registers the harness

    started = time.monotonic()
    teacher = _train(site / "teacher", tiny_model, 12)  # RL, from the base model
    taught = time.monotonic()
    distill = {"teacher_path": str(site / "teacher"), "weight": 1.0}
    student = _train(site / "student", tiny_model, 9, distill=distill)
    done = time.monotonic()
    teacher_reward = sum(r["reward/mean"] for r in teacher[-3:]) / 3
    best = max(r["reward/mean"] for r in student)
    kl = [r["distill/reverse_kl"] for r in student]
    print(f"teacher reward (last 3 of 12 RL steps): {teacher_reward:.3f}; the student's best: {best:.3f}")
    print("RL (the teacher) reward by step:", _rewards(teacher))
    print("distilled student reward by step:", _rewards(student))
    print("distill/reverse_kl by step:", [round(k, 2) for k in kl])
    print(f"seconds: teacher {taught - started:.1f}, student {done - taught:.1f}")
    assert teacher_reward >= 0.9, teacher_reward
    assert all(r["distill/weight"] == 1.0 and r["distill/tokens"] > 0 for r in student)
    assert student[0]["reward/mean"] < 0.5 * teacher_reward, student[0]  # it starts as the base model
    assert best >= 0.9 * teacher_reward, (best, teacher_reward)
    assert kl[-1] < 0.25 * kl[0] and kl[-2] < kl[0], kl


@pytest.mark.slow
def test_the_base_model_teaches_its_own_samples_nothing_and_another_tokenizer_is_refused(
    site, tiny_model, qwen3_tokenizer
):
    """A student that starts as its teacher (`distill: {}`, the base model) diverges from it by
    nothing at its first step: the teacher scored the very tokens the student sampled, aligned.
    A teacher trained with another tokenizer is refused at the start, naming both."""
    import learnable  # noqa: F401 - registers the harness

    [first] = _train(site / "base", tiny_model, 1, distill={})
    assert first["distill/tokens"] > 0
    assert abs(first["distill/reverse_kl"]) < 1e-3, first
    qwen = site / "qwen3"
    qwen3_tokenizer.save_pretrained(qwen)
    with pytest.raises(
        AssemblyError, match=rf"train.distill.teacher_path: .*'{tiny_model}' and default uses '{qwen}'"
    ):
        _train(
            site / "other", tiny_model, 1, tokenizer=str(qwen), distill={"teacher_path": str(site / "base")}
        )


@pytest.mark.slow
def test_a_frozen_policy_named_as_teacher_scores_with_the_weights_it_samples(site, tiny_model):
    """`distill.teacher` names a frozen policy of `policies:` whose `model_path` is a finished
    run: its weights are copied into the embedded server the student trains on, and the teacher
    scores with them. The student's first samples are the base model's, which as its own teacher
    diverges from them by nothing (the test above); the expert's one step of RL does."""
    import learnable  # noqa: F401 - registers the harness

    _train(site / "expert", tiny_model, 1, batch_size=1, save_every=1, optimizer={"learning_rate": 0.1})
    [saved] = (site / "expert" / "tinker").glob("*/sampler_weights/ckpt-000001")
    raw = learn_config(tiny_model, steps=1, batch_size=1)
    raw["environments"][0]["agents"] = {"policy": {"by": "depth", "map": {"0": "student"}}}
    raw["policies"] = {
        "student": {"distill": {"teacher": "expert"}},
        "expert": {"frozen": True, "model_path": str(site / "expert")},
    }
    run_dir = site / "student"
    anyio.run(lambda: train(validate_config(raw), run_dir=run_dir, console=False))
    [step] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    print("student/distill/reverse_kl at step 1:", step["student/distill/reverse_kl"])
    assert (run_dir / "tinker" / saved.parent.parent.name / "sampler_weights" / saved.name).is_dir()
    assert step["student/distill/tokens"] > 0 and step["student/distill/weight"] == 1.0
    assert abs(step["student/distill/reverse_kl"]) > 0.01, step
    assert not any(key.startswith("expert/") for key in step)  # a frozen policy trains nothing

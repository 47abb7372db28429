"""What a training run tells its user on the terminal: the step line, the first step that graded
nothing, and the summary at the end."""

from __future__ import annotations

import json

import pytest

from platoon.bus.events import TrainStepFinished
from platoon.stats.metrics import HealthLimits, MetricsSettings, MetricsSink, step_line
from platoon.stats.summary import sparkline, train_summary
from platoon.train.loop import NothingGraded, _check_graded


def test_sparkline_follows_the_values():
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([0.3, 0.3]) == "▁▁"
    assert len(sparkline([i / 200 for i in range(200)], width=40)) == 40
    assert sparkline([]) == ""


def test_the_summary_reads_the_metrics(tmp_path):
    rows = [{"step": i, "reward/mean": r} for i, r in enumerate([0.2, 0.3, 0.25, 0.5, 0.9, 1.0])]
    rows.insert(2, {"step": 99})  # a step that graded nothing has no reward: it is skipped
    rows.insert(0, {"step": 0, "time": 1.0, "eval/reward_mean": 0.1})  # an evaluation is no step
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"cut')
    text = train_summary(tmp_path, 12.3)
    assert text.splitlines()[0] == "trained 7 steps in 12 s"
    assert "first 3 steps 0.250, last 3 steps 0.800  (0.20 → 1.00)" in text
    assert f"run     {tmp_path}" in text
    assert "no step was graded" in train_summary(tmp_path / "nowhere")
    (tmp_path / "evals").mkdir()
    for step, mean in ((0, 0.1), (5, 0.4), (10, 0.7)):
        report = {"reward_mean": mean, "pass_at_k": {"1": mean / 2}}
        (tmp_path / "evals" / f"step-{step:06d}.json").write_text(json.dumps(report))
    text = train_summary(tmp_path)
    assert "eval    step 0: reward 0.100, pass@1 0.050" in text
    assert "eval    step 10: reward 0.700, pass@1 0.350" in text and "step 5:" not in text
    assert "eval    ▁▅█  0.10 at step 0 → 0.70 at step 10  (3 evaluations)" in text


def test_with_several_policies_the_summary_has_a_line_per_policy(tmp_path):
    planner, executor = [0.3, 0.4, 0.35, 0.6, 0.9, 1.0], [0.6, 0.7, 0.8, 0.9, 1.0, 1.0]
    rows = []
    for step, (p, e) in enumerate(zip(planner, executor, strict=True)):
        row = {"step": step, "reward/mean": p, "planner/reward/mean": p, "executor/reward/mean": e}
        row |= {"planner/policy/version": step + 1.0, "executor/policy/version": step // 2 + 1.0}
        row |= {"planner/kl/mean": 0.01 * step, "planner/train/loss": 1.0}
        rows.append(row)
    rows.append({"step": 6, "planner/policy/version": 7.0, "executor/policy/version": 4.0})  # none graded
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "evals").mkdir()
    report = {"reward_mean": 0.5, "by_policy": {"planner": {"own_reward_mean": 0.5, "agents": 4.0}}}
    (tmp_path / "evals" / "step-000006.json").write_text(json.dumps(report))
    lines = train_summary(tmp_path).splitlines()
    assert lines[1] == "reward  first 3 steps 0.350, last 3 steps 0.833  (0.30 → 1.00)"
    assert lines[3:6] == [
        "policy  planner: reward first 3 steps 0.350, last 3 steps 0.833  (0.30 → 1.00), version 7, kl 0.0500",
        "policy  executor: reward first 3 steps 0.700, last 3 steps 0.967  (0.60 → 1.00), version 4",
        "eval    step 6: reward 0.500; own reward planner 0.500",
    ]
    # one policy: no policy lines (its metrics are unprefixed)
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"step": 0, "reward/mean": 1.0, "policy/version": 1.0})
    )
    assert "policy  " not in train_summary(tmp_path)


def test_reward_zero_and_not_graded_read_differently(capsys):
    sink = MetricsSink.__new__(MetricsSink)
    sink.settings = MetricsSettings(console=True, total_steps=3, limits=HealthLimits())
    zero = {"reward/mean": 0.0, "episodes/total": 8.0, "episodes/graded": 8.0}
    some = {"reward/mean": 0.5, "episodes/total": 8.0, "episodes/graded": 6.0}
    none = {"episodes/total": 8.0, "episodes/graded": 0.0}
    why = {**some, "episodes/failed/timeout": 1.0, "episodes/failed/non_finite_reward": 1.0}
    for step, metrics in enumerate([zero, some, none, why]):
        sink._console_line(TrainStepFinished(step=step, metrics=metrics))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "step 1/3  reward 0.000"
    assert lines[1] == "step 2/3  graded 6/8  reward 0.500"
    assert lines[2] == "step 3/3  graded 0/8, reward n/a"
    assert lines[3] == "step 4/3  graded 6/8 (1 non_finite_reward, 1 timeout)  reward 0.500"


def test_a_first_step_that_graded_nothing_stops_the_run_saying_why():
    _check_graded({"episodes/total": 8.0, "episodes/graded": 1.0})
    _check_graded({"episodes/total": 0.0, "episodes/graded": 0.0})
    with pytest.raises(NothingGraded) as stopped:
        _check_graded({"episodes/total": 8.0, "episodes/graded": 0.0, "episodes/failed/no_reward": 8.0})
    assert "(8 no_reward)" in str(stopped.value) and "service_kwargs: {reward: sum}" in str(stopped.value)
    # Episodes that failed (an agent whose prompt does not fit the model): no advice on rewards.
    with pytest.raises(NothingGraded) as stopped:
        _check_graded({"episodes/total": 2.0, "episodes/graded": 0.0, "episodes/failed/gateway": 2.0})
    assert str(stopped.value) == (
        "no episode of the first step was graded (2 gateway), so there is nothing to learn from; each "
        "failed before it could be graded (the lines above say where); `platoon events RUN_DIR --type "
        "EpisodeGraded` shows each episode's reason"
    )


def test_constant_groups_are_said_on_the_step_line_and_in_the_summary(tmp_path):
    from platoon.stats.metrics import step_line

    flat = {"reward/mean": 0.0, "train/datums": 0, "credit/groups": 4, "credit/groups_removed_constant": 4}
    assert step_line(0, 5, flat).endswith("no group told its rollouts apart: nothing to learn")
    half = {**flat, "credit/groups_removed_constant": 2}
    assert step_line(0, 5, half).endswith("2/4 groups alike")
    assert "alike" not in step_line(0, 5, {**flat, "credit/groups_removed_constant": 0})
    rows = [{"step": i, **flat} for i in range(3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = train_summary(tmp_path)
    assert "signal  none: in every group all rollouts of a task got one reward" in text
    assert "Raise group_size" in text
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, **half}) + "\n")
    assert "signal  2 of 4 groups had one reward for all their rollouts" in train_summary(tmp_path)


def test_with_several_policies_the_step_line_shows_each_ones_training():
    from platoon.stats.metrics import step_line

    metrics = {"reward/mean": 0.5, "reward/pass_rate": 0.25}
    for policy, datums in (("planner", 4), ("executor", 12)):
        metrics |= {
            f"{policy}/policy/version": 1.0,
            f"{policy}/train/datums": datums,
            f"{policy}/train/trained_tokens": 10.0 * datums,
            f"{policy}/train/loss": -0.5,
            f"{policy}/time/step": 1.25,
        }
    line = step_line(0, 3, metrics)
    assert "[planner: datums 4 tokens 40 loss -0.5 1.2s]" in line
    assert "[executor: datums 12 tokens 120 loss -0.5 1.2s]" in line


def test_a_step_line_shows_the_signals_health_and_warns_past_the_users_limits():
    metrics = {
        "reward/mean": 0.5,
        "mismatch/max_abs": 0.004,
        "mismatch/kl": 0.02,
        "ratio/clipped_fraction": 0.0,
        "entropy/mean": 1.25,
        "replies/truncated_fraction": 0.25,
    }
    line = step_line(0, 2, metrics)
    assert line == (
        "step 1/2  reward 0.500  mismatch 0.004  entropy 1.25  cut 0.25  "
        "WARNING sampler-trainer mismatch kl 0.02 > 0.01"
    )
    assert "WARNING" not in step_line(0, 2, metrics, HealthLimits(mismatch_kl=None))
    clipped = {"planner/ratio/clipped_fraction": 0.5, "planner/policy/version": 1.0}
    assert step_line(0, 2, clipped).endswith(
        "[planner: clipped 0.50]  WARNING clipped share 0.5 > 0.2 (planner)"
    )


def test_the_summary_tells_the_runs_health_and_its_failures_by_cause(tmp_path):
    rows = [
        {
            "step": 1,
            "reward/mean": 0.5,
            "mismatch/max_abs": 1e-7,
            "mismatch/kl": 0.0,
            "entropy/mean": 2.0,
            "episodes/failed/env_session": 3.0,
        },
        {
            "step": 2,
            "reward/mean": 0.6,
            "mismatch/max_abs": 0.5,
            "mismatch/kl": 0.05,
            "entropy/mean": 1.5,
            "episodes/failed/sampler": 1.0,
            "episodes/failed/env_session": 1.0,
        },
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    lines = train_summary(tmp_path).splitlines()
    assert "health  mismatch max |Δlogprob| 0.5, kl 0.05, entropy 1.50" in lines[3]
    assert lines[4].startswith(
        "WARNING 1 step passed a health limit, first step 2: sampler-trainer mismatch kl 0.05"
    )
    assert lines[5] == "failed  4 env_session, 1 sampler  (never graded: left out of their groups' baselines)"
    assert not any(
        "WARNING" in line for line in train_summary(tmp_path, limits=HealthLimits(None, None)).splitlines()
    )


def test_a_recursive_runs_summary_says_how_often_it_delegated_and_each_depths_reward(tmp_path):
    """What the orchestration learned, per step in metrics.jsonl and in the closing lines."""
    rows = []
    for step, (share, root, child) in enumerate(
        [(0.5, 0.5, 0.4), (0.5, 0.6, 0.5), (0.25, 0.7, 0.5), (0.0, 0.9, 0.6)]
    ):
        rows.append(
            {
                "step": step,
                "reward/mean": root,
                "agents/delegated": share,
                "credit/depth/0/reward_mean": root,
                "credit/depth/1/reward_mean": child,
            }
        )
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "evals").mkdir()
    for step, (calls, children) in ((0, (5.0, 2.0)), (4, (3.0, 0.0))):
        depths = {"0": {"agents": 4.0, "model_calls": calls * 4 - children * 3}}
        if children:
            depths["1"] = {"agents": children, "model_calls": children * 3}
        report = {"reward_mean": 0.5, "episodes": 4, "by_depth": depths}
        (tmp_path / "evals" / f"step-{step:06d}.json").write_text(json.dumps(report))
    text = train_summary(tmp_path)
    assert (
        "tree    delegated first 3 steps 0.417, last 3 steps 0.250  (0.50 → 0.00); "
        "depth 0 reward 0.60 → 0.73; depth 1 reward 0.47 → 0.53"
    ) in text
    assert "eval    step 0: reward 0.500, 5.0 model calls an episode (2 subagents in 4 episodes)" in text
    assert "eval    step 4: reward 0.500, 3.0 model calls an episode" in text
    assert "tree" not in train_summary(tmp_path / "nowhere")

"""metrics.jsonl and the step lines count steps as the user reads them: training step N is the
Nth optimizer step (from 1), an evaluation at step N evaluates the policy after N steps."""

from __future__ import annotations

import json

import anyio

from platoon.bus import Bus
from platoon.bus.events import EvalFinished, TrainStepFinished
from platoon.stats.metrics import MetricsSettings, MetricsSink
from platoon.stats.summary import train_summary


async def _sink(run_dir, events) -> None:
    sink = MetricsSink(run_dir, MetricsSettings(total_steps=3))
    async with Bus() as bus:
        sink.attach(bus)
        bus.start_soon(sink.run, bus)
        for event in events:
            await bus.publish(event)


def test_steps_and_evaluations_are_numbered_as_the_terminal_says_them(tmp_path, capsys):
    # What a run with `eval.at_start` and `eval.every: 3` publishes: the events count from 0.
    events = [
        EvalFinished(step=0, metrics={"eval/reward_mean": 0.25}),
        *(TrainStepFinished(step=i, metrics={"reward/mean": 0.1 * i}) for i in range(3)),
        EvalFinished(step=3, metrics={"eval/reward_mean": 0.5}),
    ]
    anyio.run(_sink, tmp_path, events)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], "eval/reward_mean" in r) for r in rows] == [
        (0, True),  # the base model
        (1, False),
        (2, False),
        (3, False),
        (3, True),  # after the third step, the policy it made
    ]
    err = capsys.readouterr().err.splitlines()
    assert [line.split("  ")[0] for line in err] == ["eval", "step 1/3", "step 2/3", "step 3/3", "eval"]
    assert err[0].startswith("eval  step 0:") and err[-1].startswith("eval  step 3:")
    # The closing summary counts the training steps, not the evaluations' rows.
    assert train_summary(tmp_path).splitlines()[0] == "trained 3 steps"


def test_a_resumed_runs_summary_says_which_steps_this_session_trained(tmp_path):
    rows = [{"step": step, "reward/mean": 0.5} for step in range(1, 6)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "lock.json").write_text(json.dumps({"resumed_from_step": 3}))
    assert train_summary(tmp_path, 10.2).splitlines()[0] == "trained 5 steps: 2 in 10 s, resumed after step 3"
    (tmp_path / "lock.json").write_text(json.dumps({"resumed_from_step": 0}))
    assert train_summary(tmp_path, 10.2).splitlines()[0] == "trained 5 steps in 10 s"

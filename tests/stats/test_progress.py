"""The live display of a training run: what it counts and shows, from the run's own events."""

from __future__ import annotations

import io

from rich.console import Console

from platoon.bus.events import EpisodeGraded, EpisodeRequested, TaskRef, TrainStepFinished
from platoon.stats.progress import TrainProgress

TASK = TaskRef(env="e", split="train", task_id="t")


def rendered(progress: TrainProgress) -> str:
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(progress.render())
    return out.getvalue()


def test_it_counts_episodes_in_flight_and_shows_the_last_step():
    progress = TrainProgress(3, console=Console(file=io.StringIO()))
    for n in range(4):
        progress.see(EpisodeRequested(episode_id=f"e{n}", group_id="g", task=TASK, step=0))
    progress.see(EpisodeRequested(episode_id="x", group_id="g", task=TASK, purpose="eval"))  # not counted
    for n, reward in enumerate([1.0, 0.0, None]):
        progress.see(EpisodeGraded(episode_id=f"e{n}", group_id="g", task=TASK, reward=reward, step=0))
    text = rendered(progress)
    assert "step 1/3  episodes 3/4, 1 in flight  reward 0.500 (last 2)" in text

    printed = io.StringIO()

    class Live:
        console = Console(file=printed, width=200, color_system=None)

    metrics = {"reward/mean": 0.5, "train/datums": 4.0, "episodes/total": 4.0, "episodes/graded": 3.0}
    progress.see(TrainStepFinished(step=0, metrics=metrics), Live())
    assert printed.getvalue().strip() == "step 1/3  graded 3/4  reward 0.500  datums 4"
    text = rendered(progress)
    assert "step 2/3  episodes 0/?" in text and "ETA" in text
    assert "reward" in text and "0.500" in text and "datums" in text


def test_the_eval_bar_counts_graded_episodes_to_the_end():
    from platoon.train.evaluate import progress_printer

    out = io.StringIO()
    show = progress_printer(console=Console(file=out, width=100, color_system=None, force_terminal=True))
    for done in range(1, 5):
        show(done, 4)
    text = out.getvalue()
    assert "eval episodes" in text and "4/4" in text
    assert progress_printer()(1, 4) is None  # off a terminal: nothing drawn


def test_with_several_policies_the_live_table_has_a_row_of_each_ones_training():
    progress = TrainProgress(3, console=Console(file=io.StringIO()))
    metrics = {"reward/mean": 0.5, "reward/pass_rate": 0.25, "time/rollout": 2.0}
    for policy, datums in (("planner", 4), ("executor", 12)):
        metrics |= {
            f"{policy}/policy/version": 1.0,
            f"{policy}/reward/mean": 0.125 * datums,
            f"{policy}/train/datums": datums,
            f"{policy}/train/trained_tokens": 10.0 * datums,
            f"{policy}/train/loss": -0.5,
            f"{policy}/time/step": 1.25,
        }
    progress.see(TrainStepFinished(step=0, metrics=metrics))
    lines = [line.split() for line in rendered(progress).splitlines()]
    head = next(line for line in lines if "datums" in line)
    assert head == ["reward", "pass", "datums", "tokens", "loss", "rollout", "s", "step", "s"]
    assert ["run", "0.500", "0.25", "2.0"] in lines
    assert ["planner", "0.500", "4", "40", "-0.5", "1.2"] in lines
    assert ["executor", "1.500", "12", "120", "-0.5", "1.2"] in lines

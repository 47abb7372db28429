"""The run index over a resumed run's log: episodes a crash cut off are not in flight for ever."""

import anyio

from platoon.bus import Bus, EventLog
from platoon.bus.events import EpisodeFinished, EpisodeGraded, EpisodeRequested, RunFinished, TaskRef
from platoon.visualization.index import EPISODE_COLUMNS, EpisodeRow, RunIndex

TASK = TaskRef(env="e", split="train", task_id="t")


async def _write(run_dir, events) -> None:
    log = EventLog(run_dir)
    async with Bus() as bus:
        log.attach(bus)
        bus.start_soon(log.run, bus)
        for event in events:
            await bus.publish(event)


def test_episodes_a_crash_cut_off_are_abandoned_once_the_resumed_run_ends(tmp_path):
    def played(episode: str) -> list:
        return [
            EpisodeRequested(episode_id=episode, group_id="g", task=TASK, step=0),
            EpisodeFinished(episode_id=episode, group_id="g", task=TASK, status="completed"),
            EpisodeGraded(episode_id=episode, group_id="g", task=TASK, reward=1.0),
        ]

    # The first run is killed while "cut" plays; the resumed run plays the step again and ends.
    first = [*played("done"), EpisodeRequested(episode_id="cut", group_id="g", task=TASK, step=0)]
    anyio.run(_write, tmp_path, first)
    index = RunIndex(tmp_path, index_path=tmp_path / "index.sqlite")
    index.refresh()
    rows, _ = index.episodes(sort="episode_id")
    assert {r["episode_id"]: r["status"] for r in rows} == {"done": "completed", "cut": None}  # in flight

    anyio.run(_write, tmp_path, [*played("again"), RunFinished(status="completed")])
    index.refresh()
    rows, _ = index.episodes(sort="episode_id")
    status = {r["episode_id"]: (r["status"], r["reason"]) for r in rows}
    assert status["done"] == ("completed", None) and status["again"] == ("completed", None)
    assert status["cut"][0] == "abandoned" and "never finished" in status["cut"][1]


def test_an_episode_row_has_the_columns_of_the_episodes_table_in_order():
    # _episode_row reads a table row as an EpisodeRow: the two must name the same columns.
    assert tuple(EpisodeRow.__annotations__) == EPISODE_COLUMNS


def test_steps_are_kept_as_users_read_them(tmp_path):
    """A training episode of the first step (its events' step 0) is in step 1, as the terminal
    said it; an evaluation before any training is at step 0, and one after a step at step 1."""
    from platoon.bus.events import BatchReady, Datum, EvalFinished, TrainStepFinished

    def played(episode: str, purpose: str, step: int) -> list:
        return [
            EpisodeRequested(episode_id=episode, group_id=episode, task=TASK, step=step, purpose=purpose),
            EpisodeFinished(
                episode_id=episode,
                group_id=episode,
                task=TASK,
                status="completed",
                purpose=purpose,
                step=step,
            ),
            EpisodeGraded(episode_id=episode, group_id=episode, task=TASK, reward=1.0, purpose=purpose),
        ]

    datum = Datum(
        model_input=[1], target_tokens=[2], logprobs=[0.0], advantages=[0.5], weights=[1.0], episode_id="t0"
    )
    events = [
        *played("base", "eval", 0),
        *played("t0", "train", 0),
        BatchReady(step=0, datums=[datum]),
        TrainStepFinished(step=0, metrics={"reward/mean": 1.0}),
        *played("after", "eval", 1),
        EvalFinished(step=1, metrics={"eval/reward_mean": 1.0}),
    ]
    anyio.run(_write, tmp_path, events)
    index = RunIndex(tmp_path, index_path=tmp_path / "index.sqlite")
    index.refresh()
    assert [(s["purpose"], s["step"]) for s in index.steps()] == [("train", 1), ("eval", 0), ("eval", 1)]
    assert [d.step for d in index.datums("t0")] == [1]
    assert [m["step"] for m in index.metrics("train")] == [1]
    assert [m["step"] for m in index.metrics("eval")] == [1]

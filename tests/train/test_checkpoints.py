"""checkpoints.jsonl: the step a checkpoint was saved after, counted as the terminal counts."""

import json

from platoon.train.checkpoints import Checkpoint, CheckpointStore


def _line(step: int, name: int) -> dict:
    return {
        "step": step,
        "state_path": f"tinker://run/weights/state-{name:06d}",
        "sampler_path": f"tinker://run/sampler_weights/ckpt-{name:06d}",
        "policy_version": name,
        "task_cursor": name,
    }


def test_a_line_written_before_steps_counted_from_one_reads_as_the_step_it_was_saved_after(tmp_path):
    # platoon 0.2 wrote `"step": 3` beside state-000004 (the index of the fourth step).
    lines = [_line(1, 2), _line(3, 4)]
    (tmp_path / "checkpoints.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    store = CheckpointStore(tmp_path)
    assert [c.step for c in store.candidates()] == [4, 2]
    # Rewritten (a new checkpoint recorded), every line counts from one.
    store.append(Checkpoint(**_line(6, 6)))
    written = [json.loads(line)["step"] for line in (tmp_path / "checkpoints.jsonl").read_text().splitlines()]
    assert written == [2, 4, 6]
    assert [c.step for c in store.candidates()] == [6, 4, 2]


def test_a_line_counted_from_one_is_read_as_written(tmp_path):
    (tmp_path / "checkpoints.jsonl").write_text(json.dumps(_line(4, 4)) + "\n")
    assert CheckpointStore(tmp_path).latest().step == 4

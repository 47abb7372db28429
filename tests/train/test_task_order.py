"""`TaskOrder`: which tasks each step trains on, a pure function of the seed and the step."""

from __future__ import annotations

from collections import Counter

import pytest

from platoon.bus.events import TaskRef
from platoon.train.loop import TaskOrder


def tasks(env: str, n: int) -> list[TaskRef]:
    return [TaskRef(env=env, split="train", task_id=f"{env}-{i}", index=i) for i in range(n)]


def ids(refs: list[TaskRef]) -> list[str]:
    return [t.task_id for t in refs]


def test_the_same_seed_gives_the_same_order_and_another_seed_another():
    def order(seed: int) -> list[list[str]]:
        o = TaskOrder({"a": tasks("a", 10)}, {}, batch_size=3, seed=seed)
        return [ids(o.for_step(s)) for s in range(6)]

    assert order(1) == order(1)
    assert order(1) != order(2)


def test_a_step_is_the_same_whatever_was_asked_before_it():
    """A resumed run asks for step s first; it must get what the uninterrupted run got."""
    entries = {"a": tasks("a", 7), "b": tasks("b", 5), "c": tasks("c", 3)}
    weights = {"a": 2.0, "b": 1.0, "c": 1.0}
    straight = TaskOrder(entries, weights, batch_size=4, seed=5)
    expected = [ids(straight.for_step(s)) for s in range(12)]
    for start in (1, 5, 11):
        resumed = TaskOrder(entries, weights, batch_size=4, seed=5)
        assert [ids(resumed.for_step(s)) for s in range(start, 12)] == expected[start:]
    backwards = TaskOrder(entries, weights, batch_size=4, seed=5)
    assert [ids(backwards.for_step(s)) for s in reversed(range(12))] == expected[::-1]


def test_each_epoch_visits_every_task_once_in_a_new_order():
    order = TaskOrder({"a": tasks("a", 10)}, {}, batch_size=5, seed=0)
    drawn = [t for s in range(6) for t in ids(order.for_step(s))]  # three epochs of 10
    epochs = [drawn[0:10], drawn[10:20], drawn[20:30]]
    for epoch in epochs:
        assert sorted(epoch) == sorted(ids(tasks("a", 10)))
    assert len({tuple(e) for e in epochs}) == 3
    assert epochs[0] != ids(tasks("a", 10))  # shuffled, not in split order


def test_entries_are_drawn_by_weight():
    order = TaskOrder({"a": tasks("a", 50), "b": tasks("b", 50)}, {"a": 3.0, "b": 1.0}, batch_size=8, seed=2)
    counts = Counter(t.env for s in range(250) for t in order.for_step(s))
    assert sum(counts.values()) == 2000
    assert counts["a"] / 2000 == pytest.approx(0.75, abs=0.03)


def test_a_zero_weight_entry_is_never_drawn_and_a_missing_weight_counts_one():
    order = TaskOrder({"a": tasks("a", 4), "b": tasks("b", 4)}, {"b": 0.0}, batch_size=4, seed=0)
    assert {t.env for s in range(20) for t in order.for_step(s)} == {"a"}
    assert order.weights == {"a": 1.0, "b": 0.0}


def test_each_entry_walks_its_own_epochs():
    """Within each entry, the k-th draw of that entry is its k-th task in epoch order."""
    entries = {"a": tasks("a", 3), "b": tasks("b", 4)}
    order = TaskOrder(entries, {}, batch_size=2, seed=9)
    drawn = [t for s in range(30) for t in order.for_step(s)]
    for env, n in (("a", 3), ("b", 4)):
        mine = [t.task_id for t in drawn if t.env == env]
        for start in range(0, len(mine) - n + 1, n):
            assert sorted(mine[start : start + n]) == sorted(ids(entries[env]))


def test_entries_without_tasks_are_left_out_and_no_tasks_at_all_is_an_error():
    order = TaskOrder({"a": tasks("a", 2), "empty": []}, {}, batch_size=2, seed=0)
    assert set(order.tasks) == {"a"}
    with pytest.raises(ValueError, match="no training tasks"):
        TaskOrder({"empty": []}, {}, batch_size=2, seed=0)

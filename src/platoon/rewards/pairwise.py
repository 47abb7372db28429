"""Pairwise judging: the attempts of one task group judged against each other.

With `judge.pairwise: true`, a judge does not score an episode alone: the grader holds each
episode of the group until every attempt of the group has finished (or `group_timeout` passed),
then the judge compares every pair, in both orders (against position bias), and each attempt's
score is its share of wins (a tie is half a win). An attempt alone in its group scores 0.5.
Attempts that failed (not graded, or another part of their reward failed) take no part.

Groups are the attempts this grader sees: in a distributed run, those one worker plays.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, field

import anyio

from platoon.bus import Bus
from platoon.rewards.episode import Episode
from platoon.rewards.judge import Judge, JudgeError

__all__ = ["Pairings"]


@dataclass
class _Group:
    expected: int = 0
    present: dict[str, Episode] = field(default_factory=dict)
    settled: set[str] = field(default_factory=set)  # arrived, or left without taking part
    complete: anyio.Event = field(default_factory=anyio.Event)
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    scores: dict[str, tuple[float, str]] | None = None
    error: str | None = None
    read: int = 0


class Pairings:
    """The task groups in flight of one grader, for its pairwise judges."""

    def __init__(self) -> None:
        self.groups: dict[tuple[int, str], _Group] = {}
        self.sizes: dict[str, int] = defaultdict(int)  # attempts requested, by group id
        self.left: dict[str, set[str]] = defaultdict(set)  # attempts that will not take part

    def expect(self, group_id: str) -> None:
        """One more attempt of `group_id` was requested."""
        self.sizes[group_id] += 1

    def _group(self, judge: Judge, group_id: str) -> _Group:
        group = self.groups.setdefault((id(judge), group_id), _Group())
        group.expected = max(self.sizes.get(group_id, 1), len(group.settled), 1)
        return group

    def leave(self, group_id: str, episode_id: str) -> None:
        """An attempt that will not be compared (it failed): its group need not wait for it."""
        self.left[group_id].add(episode_id)
        for (_, gid), group in list(self.groups.items()):
            if gid == group_id:
                group.settled.add(episode_id)
                self._check(group)

    def _check(self, group: _Group) -> None:
        if len(group.settled) >= group.expected:
            group.complete.set()

    async def score(self, judge: Judge, episode: Episode, bus: Bus | None) -> tuple[float, str]:
        """The episode's share of wins against the other attempts of its group, and the replies."""
        group = self._group(judge, episode.group_id)
        group.settled |= self.left.get(episode.group_id, set())
        group.present[episode.episode_id] = episode
        group.settled.add(episode.episode_id)
        self._check(group)
        with anyio.move_on_after(judge.config.group_timeout):
            await group.complete.wait()
        async with group.lock:
            if group.scores is None and group.error is None:
                try:
                    group.scores = await _compare_all(judge, list(group.present.values()), bus)
                except JudgeError as exc:
                    group.error = str(exc)
        group.read += 1
        if group.read >= len(group.present):
            self.groups.pop((id(judge), episode.group_id), None)
            self.sizes.pop(episode.group_id, None)
            self.left.pop(episode.group_id, None)
        if group.error is not None:
            raise JudgeError(group.error)
        assert group.scores is not None
        if episode.episode_id not in group.scores:  # it arrived after the group was judged
            raise JudgeError("the attempt arrived after its group was compared (group_timeout)")
        return group.scores[episode.episode_id]


async def _compare_all(
    judge: Judge, episodes: list[Episode], bus: Bus | None
) -> dict[str, tuple[float, str]]:
    if len(episodes) < 2:
        return {e.episode_id: (0.5, "alone in its group: nothing to compare with") for e in episodes}
    wins: dict[str, list[float]] = defaultdict(list)
    notes: dict[str, list[str]] = defaultdict(list)
    pairs = list(itertools.permutations(episodes, 2))  # both orders of every pair
    results: list[float | None] = [None] * len(pairs)
    errors: list[JudgeError] = []

    async def one(index: int) -> None:
        a, b = pairs[index]
        try:
            result = await judge.compare(a, b, bus)
        except JudgeError as exc:
            errors.append(exc)
            return
        results[index] = result.score
        notes[a.episode_id].append(f"[as A against {b.episode_id[:8]}] {result.reasoning}")
        notes[b.episode_id].append(f"[as B against {a.episode_id[:8]}] {result.reasoning}")

    async with anyio.create_task_group() as tg:
        for index in range(len(pairs)):
            tg.start_soon(one, index)
    if errors:
        raise errors[0]
    for (a, b), score in zip(pairs, results, strict=True):
        assert score is not None
        wins[a.episode_id].append(score)
        wins[b.episode_id].append(1.0 - score)
    return {
        e.episode_id: (
            math.fsum(wins[e.episode_id]) / len(wins[e.episode_id]),
            "\n\n".join(notes[e.episode_id]),
        )
        for e in episodes
    }

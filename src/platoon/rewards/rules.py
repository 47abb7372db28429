"""Reward rules: an episode's reward as weighted parts, each part kept by name.

A rule maps an `Episode` to a value; `RewardRules` combines the values with their weights
(`weighted_sum`, `min` or `product` of the weighted parts). The built-in rules:

- `env`: the environment's grade (after the entry's reward processor).
- `judge`: a judge's score in [0, 1] (see `platoon.rewards.judge`).
- `format`: 1 when the whole text matches `pattern`, else 0.
- `match`: 1 when the text matches `expected` (`exact` after trimming and case folding,
  `regex` search, or `numeric` within `tolerance` of the last number in the text), else 0.
  `expected` may name fields of the task's spec: `{answer}`.
- `length_penalty`: `per_token` for each sampled token beyond `max_tokens` (all agents).
- `tool_penalty`: `per_call` for each tool call beyond `free_calls` (only `tools`, if named).
- `python`: `ref`, a function `f(episode) -> float` (or a coroutine function).

A rule that cannot be computed (no environment grade for `env`, a judge that fails) makes the
episode ungraded with the reason: a missing part is never silently 0.
"""

from __future__ import annotations

import inspect
import math
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from platoon import plugins
from platoon.bus import Bus
from platoon.config.schema import RewardConfig, RewardRule
from platoon.rewards.episode import Episode
from platoon.rewards.judge import Judge
from platoon.rewards.pairwise import Pairings

__all__ = ["RewardOutcome", "RewardRules", "RuleError", "rule_names"]

RuleFunction = Callable[[Episode], float | Awaitable[float]]


class RuleError(RuntimeError):
    """A part of the reward could not be computed; the episode is then not graded."""


@dataclass
class RewardOutcome:
    """The combined reward, each part's (unweighted) value by name, notes (a judge's reasoning),
    and the reward per-turn judges credit to each turn of the root agent (weighted)."""

    reward: float
    parts: dict[str, float]
    notes: dict[str, str] = field(default_factory=dict)
    turn_rewards: dict[int, float] = field(default_factory=dict)


def rule_names(rules: list[RewardRule]) -> list[str]:
    """Each rule's part name: its `name`, else the rule's kind, numbered when a kind repeats."""
    counts = Counter(rule.rule for rule in rules if rule.name is None)
    seen: Counter[str] = Counter()
    names = []
    for rule in rules:
        if rule.name is not None:
            names.append(rule.name)
            continue
        seen[rule.rule] += 1
        names.append(rule.rule if counts[rule.rule] == 1 else f"{rule.rule}_{seen[rule.rule]}")
    if len(set(names)) != len(names):
        raise RuleError(f"reward rules need distinct names, got {names}")
    return names


class RewardRules:
    """The rules of one environment entry. `judges` holds the judge of each `judge` rule (by
    position), `entry_judge` the entry's own (for judge rules without one)."""

    def __init__(
        self,
        config: RewardConfig,
        *,
        judges: Mapping[int, Judge] | None = None,
        entry_judge: Judge | None = None,
    ) -> None:
        self.config = config
        self.names = rule_names(config.rules)
        self.judges = dict(judges or {})
        self.functions: dict[int, RuleFunction] = {}
        for index, rule in enumerate(config.rules):
            if rule.rule == "judge":
                judge = self.judges.get(index) or entry_judge
                if judge is None:
                    raise RuleError(
                        f"reward rule {self.names[index]!r} needs a judge: give it judge: or the entry one"
                    )
                self.judges[index] = judge
            elif rule.rule == "python":
                if not rule.ref:
                    raise RuleError(f"reward rule {self.names[index]!r} (python) needs ref: module:attr")
                self.functions[index] = plugins.load("reward_rules", rule.ref)
            elif rule.rule in ("format",) or (rule.rule == "match" and rule.kind == "regex"):
                pattern = rule.pattern if rule.rule == "format" else (rule.pattern or rule.expected)
                if not pattern:
                    raise RuleError(f"reward rule {self.names[index]!r} needs a pattern")
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise RuleError(
                        f"reward rule {self.names[index]!r}: bad pattern {pattern!r}: {exc}"
                    ) from None
            elif rule.rule == "match" and rule.expected is None:
                raise RuleError(f"reward rule {self.names[index]!r} (match) needs expected:")

    async def aclose(self) -> None:
        """Release the judges' clients."""
        for judge in {id(j): j for j in self.judges.values()}.values():
            await judge.aclose()

    @property
    def needs_task_spec(self) -> bool:
        """Whether a rule reads the task's spec: a `match` naming one of its fields, or any
        `python` rule (its function is handed the episode, spec included)."""
        return any(
            r.rule == "python" or (r.rule == "match" and r.expected and "{" in r.expected)
            for r in self.config.rules
        )

    @property
    def files(self) -> list[str]:
        """The sandbox files the judges' rubrics show."""
        return sorted({path for judge in self.judges.values() for path in judge.config.files})

    @property
    def pairwise(self) -> bool:
        """Whether a judge of these rules compares the attempts of a group."""
        return any(judge.config.pairwise for judge in self.judges.values())

    async def evaluate(
        self, episode: Episode, bus: Bus | None = None, pairings: Pairings | None = None
    ) -> RewardOutcome:
        parts: dict[str, float] = {}
        notes: dict[str, str] = {}
        turns: dict[int, list[float]] = {}
        weighted = []
        for index, (name, rule) in enumerate(zip(self.names, self.config.rules, strict=True)):
            try:
                if rule.rule == "judge" and self.judges[index].config.per_turn:
                    value, scores = await self._per_turn(index, episode, bus, notes, name)
                    for turn, score in enumerate(scores):
                        turns.setdefault(turn, []).append(rule.weight * score / len(scores))
                else:
                    value = await self._value(index, rule, episode, bus, notes, name, pairings)
            except RuleError:
                raise
            except Exception as exc:  # a user's function: its failure is this episode's, not the run's
                raise RuleError(f"reward rule {name!r} raised {type(exc).__name__}: {exc}") from exc
            if not math.isfinite(value):
                raise RuleError(f"reward rule {name!r} gave a non-finite value {value!r}")
            parts[name] = value
            weighted.append(rule.weight * value)
        if self.config.combine == "min":
            reward = min(weighted, default=0.0)
        elif self.config.combine == "product":
            reward = math.prod(weighted)
        else:
            reward = math.fsum(weighted)
        # Turn scores add up to their part's weighted value, which is what a weighted sum holds.
        by_turn = {t: math.fsum(v) for t, v in turns.items()} if self.config.combine == "weighted_sum" else {}
        return RewardOutcome(reward=reward, parts=parts, notes=notes, turn_rewards=by_turn)

    async def _per_turn(
        self, index: int, episode: Episode, bus: Bus | None, notes: dict[str, str], name: str
    ) -> tuple[float, list[float]]:
        """A per-turn judge's score of each root turn, and their mean as the part's value."""
        judge = self.judges[index]
        n = episode.root_turns()
        if n == 0:
            raise RuleError(f"judge {name!r} scores turns, and the episode has none")
        results: list[Any] = [None] * n
        errors: list[Exception] = []

        async def one(turn: int) -> None:
            try:
                results[turn] = await judge.score(episode.until_turn(turn), bus)
            except Exception as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for turn in range(n):
                tg.start_soon(one, turn)
        if errors:
            raise RuleError(f"judge {name!r} failed: {errors[0]}") from errors[0]
        notes[name] = "\n\n".join(f"[turn {t + 1}: {r.score:g}] {r.reasoning}" for t, r in enumerate(results))
        scores = [r.score for r in results]
        return math.fsum(scores) / n, scores

    async def _value(
        self,
        index: int,
        rule: RewardRule,
        episode: Episode,
        bus: Bus | None,
        notes: dict[str, str],
        name: str,
        pairings: Pairings | None = None,
    ) -> float:
        kind = rule.rule
        if kind == "env":
            if episode.env_reward is None:
                raise RuleError("the environment gave no reward")
            return float(episode.env_reward)
        if kind == "judge":
            judge = self.judges[index]
            try:
                if judge.config.pairwise:
                    score, reasoning = await (pairings or Pairings()).score(judge, episode, bus)
                else:
                    result = await judge.score(episode, bus)
                    score, reasoning = result.score, result.reasoning
            except Exception as exc:
                raise RuleError(f"judge {name!r} failed: {exc}") from exc
            notes[name] = reasoning
            return score
        if kind == "format":
            assert rule.pattern is not None
            return 1.0 if re.fullmatch(rule.pattern, _text(episode, rule.text), flags=re.DOTALL) else 0.0
        if kind == "match":
            return _match(rule, episode)
        if kind == "length_penalty":
            return rule.per_token * max(0, episode.sampled_tokens - rule.max_tokens)
        if kind == "tool_penalty":
            calls = sum(1 for t in episode.tools if not rule.tools or t.name in rule.tools)
            return rule.per_call * max(0, calls - rule.free_calls)
        if kind == "python":
            value = self.functions[index](episode)
            if inspect.isawaitable(value):
                value = await value
            return float(value)
        raise RuleError(f"unknown reward rule {kind!r}")


def _text(episode: Episode, which: str) -> str:
    if which == "replies":
        return "\n".join(episode.root_replies())
    if which == "last_reply":
        replies = episode.root_replies()
        return replies[-1] if replies else ""
    return episode.final_answer or ""


def _expected(rule: RewardRule, episode: Episode) -> str:
    assert rule.expected is not None

    def field_of(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in episode.task_spec:
            raise RuleError(f"the task's spec has no {key!r} for expected: {rule.expected!r}")
        return str(episode.task_spec[key])

    return re.sub(r"\{([A-Za-z_][A-Za-z0-9_]*)\}", field_of, rule.expected)


_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def _match(rule: RewardRule, episode: Episode) -> float:
    text = _text(episode, rule.text)
    if rule.kind == "regex":
        pattern = rule.pattern or _expected(rule, episode)
        if rule.pattern and rule.expected is not None:  # the pattern extracts, expected compares
            found = re.search(rule.pattern, text, flags=re.DOTALL)
            if found is None:
                return 0.0
            got = found.group(1) if found.groups() else found.group(0)
            return 1.0 if _norm(got) == _norm(_expected(rule, episode)) else 0.0
        return 1.0 if re.search(pattern, text, flags=re.DOTALL) else 0.0
    expected = _expected(rule, episode)
    if rule.kind == "numeric":
        numbers = _NUMBER.findall(text.replace(",", ""))
        try:
            want = float(expected.replace(",", ""))
            got = float(numbers[-1]) if numbers else None
        except ValueError as exc:
            raise RuleError(f"expected {expected!r} is not a number") from exc
        return 1.0 if got is not None and abs(got - want) <= rule.tolerance else 0.0
    return 1.0 if _norm(text) == _norm(expected) else 0.0


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()

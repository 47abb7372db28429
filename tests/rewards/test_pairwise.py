"""Pairwise judging: the attempts of a group compared in both orders, each scored by its share
of wins; failed attempts leave the group; a lone attempt scores 0.5; and in the grader, a group's
episodes are graded together."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import anyio
import msgspec
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "programs"))

from programs_helpers import toy_system

from platoon.bus.events import EpisodeGraded, EpisodeRequested, Event, ModelCallFinished, TaskRef, new_id
from platoon.config.schema import JudgeConfig, RewardConfig
from platoon.gateway.renderers import get_renderer
from platoon.rewards import Episode, Judge, RewardRules, SamplerJudgeModel
from platoon.rewards.judge import PAIR_SCORE, parse_score
from platoon.rewards.pairwise import Pairings
from platoon.testing.policies import ScriptedSampler

pytestmark = pytest.mark.anyio


def longer_wins(messages) -> str:
    """A scripted judge: the attempt with the longer final answer wins; equal lengths tie."""
    prompt = messages[-1]["content"]
    a, b = (
        len(re.search(rf"<attempt_{x}>.*FINAL ANSWER: (.*?)\n</attempt_{x}>", prompt, re.S).group(1))
        for x in "ab"
    )
    return "Verdict: " + ("A" if a > b else "B" if b > a else "tie")


def pairwise_judge(tokenizer, script=longer_wins, **cfg) -> tuple[Judge, ScriptedSampler]:
    sampler = ScriptedSampler(tokenizer, script)
    config = msgspec.convert({"pairwise": True, **cfg}, JudgeConfig)
    return Judge(config, SamplerJudgeModel(sampler, get_renderer("qwen3_instruct", tokenizer))), sampler


def attempt(episode_id: str, answer: str, group_id: str = "g") -> Episode:
    return Episode(
        episode_id=episode_id,
        group_id=group_id,
        task=TaskRef(env="t", split="train", task_id="0"),
        instruction="Say something long.",
        final_answer=answer,
    )


def test_verdicts_need_the_verdict_form_for_one_letter_labels():
    assert parse_score("Verdict: B", PAIR_SCORE) == 0.0
    assert parse_score("a fine answer; verdict = tie", PAIR_SCORE) == 0.5
    assert parse_score("A is a good attempt", PAIR_SCORE) is None  # "A" and "a" as words are no verdict


async def test_a_group_is_compared_in_both_orders_and_scored_by_wins(toy_tokenizer):
    judge, sampler = pairwise_judge(toy_tokenizer)
    pairings = Pairings()
    for _ in range(3):
        pairings.expect("g")
    episodes = [attempt("short", "hi"), attempt("middle", "hello"), attempt("long", "hello there")]
    scores: dict[str, float] = {}

    async def one(ep: Episode) -> None:
        scores[ep.episode_id], _ = await pairings.score(judge, ep, None)

    async with anyio.create_task_group() as tg:
        for ep in episodes:
            tg.start_soon(one, ep)
    assert scores == {"short": 0.0, "middle": 0.5, "long": 1.0}
    assert sampler.calls == 6  # three pairs, both orders
    assert pairings.groups == {} and pairings.sizes == {}


async def test_failed_attempts_leave_and_a_lone_attempt_scores_half(toy_tokenizer):
    judge, sampler = pairwise_judge(toy_tokenizer)
    pairings = Pairings()
    for _ in range(3):
        pairings.expect("g")
    pairings.leave("g", "failed")  # before anyone arrived
    scores: dict[str, float] = {}

    async def one(ep: Episode) -> None:
        scores[ep.episode_id], _ = await pairings.score(judge, ep, None)

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, attempt("a", "hi"))
        tg.start_soon(one, attempt("b", "hello"))
    assert scores == {"a": 0.0, "b": 1.0} and sampler.calls == 2
    pairings.expect("solo")
    score, note = await pairings.score(judge, attempt("s", "x", group_id="solo"), None)
    assert (score, note) == (0.5, "alone in its group: nothing to compare with")


async def test_the_group_waits_at_most_group_timeout(toy_tokenizer):
    judge, _ = pairwise_judge(toy_tokenizer, group_timeout=0.05)
    pairings = Pairings()
    pairings.expect("g")
    pairings.expect("g")  # the second attempt never comes
    assert (await pairings.score(judge, attempt("a", "hi"), None))[0] == 0.5


async def test_the_grader_grades_a_group_together(toy_tokenizer):
    judge, _ = pairwise_judge(toy_tokenizer)
    rules = RewardRules(
        msgspec.convert({"rules": [{"rule": "env"}, {"rule": "judge", "weight": 0.5}]}, RewardConfig),
        entry_judge=judge,
    )
    async with toy_system(toy_tokenizer, rules={"toy": rules}) as toy:
        group_id, ids = new_id(), [new_id() for _ in range(3)]
        graded: dict[str, EpisodeGraded] = {}
        judged = 0
        async with toy.bus.stream(Event, name="test:group") as stream:
            for episode_id in ids:
                await toy.bus.publish(
                    EpisodeRequested(
                        episode_id=episode_id,
                        group_id=group_id,
                        task=TaskRef(env="toy", split="train", task_id="train-5"),
                    )
                )
            async for event in stream:
                if isinstance(event, ModelCallFinished) and event.kind == "judge":
                    judged += 1
                if isinstance(event, EpisodeGraded) and event.group_id == group_id:
                    graded[event.episode_id] = event
                    if len(graded) == 3:
                        break
    # the scripted policy plays every attempt alike: every comparison is a tie
    assert {g.rewards["rule/judge"] for g in graded.values()} == {0.5}
    assert {g.reward for g in graded.values()} == {1.25}
    assert judged == 6
    assert all("Verdict: tie" in g.notes["judge"] for g in graded.values())

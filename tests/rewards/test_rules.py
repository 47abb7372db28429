"""Reward rules: each rule's value on a known episode, their combination, and the errors that
leave an episode ungraded rather than scoring a missing part as 0."""

from __future__ import annotations

import msgspec
import pytest

from platoon.bus.events import TaskRef
from platoon.config.schema import RewardConfig, RewardRule
from platoon.rewards import Episode, Reply, RewardRules, RuleError, ToolUse, rule_names

pytestmark = pytest.mark.anyio


def episode(final="The answer is 42.", **kw) -> Episode:
    return Episode(
        episode_id="e",
        group_id="g",
        task=TaskRef(env="t", split="train", task_id="0"),
        instruction="What is six times seven?",
        root_agent_id="root",
        final_answer=final,
        replies=[
            Reply("root", "thinking", 30),
            Reply("root", "<answer>42</answer>", 20),
            Reply("kid", "x", 5),
        ],
        tools=[
            ToolUse("root", "search", {"q": "6*7"}, "42"),
            ToolUse("root", "calc", {}),
            ToolUse("root", "calc", {}),
        ],
        env_reward=0.5,
        task_spec={"answer": "42", "tag": "answer"},
        **kw,
    )


def rules(*items: dict, combine: str = "weighted_sum") -> RewardRules:
    return RewardRules(msgspec.convert({"rules": list(items), "combine": combine}, RewardConfig))


async def value(rule: dict, ep: Episode | None = None) -> float:
    outcome = await rules({**rule, "name": "it"}).evaluate(ep or episode())
    return outcome.parts["it"]


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ({"rule": "env"}, 0.5),
        ({"rule": "format", "pattern": r"The answer is \d+\."}, 1.0),
        ({"rule": "format", "pattern": r"\d+"}, 0.0),  # the whole text must match
        ({"rule": "format", "pattern": r"<answer>.*</answer>", "text": "last_reply"}, 1.0),
        ({"rule": "match", "expected": "the answer is 42."}, 1.0),  # exact: trimmed, case folded
        ({"rule": "match", "expected": "42"}, 0.0),
        ({"rule": "match", "kind": "numeric", "expected": "{answer}"}, 1.0),
        ({"rule": "match", "kind": "numeric", "expected": "41.9", "tolerance": 0.05}, 0.0),
        ({"rule": "match", "kind": "numeric", "expected": "41.99", "tolerance": 0.05}, 1.0),
        ({"rule": "match", "kind": "regex", "expected": r"\b{answer}\b"}, 1.0),
        (
            {
                "rule": "match",
                "kind": "regex",
                "pattern": r"<{tag}>(\d+)<",
                "expected": "{answer}",
                "text": "replies",
            },
            0.0,
        ),
        (
            {
                "rule": "match",
                "kind": "regex",
                "pattern": r"<answer>(\d+)<",
                "expected": "{answer}",
                "text": "replies",
            },
            1.0,
        ),
        ({"rule": "length_penalty", "max_tokens": 40, "per_token": -0.01}, -0.15),  # 55 sampled tokens
        ({"rule": "length_penalty", "max_tokens": 100}, 0.0),
        ({"rule": "tool_penalty", "per_call": -0.1}, -0.3),
        ({"rule": "tool_penalty", "per_call": -0.1, "free_calls": 1, "tools": ["calc"]}, -0.1),
        ({"rule": "python", "ref": "test_rules:replies_seen"}, 3.0),
        ({"rule": "python", "ref": "test_rules:async_rule"}, 0.25),
    ],
)
async def test_each_rule(rule, expected):
    assert await value(rule) == pytest.approx(expected)


def replies_seen(ep: Episode) -> float:
    return len(ep.replies)


async def async_rule(ep: Episode) -> float:
    return 0.25


async def test_weights_combine_and_every_part_is_kept_by_name():
    combined = rules(
        {"rule": "env", "weight": 1.0},
        {"rule": "format", "pattern": r"The answer is \d+\.", "weight": 0.2},
        {"rule": "tool_penalty", "per_call": -0.1},
        {"rule": "match", "kind": "numeric", "expected": "{answer}", "name": "correct", "weight": 2.0},
    )
    outcome = await combined.evaluate(episode())
    assert outcome.parts == pytest.approx({"env": 0.5, "format": 1.0, "tool_penalty": -0.3, "correct": 1.0})
    assert outcome.reward == pytest.approx(0.5 + 0.2 - 0.3 + 2.0)
    low = await rules({"rule": "env"}, {"rule": "match", "expected": "no"}, combine="min").evaluate(episode())
    assert low.reward == 0.0
    prod = await rules(
        {"rule": "env", "weight": 2.0}, {"rule": "env", "weight": 3.0}, combine="product"
    ).evaluate(episode())
    assert prod.reward == pytest.approx(1.0 * 1.5)


def test_names_number_repeated_kinds_and_must_be_distinct():
    parse = lambda *r: [msgspec.convert(x, RewardRule) for x in r]  # noqa: E731
    assert rule_names(
        parse({"rule": "env"}, {"rule": "format", "pattern": "x"}, {"rule": "format", "pattern": "y"})
    ) == [
        "env",
        "format_1",
        "format_2",
    ]
    with pytest.raises(RuleError, match="distinct"):
        rule_names(parse({"rule": "env", "name": "a"}, {"rule": "format", "pattern": "x", "name": "a"}))


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"rule": "format"}, "needs a pattern"),
        ({"rule": "format", "pattern": "("}, "bad pattern"),
        ({"rule": "match"}, "needs expected"),
        ({"rule": "python"}, "needs ref"),
        ({"rule": "judge"}, "needs a judge"),
    ],
)
def test_a_rule_missing_what_it_needs_fails_before_anything_runs(rule, message):
    with pytest.raises(RuleError, match=message):
        rules(rule)


async def test_a_part_that_cannot_be_computed_is_an_error_never_zero():
    with pytest.raises(RuleError, match="no reward"):
        await rules({"rule": "env"}).evaluate(_no_env())
    with pytest.raises(RuleError, match="no 'missing'"):
        await rules({"rule": "match", "expected": "{missing}"}).evaluate(episode())
    with pytest.raises(RuleError, match="non-finite"):
        await rules({"rule": "python", "ref": "test_rules:nan_rule"}).evaluate(episode())


def _no_env() -> Episode:
    ep = episode()
    ep.env_reward = None
    return ep


def nan_rule(ep: Episode) -> float:
    return float("nan")


def test_transcript_interleaves_replies_and_tools_in_order():
    ep = episode()
    ep.tools[0].after = 1  # the search came after the first reply
    ep.tools[1].after = ep.tools[2].after = 2
    lines = ep.transcript().splitlines()
    assert lines[0] == "TASK: What is six times seven?"
    assert [line.split(" ")[0] for line in lines[1:]] == [
        "ASSISTANT",
        "TOOL",
        "ASSISTANT",
        "TOOL",
        "TOOL",
        "ASSISTANT",
        "FINAL",
    ]


def test_the_recorder_folds_an_episodes_events_and_forgets_abandoned_ones():
    from platoon.bus.events import (
        EpisodeAbandoned,
        EpisodeFinished,
        EpisodeStarted,
        ModelCallFinished,
        ToolCalled,
        ToolReturned,
    )
    from platoon.rewards import EpisodeRecorder

    task = TaskRef(env="t", split="train", task_id="0")

    def call(agent, text, kind="policy"):
        return ModelCallFinished(
            call_id=text,
            episode_id="e",
            agent_id=agent,
            prompt_tokens=[1],
            completion_tokens=[2, 3],
            logprobs=[-1.0, -1.0],
            stop_reason="stop",
            policy_version=0,
            kind=kind,
            completion_text=text,
        )

    recorder = EpisodeRecorder()
    asked = ToolCalled(episode_id="e", agent_id="root", env="t", name="say", arguments={"x": 1})
    for event in [
        EpisodeStarted(episode_id="e", group_id="g", task=task, root_agent_id="root", instruction="go"),
        ToolCalled(episode_id="e", agent_id="root", env="t", name="early"),  # before any call: no turn
        call("root", "one"),
        asked,
        ToolReturned(
            reply_to=asked.request_id, episode_id="e", agent_id="root", name="say", output="ok", reward=0.5
        ),
        ToolReturned(reply_to="other", episode_id="e", agent_id="root", name="say", reward=0.25),
        call("judge", "Score: 3", kind="judge"),  # a judge's call is no turn
        call("root", "two"),
        call("kid", "three"),
    ]:
        recorder.see(event)
    ep = recorder.pop(
        EpisodeFinished(episode_id="e", group_id="g", task=task, status="completed", final_message="two")
    )
    assert [r.text for r in ep.replies] == ["one", "two", "three"] and ep.sampled_tokens == 6
    assert ep.turn_rewards == {"root": [0.75, 0.0], "kid": [0.0]}
    assert [(t.name, t.after, t.output, t.reward) for t in ep.tools] == [
        ("early", 0, "", None),
        ("say", 1, "ok", 0.5),
    ]
    assert ep.final_answer == "two" and recorder.episodes == {} and recorder._calls == {}
    recorder.see(EpisodeStarted(episode_id="f", group_id="g", task=task, root_agent_id="r", instruction="go"))
    recorder.see(EpisodeAbandoned(episode_id="f", group_id="g", task=task, reason="lease lost"))
    assert recorder.episodes == {}


async def test_a_rule_function_that_raises_is_the_episodes_failure():
    with pytest.raises(RuleError, match="reward rule 'python' raised KeyError"):
        await rules({"rule": "python", "ref": "test_rules:raising_rule"}).evaluate(episode())


def raising_rule(ep: Episode) -> float:
    raise KeyError("score")

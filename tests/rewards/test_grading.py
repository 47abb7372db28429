"""Rules and judges inside the grader, on a running system: the parts land in
`EpisodeGraded.rewards`, the judge's reasoning in `notes`, its calls are recorded as `judge`,
mid-episode tool rewards become `turn_rewards`, and a failing part leaves the episode ungraded."""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "programs"))

from programs_helpers import toy_system

from platoon.bus.events import EpisodeGraded, ModelCallFinished
from platoon.config.schema import JudgeConfig, RewardConfig
from platoon.gateway.renderers import get_renderer
from platoon.rewards import Judge, RewardRules, SamplerJudgeModel
from platoon.testing.policies import ScriptedSampler

pytestmark = pytest.mark.anyio


def a_judge(tokenizer, reply: str, **cfg) -> Judge:
    config = msgspec.convert({"rubric": "Did it find the number? {transcript}", **cfg}, JudgeConfig)
    renderer = get_renderer("qwen3_instruct", tokenizer)
    return Judge(config, SamplerJudgeModel(ScriptedSampler(tokenizer, lambda m: reply), renderer))


def rules(tokenizer, *items, judge_reply="It found it quickly. Score: 9") -> RewardRules:
    config = msgspec.convert({"rules": list(items)}, RewardConfig)
    return RewardRules(config, entry_judge=a_judge(tokenizer, judge_reply))


def graded(events) -> EpisodeGraded:
    (event,) = [e for e in events if isinstance(e, EpisodeGraded)]
    return event


async def test_rules_and_a_judge_grade_an_episode_with_every_part_kept(toy_tokenizer):
    entry_rules = rules(
        toy_tokenizer,
        {"rule": "env", "weight": 1.0},
        {"rule": "judge", "weight": 0.5},
        {"rule": "tool_penalty", "per_call": -0.1, "free_calls": 2},
        # the final answer is the env's "correct"; {secret} makes the grader fetch the task's spec
        {"rule": "match", "kind": "regex", "expected": "^(correct|{secret})$", "name": "found"},
    )
    async with toy_system(toy_tokenizer, rules={"toy": entry_rules}) as toy:
        events = await toy.play("train-5")  # secret 6: guesses 7, 3, 5, 6
    event = graded(events)
    assert event.rewards == pytest.approx(
        {"env": 1.0, "rule/env": 1.0, "rule/judge": 0.9, "rule/tool_penalty": -0.2, "rule/found": 1.0}
    )
    assert event.reward == pytest.approx(1.0 + 0.45 - 0.2 + 1.0)
    assert event.notes == {"judge": "It found it quickly. Score: 9"}
    judge_calls = [e for e in events if isinstance(e, ModelCallFinished) and e.kind == "judge"]
    assert len(judge_calls) == 1 and judge_calls[0].agent_id == "judge"
    assert "<transcript>" in toy_tokenizer.decode(judge_calls[0].prompt_tokens)
    # the toy env pays 0 for each wrong guess and 1 for the right one, on the root's fourth call
    (root,) = event.turn_rewards
    assert event.turn_rewards[root] == [0.0, 0.0, 0.0, 1.0]


def secret_found(episode) -> float:
    """A python rule that reads the task's spec (the toy env's secret) and the final answer."""
    return float(episode.task_spec.get("secret") == 6 and episode.final_answer == "correct")


async def test_a_python_rule_sees_the_tasks_spec(toy_tokenizer):
    entry_rules = rules(
        toy_tokenizer, {"rule": "python", "ref": "test_grading:secret_found", "name": "found"}
    )
    assert entry_rules.needs_task_spec  # no `match` rule names a field: the python rule alone asks
    async with toy_system(toy_tokenizer, rules={"toy": entry_rules}) as toy:
        event = graded(await toy.play("train-5"))  # secret 6
    assert event.rewards == {"env": 1.0, "rule/found": 1.0}


async def test_a_judge_alone_is_the_reward(toy_tokenizer):
    entry_rules = rules(toy_tokenizer, {"rule": "judge"}, judge_reply="Score: 3")
    async with toy_system(toy_tokenizer, rules={"toy": entry_rules}) as toy:
        event = graded(await toy.play())
    assert event.reward == pytest.approx(0.3)


async def test_a_judge_that_cannot_score_leaves_the_episode_ungraded(toy_tokenizer):
    entry_rules = rules(toy_tokenizer, {"rule": "env"}, {"rule": "judge"}, judge_reply="I refuse to grade.")
    async with toy_system(toy_tokenizer, rules={"toy": entry_rules}) as toy:
        event = graded(await toy.play())
        assert await toy.all_closed()
    assert event.reward is None
    assert event.reason.startswith(
        "reward rules failed: judge 'judge' failed: the judge gave no score in 3 tries"
    )
    assert event.turn_rewards == {}


async def test_rules_apply_only_to_their_environment(toy_tokenizer):
    async with toy_system(toy_tokenizer, rules={"elsewhere": rules(toy_tokenizer, {"rule": "judge"})}) as toy:
        event = graded(await toy.play())
    assert (event.reward, event.rewards, event.notes) == (1.0, {}, {})


async def test_a_per_turn_judge_scores_each_turn_and_credits_it(toy_tokenizer):
    def by_turn(messages) -> str:
        """Scores the episode as far as it went: 2 points per assistant turn so far."""
        return f"Score: {2 * messages[-1]['content'].count('ASSISTANT (')}"

    config = msgspec.convert({"rubric": "{transcript}", "per_turn": True}, JudgeConfig)
    judge = Judge(
        config,
        SamplerJudgeModel(
            ScriptedSampler(toy_tokenizer, by_turn), get_renderer("qwen3_instruct", toy_tokenizer)
        ),
    )
    entry_rules = RewardRules(
        msgspec.convert({"rules": [{"rule": "env"}, {"rule": "judge", "weight": 2.0}]}, RewardConfig),
        entry_judge=judge,
    )
    async with toy_system(toy_tokenizer, rules={"toy": entry_rules}) as toy:
        event = graded(await toy.play("train-5"))  # four turns: scored 0.2, 0.4, 0.6, 0.8
    assert event.rewards["rule/judge"] == pytest.approx(0.5)
    assert event.reward == pytest.approx(1.0 + 2.0 * 0.5)
    (root,) = event.turn_rewards
    # the env pays 1 on the fourth turn; the judge's weighted turn scores, a quarter each
    assert event.turn_rewards[root] == pytest.approx([0.1, 0.2, 0.3, 1.4])
    assert sum(event.turn_rewards[root]) == pytest.approx(event.reward)
    assert event.notes["judge"].startswith("[turn 1: 0.2] Score: 2")


async def test_a_judge_reads_sandbox_files_before_the_grade(toy_tokenizer):
    prompts = []

    def reads_the_file(messages) -> str:
        prompts.append(messages[-1]["content"])
        return "Score: 10" if "the secret is 6" in messages[-1]["content"] else "Score: 0"

    config = msgspec.convert(
        {"rubric": "Files: {files}", "files": ["/notes/secret.txt", "/nowhere"]}, JudgeConfig
    )
    judge = Judge(
        config,
        SamplerJudgeModel(
            ScriptedSampler(toy_tokenizer, reads_the_file), get_renderer("qwen3_instruct", toy_tokenizer)
        ),
    )
    entry_rules = RewardRules(
        msgspec.convert({"rules": [{"rule": "judge"}]}, RewardConfig), entry_judge=judge
    )
    async with toy_system(toy_tokenizer, rules={"toy": entry_rules}) as toy:
        events = await toy.play("train-5")
    assert graded(events).reward == 1.0
    (prompt,) = prompts
    assert "<file>\n/notes/secret.txt\nthe secret is 6\n</file>" in prompt
    assert "[could not read /nowhere: FileNotFoundError: /nowhere]" in prompt

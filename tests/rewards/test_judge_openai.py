"""A judge behind an OpenAI-compatible endpoint, through the real `openai` client: platoon's own
gateway serves a scripted policy that answers scores, on 127.0.0.1. The judge config is read as a
config file states it; its key comes from the environment variable it names."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))

from test_gateway import running_gateway

from platoon.bus import Bus
from platoon.bus.events import ModelCallFinished, TaskRef
from platoon.config import entry_names, validate_config
from platoon.rewards import Episode, RuleError, build_reward_rules

asyncio_only = pytest.mark.parametrize("anyio_backend", ["asyncio"])

EPISODE = Episode(
    episode_id="e1",
    group_id="g",
    task=TaskRef(env="essays", split="train", task_id="0"),
    instruction="Write one sentence about the sea.",
    final_answer="The sea is wide and deep.",
    env_reward=None,
)


def _rules(c):
    return build_reward_rules(dict(zip(entry_names(c), c.environments, strict=True)))


def config(base_url: str, **judge):
    return validate_config(
        {
            "environments": [
                {
                    "name": "essays",
                    "service": "python://nowhere:Essays",
                    "judge": {
                        "base_url": base_url,
                        "model": "platoon-policy",
                        "api_key_env": "PLATOON_TEST_JUDGE_KEY",
                        "rubric": "Is {final_answer} a good answer to {task}?",
                        **judge,
                    },
                }
            ]
        }
    )


@pytest.mark.anyio
@asyncio_only
async def test_a_judge_through_an_openai_compatible_endpoint(toy_tokenizer, monkeypatch):
    replies = iter(["Vivid enough. Score: 7", "Plain. Score: 5"])
    async with running_gateway(toy_tokenizer, lambda m: next(replies), serve_http=True) as gw:
        opened = await gw.open("judge-session", "judge")
        monkeypatch.setenv("PLATOON_TEST_JUDGE_KEY", opened.key)
        rules = _rules(config(opened.base_url, samples=2, max_concurrent=1))["essays"]
        try:
            async with Bus() as bus, bus.stream(ModelCallFinished) as recorded:
                outcome = await rules.evaluate(EPISODE, bus)
                ours = [await recorded.receive() for _ in range(2)]
        finally:
            await rules.aclose()  # the judge's openai client
        served = list(gw.records)
    assert outcome.reward == pytest.approx(0.6)
    assert outcome.parts == pytest.approx({"judge": 0.6})
    assert "Vivid enough. Score: 7" in outcome.notes["judge"] and "Plain. Score: 5" in outcome.notes["judge"]
    # the endpoint saw the fenced rubric; our bus recorded the judge's calls, as `judge`
    prompt = toy_tokenizer.decode(served[0].prompt_tokens)
    assert "<final_answer>\nThe sea is wide and deep.\n</final_answer>" in prompt
    assert {(c.kind, c.agent_id, c.episode_id) for c in ours} == {("judge", "judge", "e1")}
    assert sorted(c.completion_text for c in ours) == ["Plain. Score: 5", "Vivid enough. Score: 7"]


@pytest.mark.anyio
@asyncio_only
async def test_a_wrong_key_fails_the_judge_and_never_scores_zero(toy_tokenizer, monkeypatch):
    async with running_gateway(toy_tokenizer, lambda m: "Score: 9", serve_http=True) as gw:
        opened = await gw.open("judge-session", "judge")
        monkeypatch.setenv("PLATOON_TEST_JUDGE_KEY", "pt-not-the-key")
        rules = _rules(config(opened.base_url, retries=1))["essays"]
        with pytest.raises(RuleError, match=r"judge 'judge' failed: .*2 tries.*AuthenticationError"):
            await rules.evaluate(EPISODE)
        await rules.aclose()
        assert gw.records == []


def test_a_missing_key_variable_is_an_error_at_start(monkeypatch):
    monkeypatch.delenv("PLATOON_TEST_JUDGE_KEY", raising=False)
    with pytest.raises(RuleError, match="PLATOON_TEST_JUDGE_KEY is not set"):
        _rules(config("http://127.0.0.1:9/v1"))

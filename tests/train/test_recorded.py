"""Recorded episodes read back for SFT (`platoon.train.recorded`): the datums are the exact
recorded tokens, weighted 1 only where the sampler produced them; `--where` keeps what it says
and says what it saw when it keeps nothing; another tokenizer's tokens are refused."""

from __future__ import annotations

import json

import pytest
from recordings import record

from platoon.bus import read_events
from platoon.bus.events import ModelCallFinished, ToolReturned
from platoon.models.loading import tokenizer_identity
from platoon.train.recorded import (
    RecordedError,
    Where,
    check_tokenizer,
    heldout_episodes,
    read_run,
    rewards_seen,
    sft_datums,
)


def everyone(episode, agent):
    return "default"


@pytest.fixture
def expert(site):
    return record(site / "expert", "bisect")


@pytest.fixture
def babbler(site):
    return record(site / "babbler", "babble", tasks=8)


def test_an_agents_turns_merge_into_one_datum_weighted_on_exactly_its_sampled_tokens(expert, toy_tokenizer):
    run = read_run(expert)
    assert len(run.episodes) == 16
    assert all(e.reward == 1.0 and e.purpose == "eval" and e.split == "train" for e in run.episodes)
    datums = sft_datums(run.episodes, everyone)["default"]
    assert len(datums) == 16  # one agent per episode, its turns chained into one sequence
    calls = {}
    for event in read_events(expert):
        if isinstance(event, ModelCallFinished):
            calls.setdefault(event.episode_id, []).append(event)
    tool_outputs = [e.output for e in read_events(expert) if isinstance(e, ToolReturned)]
    assert any("higher" in o or "lower" in o for o in tool_outputs)
    assert sum(len(calls[d.episode_id]) >= 3 for d in datums) >= 12  # turns with tool results between
    for datum in datums:
        recorded = calls[datum.episode_id]
        sequence = [*datum.model_input, datum.target_tokens[-1]]
        # The sequence is the recorded tokens themselves: each call's prompt extends the last.
        expected, sampled = [], []
        for call in recorded:
            new = call.prompt_tokens[len(expected) :]
            assert call.prompt_tokens[: len(expected)] == expected
            expected += new
            sampled += [0.0] * len(new)
            expected += call.completion_tokens
            sampled += [1.0] * len(call.completion_tokens)
        assert sequence == expected
        assert datum.target_tokens == expected[1:]
        assert datum.weights == sampled[1:]  # 1 on sampled tokens; prompts and tool results 0
        assert datum.num_trained_tokens == sum(len(c.completion_tokens) for c in recorded)
        unweighted = toy_tokenizer.decode(
            [t for t, w in zip(datum.target_tokens, datum.weights, strict=True) if not w]
        )
        weighted = toy_tokenizer.decode(
            [t for t, w in zip(datum.target_tokens, datum.weights, strict=True) if w]
        )
        assert "<tool_call>" in weighted and "<tool_response>" not in weighted and "user" not in weighted
        if len(recorded) >= 2:  # the tool's answers sit between the turns, unweighted
            assert unweighted.count("<tool_response>") == len(recorded) - 1


def test_where_keeps_the_episodes_it_names(expert, babbler):
    episodes = read_run(expert).episodes + read_run(babbler).episodes
    kept = lambda *exprs: [e for e in episodes if Where.parse(exprs).keeps(e)]  # noqa: E731
    assert len(kept("reward>=1")) == 16
    assert {e.source for e in kept("reward>=1")} == {str(expert)}
    assert len(kept("reward<1")) == 8 == len(kept("reward==0")) == len(kept("reward!=1"))
    assert len(kept("eval")) == 24 == len(kept("split=train")) == len(kept("role=root"))
    assert kept("train") == [] == kept("split=test") == kept("role=critic")
    assert len(kept("env=numbers", "reward > 0.5")) == 16  # flags and terms must all hold
    assert len(kept("eval, reward>=1")) == 16
    assert len(kept("status=completed")) == 24
    assert len(kept(f"task={episodes[0].task_id}")) >= 1
    assert rewards_seen(episodes) == "rewards 0 x8, 1 x16"


def test_an_unknown_filter_says_which_there_are():
    with pytest.raises(RecordedError, match=r"--where 'reward~1' is not a filter.*reward>=1.*split=NAME"):
        Where.parse(["reward~1"])
    with pytest.raises(RecordedError, match="'colour=red'"):
        Where.parse(["eval,colour=red"])


def test_held_out_episodes_are_a_share_chosen_by_the_seed(expert):
    episodes = read_run(expert).episodes
    held = heldout_episodes(episodes, 0.25, seed=1)
    assert len(held) == 4
    assert heldout_episodes(list(reversed(episodes)), 0.25, seed=1) == held  # not by order
    assert heldout_episodes(episodes, 0.25, seed=2) != held
    assert heldout_episodes(episodes, 0.0, seed=1) == set()
    assert len(heldout_episodes(episodes[:2], 0.9, seed=1)) == 1  # one always trains


def test_the_agent_filter_and_the_policy_choice_pick_what_trains(expert):
    episodes = read_run(expert).episodes
    assert len(sft_datums(episodes, everyone, agent="root")["default"]) == 16
    assert len(sft_datums(episodes, everyone, agent="platoon-react")["default"]) == 16
    assert sft_datums(episodes, everyone, agent="planner") == {}
    assert sft_datums(episodes, lambda e, a: None) == {}


def test_another_tokenizers_tokens_are_refused_naming_both(expert, qwen3_tokenizer, toy_tokenizer):
    run = read_run(expert)
    lock = json.loads((expert / "lock.json").read_text())
    assert lock["tokenizer"]["name"] == "platoon-toy-qwen3"
    check_tokenizer(run, "default", tokenizer_identity(toy_tokenizer, "/models/tiny"))  # one vocabulary
    qwen = tokenizer_identity(qwen3_tokenizer, "Qwen/Qwen3-4B")
    with pytest.raises(
        RecordedError,
        match=r"tokenized with 'platoon-toy-qwen3', but the policy uses the tokenizer 'Qwen/Qwen3-4B'",
    ):
        check_tokenizer(run, "default", qwen)

"""Context compaction: the `compacting` program and `CompactingContext` summarize the history
past a token threshold with an `aux` call, and training datums split exactly there."""

from __future__ import annotations

from typing import Any

import pytest
from tree_helpers import Delegating, tool_call, tree_system

from platoon import harness
from platoon.bus.events import AgentFinished, EpisodeFinished, EpisodeGraded, ModelCallFinished
from platoon.credit import CreditConfig
from platoon.harness import AgentContext, AgentResult
from platoon.harness.compaction import (
    SUMMARIZER_SYSTEM,
    SUMMARY_HEADER,
    SUMMARY_PROMPT,
    CompactingContext,
    CompactionError,
    CompactionOptions,
)
from platoon.programs import EntrySettings, EpisodeRunner, ProgramError

pytestmark = pytest.mark.anyio

OBSERVATION = "observation {turn}: " + "lorem ipsum " * 10


@harness("compact-test-chatter")
async def chatter(ctx: AgentContext) -> AgentResult:
    """Talks for as many turns as its task id says, each answer followed by a long observation."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": ctx.instruction}]
    for turn in range(int(ctx.task.task_id)):
        reply = await ctx.chat(messages)
        messages.append({"role": "assistant", "content": reply.text})
        messages.append({"role": "user", "content": OBSERVATION.format(turn=turn)})
    return AgentResult("completed", final_message=str(getattr(ctx, "compactions", None)))


class Recording:
    """A policy that answers `step N` (or a summary) and keeps every prompt it was shown."""

    def __init__(self) -> None:
        self.prompts: list[list[dict[str, Any]]] = []

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        self.prompts.append(messages)
        if messages[0] == {"role": "system", "content": SUMMARIZER_SYSTEM}:
            return "SUMMARY: said steps, saw observations."
        return f"step {len(self.prompts)}"


async def chat_episode(tokenizer, turns: int, **entry: Any):
    policy = Recording()
    credit = CreditConfig(remove_constant_groups=False)
    async with tree_system(
        tokenizer, policy, harness="compact-test-chatter", tasks=[str(turns)], credit=credit, **entry
    ) as system:
        events = await system.play(str(turns))
        await system.bus.drained()
    return events, policy, system.batches


def calls_of(events) -> list[ModelCallFinished]:
    return [e for e in events if isinstance(e, ModelCallFinished)]


async def test_compaction_summarizes_and_splits_the_datums_exactly_there(toy_tokenizer):
    # Measure the prompts without compaction, then compact once a prompt is longer than call 2's.
    plain, _, _ = await chat_episode(toy_tokenizer, 5, program="single")
    sizes = [len(c.prompt_tokens) for c in calls_of(plain)]
    assert sizes == sorted(sizes) and len(set(sizes)) == 5

    options = {"compact_at_tokens": sizes[1]}
    # max_steps 5: the summary call must not count against the budget.
    events, policy, [batch] = await chat_episode(
        toy_tokenizer, 5, program="compacting", program_options=options, max_steps=5
    )
    calls = calls_of(events)
    assert [c.kind for c in calls] == ["policy", "policy", "policy", "aux", "policy", "policy"]
    finished = next(e for e in events if isinstance(e, EpisodeFinished))
    assert (finished.status, finished.final_message, finished.num_model_calls) == ("completed", "1", 5)

    # Calls 1-3 saw the whole history; call 3's prompt passed the threshold, so the history was
    # summarized (the summarizer's system message, the conversation, the request) ...
    instruction = policy.prompts[0][0]["content"]
    summary_request = policy.prompts[3]
    assert summary_request[0]["content"] == SUMMARIZER_SYSTEM
    assert summary_request[1:-1] == policy.prompts[2] + [
        {"role": "assistant", "content": "step 3"},
        {"role": "user", "content": OBSERVATION.format(turn=2)},
    ]
    assert summary_request[-1] == {"role": "user", "content": SUMMARY_PROMPT}
    # ... and the agent went on from the instruction and the summary, then what came after.
    compacted = f"{instruction}\n\n{SUMMARY_HEADER}\nSUMMARY: said steps, saw observations."
    assert policy.prompts[4] == [{"role": "user", "content": compacted}]
    assert policy.prompts[5] == [
        {"role": "user", "content": compacted},
        {"role": "assistant", "content": "step 5"},
        {"role": "user", "content": OBSERVATION.format(turn=3)},
    ]
    assert len(calls[4].prompt_tokens) < sizes[1]

    # Prefix merging: calls 1-3 are one datum, the summary call one of its own, calls 4-5 one.
    datums = batch.datums
    assert len(datums) == 3
    for datum, chain in zip(datums, [calls[0:3], calls[3:4], calls[4:6]], strict=True):
        full = chain[-1].prompt_tokens + chain[-1].completion_tokens
        assert datum.model_input == full[:-1]
        sampled = [t for t, w in zip(datum.target_tokens, datum.weights, strict=True) if w]
        assert sampled == [t for c in chain for t in c.completion_tokens]
        assert datum.logprobs[-1] == chain[-1].logprobs[-1]
    assert batch.stats["credit/calls"] == 6


async def test_no_compaction_below_the_threshold(toy_tokenizer):
    events, _, [batch] = await chat_episode(
        toy_tokenizer, 3, program="compacting", program_options={"compact_at_tokens": 100_000}
    )
    assert [c.kind for c in calls_of(events)] == ["policy"] * 3
    assert len(batch.datums) == 1
    assert next(e for e in events if isinstance(e, EpisodeFinished)).final_message == "0"


async def test_compaction_compacts_again_and_bounds_the_summary(toy_tokenizer):
    events, policy, _ = await chat_episode(
        toy_tokenizer,
        8,
        program="compacting",
        program_options={"compact_at_tokens": 1, "summary_max_tokens": 3, "summary_prompt": "Sum up."},
    )
    calls = calls_of(events)
    # Every prompt passes 1 token: a summary before every policy call but the first.
    assert [c.kind for c in calls] == ["policy"] + ["aux", "policy"] * 7
    assert all(len(c.completion_tokens) <= 3 for c in calls if c.kind == "aux")
    assert all(p[-1] == {"role": "user", "content": "Sum up."} for p in policy.prompts[1::2])
    # A later summary request sees the previous summary, not the history it replaced.
    assert policy.prompts[3][1]["content"].startswith(
        policy.prompts[0][0]["content"] + "\n\n" + SUMMARY_HEADER
    )
    assert next(e for e in events if isinstance(e, EpisodeFinished)).final_message == "7"


def finishing_after_a_summary(plan: Any) -> Any:
    """`plan`, except that a summary request gets a summary and a compacted agent finishes."""

    def policy(messages: list[dict[str, Any]]) -> str:
        if messages[0]["content"] == SUMMARIZER_SYSTEM:
            return "The notes are written."
        if SUMMARY_HEADER in str(messages[-1].get("content")):
            return tool_call("finish")
        return plan(messages)

    return policy


def prompt_sizes(events) -> dict[str, list[int]]:
    sizes: dict[str, list[int]] = {}
    for call in calls_of(events):
        sizes.setdefault(call.agent_id, []).append(len(call.prompt_tokens))
    return sizes


async def test_react_compacts_a_tool_calling_history(toy_tokenizer):
    def plan(messages: list[dict[str, Any]]) -> str:
        done = sum(1 for m in messages if m["role"] == "assistant")
        return tool_call("write", text="ab"[done]) if done < 2 else tool_call("finish")

    policy = finishing_after_a_summary(plan)
    async with tree_system(toy_tokenizer, policy, program="single") as system:
        [sizes] = prompt_sizes(await system.play("ab")).values()
    # Compact once a prompt is longer than the first: before the third call.
    options = {"compact_at_tokens": sizes[0]}
    async with tree_system(toy_tokenizer, policy, program="compacting", program_options=options) as system:
        events = await system.play("ab")
    assert [c.kind for c in calls_of(events)] == ["policy", "policy", "aux", "policy"]
    assert next(e for e in events if isinstance(e, EpisodeGraded)).reward == 1.0


async def test_recursive_agents_compact_too(toy_tokenizer):
    policy = finishing_after_a_summary(Delegating(levels=1))
    agents = {"child_reward": "own"}
    async with tree_system(toy_tokenizer, policy, agents=agents) as system:
        events = await system.play("ab")
    sizes = prompt_sizes(events)
    root = next(a for a, s in sizes.items() if len(s) == 3)
    # A threshold the root's second prompt passes and no child's first: only the root compacts.
    threshold = max(s[0] for s in sizes.values())
    assert sizes[root][1] > threshold
    options = {"compaction": {"compact_at_tokens": threshold}}
    async with tree_system(toy_tokenizer, policy, program_options=options, agents=agents) as system:
        events = await system.play("ab")
    kinds: dict[str, list[str]] = {}
    for call in calls_of(events):
        kinds.setdefault(call.agent_id, []).append(call.kind)
    assert sorted(kinds.values(), key=len) == [
        ["policy", "policy"],
        ["policy", "policy"],
        ["policy", "policy", "aux", "policy"],
    ]
    assert {e.reward for e in events if isinstance(e, AgentFinished) and e.reward is not None} == {1.0}
    assert next(e for e in events if isinstance(e, EpisodeGraded)).reward == 1.0


def test_the_view_keeps_system_messages_and_starts_over_with_a_new_history():
    ctx = CompactingContext.__new__(CompactingContext)
    ctx.instruction = "fallback"
    ctx.summary, ctx._cut = "S", 3
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Task."},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "b"},
    ]
    assert ctx.view(messages) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": f"Task.\n\n{SUMMARY_HEADER}\nS"},
        {"role": "user", "content": "b"},
    ]


def test_bad_options_fail_before_anything_runs():
    with pytest.raises(CompactionError, match="compact_at_tokens must be at least 1, got 0"):
        CompactionOptions(compact_at_tokens=0)
    entry = EntrySettings(name="n", harness="compact-test-chatter", program="compacting")
    with pytest.raises(ProgramError, match="missing required field compact_at_tokens"):
        EpisodeRunner([entry])
    entry.program_options = {"compact_at_tokens": 10, "summary_max_tokens": 0}
    with pytest.raises(ProgramError, match="summary_max_tokens must be at least 1"):
        EpisodeRunner([entry])

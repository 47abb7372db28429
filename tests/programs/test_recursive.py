"""The recursive program end to end: trees several levels deep, every limit, every fork mode,
a command-line harness as a subagent, and the tree's credit through the credit assigner."""

from __future__ import annotations

import shutil
import textwrap
import time

import anyio
import pytest
from tree_helpers import Delegating, Notes, SubNotes, tree_system

from platoon import harness
from platoon.bus.events import (
    AgentFinished,
    AgentSpawned,
    EpisodeFinished,
    EpisodeGraded,
    ModelCallFinished,
    ToolCalled,
    ToolReturned,
)
from platoon.cli.tree import render_tree
from platoon.harness import AgentContext, AgentResult, BudgetExhausted
from platoon.programs import EntrySettings, EpisodeRunner, ProgramError

pytestmark = pytest.mark.anyio


def of(events, kind):
    return [e for e in events if isinstance(e, kind)]


def tree_of(events) -> dict[str, tuple[str | None, int]]:
    return {e.agent_id: (e.parent_id, e.depth) for e in of(events, AgentSpawned)}


# --- trees --------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_depth", [2, 3])
async def test_react_agents_delegate_down_to_the_depth_limit(toy_tokenizer, max_depth):
    policy = Delegating(levels=max_depth)
    agents = {"max_depth": max_depth, "child_reward": "own"}
    async with tree_system(toy_tokenizer, policy, agents=agents) as system:
        events = await system.play("ab")

    tree = tree_of(events)
    spawned = of(events, AgentSpawned)
    root = spawned[0]
    assert (root.parent_id, root.depth) == (None, 0)
    # One chain per note: root -> depth 1 -> ... -> depth max_depth, which writes the note.
    assert len(tree) == 1 + 2 * max_depth
    assert sorted(depth for _, depth in tree.values()) == [0, *sorted(list(range(1, max_depth + 1)) * 2)]
    for agent_id, (parent, depth) in tree.items():
        if parent is not None:
            assert tree[parent][1] == depth - 1
            assert sum(1 for p, _ in tree.values() if p == agent_id) == (depth < max_depth)
    leaves = [e for e in spawned if e.depth == max_depth]
    assert sorted(e.instruction for e in leaves) == ["via 0: write note a", "via 0: write note b"]

    finished = {e.agent_id: e for e in of(events, AgentFinished)}
    assert set(finished) == set(tree)
    assert all(e.status == "completed" for e in finished.values())
    # Subagents are graded on their own notes; the root's grade is the episode's.
    assert {e.reward for a, e in finished.items() if a != root.agent_id} == {1.0}
    assert finished[root.agent_id].reward is None
    assert of(events, EpisodeGraded)[0].reward == 1.0
    # Every agent's AgentFinished comes after its children's.
    order = [e.agent_id for e in of(events, AgentFinished)]
    for agent_id, (parent, _) in tree.items():
        if parent is not None:
            assert order.index(agent_id) < order.index(parent)

    # The spawn calls are published like env tool calls, with env "" (answered by platoon).
    spawns = [e for e in of(events, ToolCalled) if e.name == "spawn_subagent"]
    assert len(spawns) == 2 * max_depth and {e.env for e in spawns} == {""}
    returned = [e for e in of(events, ToolReturned) if e.name == "spawn_subagent"]
    assert {r.reply_to for r in returned} == {s.request_id for s in spawns}
    assert all(r.output.startswith("Subagent finished: ") for r in returned)

    text = render_tree(events)
    assert text.count("─ agent ") == len(tree)
    assert f"depth {max_depth} harness platoon-react" in text
    assert text.count("tool spawn_subagent(") == 2 * max_depth
    # A child is printed right under the spawn call that made it, its parent's result after it.
    lines = text.splitlines()
    first_spawn = next(i for i, line in enumerate(lines) if "tool spawn_subagent(" in line)
    assert "depth 1 harness" in lines[first_spawn + 1]
    assert "instruction: via" in lines[first_spawn + 2]
    assert "[own reward 1]" in text
    # The summary counts the whole tree's model calls, and says how many were the root's.
    root_calls = sum(1 for e in of(events, ModelCallFinished) if e.agent_id == root.agent_id)
    footer = f"after {len(of(events, ModelCallFinished))} model calls ({len(tree)} agents; the root made {root_calls})"
    assert footer in text


@harness("tree-test-descend")
async def descend(ctx: AgentContext) -> AgentResult:
    """Spawns one child of itself, which spawns one of its own, until a spawn is refused."""
    tools = [t.name for t in await ctx.list_tools()]
    result = await ctx.spawn(f"descend from depth {ctx.depth}")
    return AgentResult(
        "completed",
        final_message=f"depth {ctx.depth} tools {tools} -> {result.reason or result.final_message}",
    )


async def test_a_spawn_at_the_depth_limit_is_refused_and_no_spawn_tool_is_offered(toy_tokenizer):
    async with tree_system(toy_tokenizer, [], harness="tree-test-descend", agents={"max_depth": 2}) as system:
        events = await system.play()

    tree = tree_of(events)
    assert sorted(depth for _, depth in tree.values()) == [0, 1, 2]
    # Each agent's final message ends with its child's: only the deepest has no spawn tool, and
    # its spawn is refused with the reason.
    assert of(events, EpisodeFinished)[0].final_message == (
        "depth 0 tools ['finish', 'read', 'write', 'spawn_subagent'] -> "
        "depth 1 tools ['finish', 'read', 'write', 'spawn_subagent'] -> "
        "depth 2 tools ['finish', 'read', 'write'] -> "
        "spawn refused: the depth limit (2) is reached: an agent at depth 2 cannot spawn"
    )


async def test_the_single_program_does_not_spawn(toy_tokenizer):
    async with tree_system(toy_tokenizer, [], harness="tree-test-descend", program="single") as system:
        events = await system.play()
    assert len(of(events, AgentSpawned)) == 1
    assert of(events, EpisodeFinished)[0].final_message.endswith(
        "-> this episode's program does not spawn subagents"
    )


# --- limits -------------------------------------------------------------------------------------

running = {"now": 0, "peak": 0}


@harness("tree-test-sleeper")
async def sleeper(ctx: AgentContext) -> AgentResult:
    running["now"] += 1
    running["peak"] = max(running["peak"], running["now"])
    try:
        await anyio.sleep(float(ctx.instruction.split()[-1]))
    finally:
        running["now"] -= 1
    return AgentResult("completed", final_message="slept")


@harness("tree-test-fan-out")
async def fan_out(ctx: AgentContext) -> AgentResult:
    """Spawns the subagents its instruction asks for at once: `N x SECONDS`."""
    results: list[AgentResult] = []

    async def one(seconds: str) -> None:
        results.append(await ctx.spawn(f"sleep {seconds}", harness="tree-test-sleeper"))

    count, seconds = ctx.task.task_id.split("x")
    async with anyio.create_task_group() as tg:
        for _ in range(int(count)):
            tg.start_soon(one, seconds)
    return AgentResult("completed", final_message=";".join(sorted(r.reason or r.status for r in results)))


async def fan(tokenizer, task_id: str, **agents) -> list:
    async with tree_system(
        tokenizer, [], harness="tree-test-fan-out", agents=agents, tasks=[task_id]
    ) as system:
        return await system.play(task_id)


async def test_max_concurrent_children_bounds_how_many_run_at_once(toy_tokenizer):
    running["peak"] = 0
    started = time.monotonic()
    events = await fan(toy_tokenizer, "6x0.1", max_concurrent_children=2)
    elapsed = time.monotonic() - started
    assert of(events, EpisodeFinished)[0].final_message == ";".join(["completed"] * 6)
    assert running["peak"] == 2
    assert elapsed >= 0.3  # three rounds of two
    assert all(e.harness == "tree-test-sleeper" for e in of(events, AgentSpawned)[1:])


async def test_max_children_refuses_spawns_past_the_limit(toy_tokenizer):
    events = await fan(toy_tokenizer, "5x0", max_children=3)
    results = of(events, EpisodeFinished)[0].final_message.split(";")
    assert results.count("completed") == 3
    assert results.count("spawn refused: the episode has spawned its 3 subagents") == 2
    assert len(of(events, AgentSpawned)) == 1 + 3


async def test_a_child_past_its_timeout_ends_and_the_parent_goes_on(toy_tokenizer):
    started = time.monotonic()
    events = await fan(toy_tokenizer, "2x30", child_timeout=0.2)
    assert time.monotonic() - started < 5
    assert of(events, EpisodeFinished)[0].final_message == ";".join(
        ["the subagent passed its 0.2 s timeout"] * 2
    )
    children = [e for e in of(events, AgentFinished) if e.agent_id != of(events, AgentSpawned)[0].agent_id]
    assert [e.status for e in children] == ["timeout", "timeout"]


@harness("tree-test-spender")
async def spender(ctx: AgentContext) -> AgentResult:
    """Chats while its budget lasts; the root first chats `first` times and then spawns."""
    calls = 0
    messages = [{"role": "user", "content": ctx.instruction}]
    if ctx.depth == 0:
        first, spawns, after = (int(n) for n in ctx.task.task_id.split("-"))
        for _ in range(first):
            await ctx.chat(messages)
        results = [await ctx.spawn(f"spend {i}") for i in range(spawns)]
        for _ in range(after):
            try:
                await ctx.chat(messages)
                calls += 1
            except BudgetExhausted:
                break
        reasons = ";".join(r.reason or f"{r.status}:{r.final_message}" for r in results)
        return AgentResult("completed", final_message=f"{reasons}|root after: {calls}")
    while ctx.budget.remaining() > 0:
        await ctx.chat(messages)
        calls += 1
    return AgentResult("completed", final_message=str(calls))


async def spend(tokenizer, task_id: str, max_steps: int, **agents) -> tuple[list, dict[str, int]]:
    async with tree_system(
        tokenizer,
        lambda m: "ok",
        harness="tree-test-spender",
        agents=agents,
        max_steps=max_steps,
        tasks=[task_id],
    ) as system:
        events = await system.play(task_id)
    calls: dict[str, int] = {}
    for call in of(events, ModelCallFinished):
        calls[call.agent_id] = calls.get(call.agent_id, 0) + 1
    return events, calls


async def test_a_shared_budget_is_the_episodes_pool_with_a_cap_per_child(toy_tokenizer):
    # max_steps 6: the root spends 1, the first child its cap of 3, the second the 2 left;
    # the third spawn is refused, and the root has nothing left either.
    events, calls = await spend(toy_tokenizer, "1-3-1", 6, budget="shared", child_max_steps=3)
    root, *children = [e.agent_id for e in of(events, AgentSpawned)]
    assert [calls.get(a, 0) for a in [root, *children]] == [1, 3, 2]
    assert sum(calls.values()) == 6
    assert of(events, EpisodeFinished)[0].final_message == (
        "completed:3;completed:2;spawn refused: the budget of model calls is used up|root after: 0"
    )


async def test_a_per_depth_budget_gives_each_depth_a_pool_of_its_own(toy_tokenizer):
    # The root's 2 calls are its own; depth 1 shares child_max_steps = 3 among its agents.
    events, calls = await spend(toy_tokenizer, "1-3-5", 2, budget="per_depth", child_max_steps=3)
    root, *children = [e.agent_id for e in of(events, AgentSpawned)]
    assert [calls.get(a, 0) for a in [root, *children]] == [2, 3]
    assert of(events, EpisodeFinished)[0].final_message == (
        "completed:3;spawn refused: the budget of model calls at depth 1 is used up;"
        "spawn refused: the budget of model calls at depth 1 is used up|root after: 1"
    )


# --- forks ----------------------------------------------------------------------------------------


@harness("tree-test-forker")
async def forker(ctx: AgentContext) -> AgentResult:
    """The root writes p and spawns a child that reads the board and writes c; then the root reads."""
    if ctx.depth == 0:
        await ctx.call_tool("write", {"text": "p"})
        child = await ctx.spawn("write note c")
        after = await ctx.call_tool("read")
        return AgentResult(
            "completed", final_message=f"child saw [{child.final_message}] root sees [{after.output}]"
        )
    seen = await ctx.call_tool("read")
    await ctx.call_tool("write", {"text": "c"})
    return AgentResult("completed", final_message=seen.output)


@pytest.mark.parametrize(
    ("env", "fork", "expected"),
    [
        (Notes, "shared", "child saw [p] root sees [p,c]"),
        (Notes, "copy", "child saw [p] root sees [p]"),
        (Notes, "fresh", "child saw [] root sees [p]"),
        (SubNotes, "shared", "child saw [p] root sees [p,c]"),
        (SubNotes, "copy", "child saw [p] root sees [p]"),
        (SubNotes, "fresh", "child saw [] root sees [p]"),
    ],
)
async def test_a_childs_session_forks_its_parents(toy_tokenizer, env, fork, expected):
    agents = {"fork": fork, "child_reward": "own"}
    async with tree_system(toy_tokenizer, [], env=env, harness="tree-test-forker", agents=agents) as system:
        events = await system.play("a")
    assert of(events, EpisodeFinished)[0].final_message == expected
    child_id = of(events, AgentSpawned)[1].agent_id
    [child] = [e for e in of(events, AgentFinished) if e.agent_id == child_id]
    # A subtask session is graded on its own goal (note c); a fork of the task on the task's (a).
    assert child.reward == (1.0 if env is SubNotes else 0.0)


async def test_restricted_tools_and_a_bad_spawn_return_errors_not_raise(toy_tokenizer):
    @harness("tree-test-restrict")
    async def restrict(ctx: AgentContext) -> AgentResult:
        if ctx.depth == 1:
            return AgentResult("completed", final_message=",".join(t.name for t in await ctx.list_tools()))
        kept = await ctx.spawn("look", tools=["read"])
        unknown = await ctx.spawn("look", tools=["fly"])
        no_harness = await ctx.spawn("look", harness="no-such-harness")
        return AgentResult(
            "completed",
            final_message=f"{kept.final_message}|{unknown.reason}|{no_harness.reason.split(' (known')[0]}",
        )

    async with tree_system(
        toy_tokenizer, [], harness="tree-test-restrict", agents={"max_depth": 2}
    ) as system:
        events = await system.play("a")
    assert of(events, EpisodeFinished)[0].final_message == (
        "read,spawn_subagent|spawn failed: unknown tools fly|spawn failed: unknown harness 'no-such-harness'"
    )
    assert len(of(events, AgentSpawned)) == 2  # refused spawns leave no agent behind


def test_program_options_are_checked_before_anything_runs():
    entry = EntrySettings(
        name="n", harness="tree-test-descend", program="recursive", program_options={"compactoin": {}}
    )
    with pytest.raises(
        ProgramError, match=r"environments.program_options: Object contains unknown field compactoin"
    ):
        EpisodeRunner([entry])
    entry.program_options = {"compaction": {"compact_at_tokens": "many"}}
    with pytest.raises(ProgramError, match=r"program_options.compaction.compact_at_tokens: Expected int"):
        EpisodeRunner([entry])


# --- a command-line harness as a subagent -------------------------------------------------------

AGENT = """
import json, os, sys, urllib.request
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps({"model": "platoon-policy", "messages": [{"role": "user", "content": sys.argv[1]}]}).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
)
reply = json.load(urllib.request.urlopen(request, timeout=30))
leaked = sorted(k for k in os.environ if "TINKER" in k or "PLATOON" in k)
print("cli says: " + reply["choices"][0]["message"]["content"] + (f" leaked {leaked}" if leaked else ""))
"""

SPEC = """
name = "tree-test-cli"
runs_in = "{runs_in}"
command = ["{{python}}", "{{spec_dir}}/agent.py", "{{instruction}}"]

[env]
OPENAI_BASE_URL = "{{gateway_url}}"
OPENAI_API_KEY = "{{api_key}}"
"""


@pytest.mark.parametrize("runs_in", ["sandbox", "host"])
async def test_a_command_line_harness_runs_as_a_subagent(toy_tokenizer, tmp_path, monkeypatch, runs_in):
    """The subagent's program runs in a sandbox of its own (this env has none), seeing none of
    the host's environment and reaching the gateway through the forwarded port; or, chosen
    explicitly, on the host."""
    if runs_in == "sandbox" and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    (tmp_path / "agent.py").write_text(textwrap.dedent(AGENT))
    spec = tmp_path / "cli.toml"
    spec.write_text(SPEC.format(runs_in=runs_in))
    monkeypatch.setenv("TINKER_API_KEY", "host-secret")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    (tmp_path / "site.yaml").write_text(f"runs: {tmp_path / 'runs'}\ncache: {tmp_path / 'cache'}\n")

    @harness("tree-test-delegate-to-cli")
    async def delegate(ctx: AgentContext) -> AgentResult:
        result = await ctx.spawn("say hello", harness=str(spec))
        return AgentResult(result.status, final_message=result.final_message, reason=result.reason)

    def policy(messages):
        return f"hello from the policy ({instruction_text(messages)})"

    async with tree_system(
        toy_tokenizer, policy, harness="tree-test-delegate-to-cli", serve_http=True, max_steps=3
    ) as system:
        events = await system.play("a")

    root, child = of(events, AgentSpawned)
    assert (child.parent_id, child.depth, child.harness) == (root.agent_id, 1, "tree-test-cli")
    [call] = of(events, ModelCallFinished)
    assert call.agent_id == child.agent_id
    finished = of(events, EpisodeFinished)[0]
    assert finished.status == "completed", finished.reason
    if runs_in == "sandbox":
        assert finished.final_message.strip() == "cli says: hello from the policy (say hello)"
    else:  # a host process inherits the host's environment: why sandbox is the default
        assert finished.final_message.strip().startswith("cli says: hello from the policy (say hello) leaked")


def instruction_text(messages):
    return next(m["content"] for m in messages if m["role"] == "user")


# --- credit -------------------------------------------------------------------------------------


async def graded_group(tokenizer, credit):
    """Two rollouts of task ab: one writes both notes (reward 1), one writes x for b (reward 0)."""
    from platoon.credit import CreditConfig

    policy = Delegating(levels=1)
    agents = {
        "max_depth": 1,
        "child_reward": credit["subagent_reward"],
        "child_reward_mix": credit.get("mix_alpha", 0.5),
    }
    config = CreditConfig(**credit)
    group_id = "group-ab"
    async with tree_system(tokenizer, policy, agents=agents, credit=config, group_size=2) as system:
        good = await system.play("ab", group_id=group_id)
        policy.wrong = {"b"}
        bad = await system.play("ab", group_id=group_id)
        await system.bus.drained()
    return good, bad, system.batches[0]


def agents_of(events):
    """(root, child for a, child for b) agent ids."""
    spawned = of(events, AgentSpawned)
    by_note = {e.instruction.split()[-1]: e.agent_id for e in spawned[1:]}
    return spawned[0].agent_id, by_note["a"], by_note["b"]


@pytest.mark.parametrize(
    ("credit", "expected"),
    [
        # Episode rewards 1 and 0: the group mean is 0.5, so every agent of a rollout takes +-0.5.
        ({"subagent_reward": "root"}, [[0.5, 0.5, 0.5], [-0.5, -0.5, -0.5]]),
        # Own grades of the four children: 1, 1 | 1, 0 -> mean 0.75 at depth 1.
        ({"subagent_reward": "own"}, [[0.5, 0.25, 0.25], [-0.5, 0.25, -0.75]]),
        # mix 0.5: half the own advantage plus half the rollout's.
        ({"subagent_reward": "mix", "mix_alpha": 0.5}, [[0.5, 0.375, 0.375], [-0.5, -0.125, -0.625]]),
        ({"subagent_reward": "mix", "mix_alpha": 0.25}, [[0.5, 0.4375, 0.4375], [-0.5, -0.3125, -0.5625]]),
    ],
)
async def test_tree_credit_gives_each_agent_the_advantage_computed_by_hand(toy_tokenizer, credit, expected):
    good, bad, batch = await graded_group(toy_tokenizer, credit)

    assert [of(good, EpisodeGraded)[0].reward, of(bad, EpisodeGraded)[0].reward] == [1.0, 0.0]
    datums = {d.agent_id: d for d in batch.datums}
    assert len(batch.datums) == 6 == len(datums)  # react's calls extend each other: one datum per agent
    for events, advantages in ((good, expected[0]), (bad, expected[1])):
        calls = of(events, ModelCallFinished)
        for agent_id, advantage in zip(agents_of(events), advantages, strict=True):
            datum = datums[agent_id]
            mine = [c for c in calls if c.agent_id == agent_id]
            assert datum.depth == (0 if agent_id == agents_of(events)[0] else 1)
            # The datum is the agent's last prompt plus its completion, trained on the completions.
            full = mine[-1].prompt_tokens + mine[-1].completion_tokens
            assert datum.model_input == full[:-1] and datum.target_tokens == full[1:]
            sampled = [t for t, w in zip(datum.target_tokens, datum.weights, strict=True) if w]
            assert sampled == [t for c in mine for t in c.completion_tokens]
            assert datum.num_trained_tokens == len(sampled)
            assert {a for a, w in zip(datum.advantages, datum.weights, strict=True) if not w} == {0.0}
            trained = [a for a, w in zip(datum.advantages, datum.weights, strict=True) if w]
            assert trained == [pytest.approx(advantage)] * len(trained)
    assert batch.stats["credit/depth/0/agents"] == 2 and batch.stats["credit/depth/1/agents"] == 4


async def test_inverse_count_depth_weighting_evens_out_the_depths(toy_tokenizer):
    credit = {"subagent_reward": "own", "depth_weighting": "inverse_count"}
    good, bad, batch = await graded_group(toy_tokenizer, credit)

    datums = {d.agent_id: d for d in batch.datums}
    tokens = {0: 0, 1: 0}
    for d in batch.datums:
        tokens[d.depth] += d.num_trained_tokens
    # w_d = (1/n_d) * T / sum_d(T_d / n_d) with n_0 = 2 roots and n_1 = 4 children.
    total = tokens[0] + tokens[1]
    norm = tokens[0] / 2 + tokens[1] / 4
    weight = {0: 0.5 * total / norm, 1: 0.25 * total / norm}
    assert batch.stats["credit/depth/0/weight"] == pytest.approx(weight[0])
    assert batch.stats["credit/depth/1/weight"] == pytest.approx(weight[1])
    own = [[0.5, 0.25, 0.25], [-0.5, 0.25, -0.75]]
    for events, advantages in ((good, own[0]), (bad, own[1])):
        for agent_id, advantage in zip(agents_of(events), advantages, strict=True):
            datum = datums[agent_id]
            trained = [a for a, w in zip(datum.advantages, datum.weights, strict=True) if w]
            assert trained == [pytest.approx(advantage * weight[datum.depth])] * len(trained)
    # The token-weighted mean weight is 1.
    assert (weight[0] * tokens[0] + weight[1] * tokens[1]) / total == pytest.approx(1.0)


async def test_a_spawn_tool_call_without_an_instruction_is_an_error_the_agent_reads(toy_tokenizer):
    @harness("tree-test-bad-spawn-calls")
    async def bad_calls(ctx: AgentContext) -> AgentResult:
        results = [await ctx.call_tool("spawn_subagent", args) for args in ({}, {"instruction": " "})]
        return AgentResult("completed", final_message="|".join(r.as_text() for r in results))

    async with tree_system(toy_tokenizer, [], harness="tree-test-bad-spawn-calls") as system:
        events = await system.play("a")
    error = "spawn_subagent needs an instruction (a string)"
    assert of(events, EpisodeFinished)[0].final_message == f"Error: {error}|Error: {error}"
    assert [e.error for e in of(events, ToolReturned)] == [error, error]
    assert len(of(events, AgentSpawned)) == 1


# --- the eval report by depth -------------------------------------------------------------------


async def test_the_eval_report_breaks_results_down_by_depth(toy_tokenizer):
    from platoon.bus.events import TaskRef
    from platoon.train.evaluate import EvalSettings, evaluate

    policy = Delegating(levels=2, wrong={"b"})
    agents = {"max_depth": 2, "child_reward": "own"}
    async with tree_system(toy_tokenizer, policy, agents=agents) as system:
        task = TaskRef(env="notes", split="train", task_id="ab")
        report = await evaluate(system.bus, [task], EvalSettings(group_size=2, concurrency=2))

    # Per episode: the root (3 calls), two depth-1 agents (2 calls each: spawn, answer) and two
    # depth-2 agents (2 calls each: write, answer); the one writing x for b fails its own goal.
    assert report.by_depth == {
        "0": {
            "agents": 2.0,
            "model_calls": 6.0,
            "calls_per_agent": 3.0,
            "own_reward_mean": 0.0,
            "own_rewards": 2.0,
        },
        "1": {
            "agents": 4.0,
            "model_calls": 8.0,
            "calls_per_agent": 2.0,
            "own_reward_mean": 0.5,
            "own_rewards": 4.0,
        },
        "2": {
            "agents": 4.0,
            "model_calls": 8.0,
            "calls_per_agent": 2.0,
            "own_reward_mean": 0.5,
            "own_rewards": 4.0,
        },
    }
    metrics = report.metrics()
    assert metrics["eval/depth1/own_reward_mean"] == 0.5 and metrics["eval/depth2/agents"] == 4.0
    assert report.tokens["calls"] == 22


@harness("tree-test-say")
async def say(ctx: AgentContext) -> AgentResult:
    reply = await ctx.chat([{"role": "user", "content": ctx.instruction}])
    return AgentResult("completed", final_message=reply.text)


@harness("tree-test-delegate-once")
async def delegate_once(ctx: AgentContext) -> AgentResult:
    result = await ctx.spawn("say something long", harness="tree-test-say")
    return AgentResult("completed", final_message=result.final_message)


async def test_subagents_sample_with_the_entrys_settings(toy_tokenizer):
    """The entry's `max_tokens` (and every other sampling setting) holds for subagents too."""
    policy = ["a long answer that goes on well past four tokens"]
    async with tree_system(
        toy_tokenizer, policy, harness="tree-test-delegate-once", params={"max_tokens": 4}
    ) as system:
        events = await system.play("ab")

    spawned = {e.agent_id: e.depth for e in of(events, AgentSpawned)}
    (call,) = of(events, ModelCallFinished)
    assert spawned[call.agent_id] == 1
    assert len(call.completion_tokens) == 4 and call.stop_reason == "length"

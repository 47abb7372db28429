"""An episode's events as the page shows them: trees, forks, compaction, HTTP agents, datums."""

import msgspec

from platoon.bus.chat import ChatMessage
from platoon.bus.eventlog import Record
from platoon.bus.events import (
    AgentFinished,
    AgentSpawned,
    EpisodeGraded,
    ModelCallFinished,
    SessionOpened,
    SessionOpenRequested,
    TaskRef,
    ToolCalled,
    ToolReturned,
)
from platoon.credit.datums import merge_calls, with_advantage
from platoon.credit.traces import Call
from platoon.visualization.episodes import call_tokens, episode_view, locate_in_datum
from platoon.visualization.index import StoredDatum

TASK = TaskRef(env="e", split="train", task_id="t")


def _records(events):
    return [Record(i, i + 1, float(i), e) for i, e in enumerate(events)]


def _call(agent, prompt, completion, call_id):
    return ModelCallFinished(
        call_id=call_id,
        episode_id="ep",
        agent_id=agent,
        prompt_tokens=prompt,
        completion_tokens=completion,
        logprobs=[-0.1 * (i + 1) for i in range(len(completion))],
        stop_reason="stop",
        policy_version=3,
    )


def test_subagents_forks_compaction_and_calls_without_messages():
    fork = SessionOpenRequested(episode_id="ep", agent_id="child", task=TASK, fork_of="root", fork="copy")
    tool = ToolCalled(episode_id="ep", agent_id="child", env="e", name="run", arguments={"cmd": "ls"})
    events = [
        AgentSpawned(
            episode_id="ep", agent_id="root", parent_id=None, depth=0, harness="h", instruction="go"
        ),
        _call("root", [1, 2, 3], [4, 5], "c1"),
        AgentSpawned(
            episode_id="ep", agent_id="child", parent_id="root", depth=1, harness="h", instruction="sub"
        ),
        fork,
        SessionOpened(reply_to=fork.request_id, instruction="sub"),
        tool,
        ToolReturned(reply_to=tool.request_id, episode_id="ep", agent_id="child", name="run", output="a b"),
        AgentFinished(episode_id="ep", agent_id="child", status="completed"),
        _call("root", [1, 2, 3, 4, 5, 6], [7], "c2"),  # extends the last call: same datum
        _call("root", [9, 9], [8], "c3"),  # compacted: starts afresh
        AgentFinished(episode_id="ep", agent_id="root", status="completed"),
        EpisodeGraded(episode_id="ep", group_id="g", task=TASK, reward=1.0, agent_rewards={"child": 0.5}),
    ]
    view = episode_view({"episode_id": "ep"}, _records(events))
    assert view["roots"] == ["root"]
    agents = {a["agent_id"]: a for a in view["agents"]}
    assert agents["root"]["children"] == ["child"]
    assert agents["child"]["fork"] == {"of": "root", "mode": "copy"} and agents["child"]["reward"] == 0.5
    calls = [i for i in agents["root"]["items"] if i["kind"] == "model_call"]
    assert [c["call_id"] for c in calls] == ["c1", "c2", "c3"]
    assert [c["context_reset"] for c in calls] == [False, False, True]
    assert all(c["messages"] is None for c in calls)  # an HTTP agent: no ChatRequested
    (tool_item,) = [i for i in agents["child"]["items"] if i["kind"] == "tool"]
    assert (tool_item["arguments"], tool_item["output"]) == ({"cmd": "ls"}, "a b")


def test_a_calls_tokens_carry_the_datum_values_at_their_positions():
    first, second, third = (
        _call("a", [1, 2, 3], [4, 5], "c1"),
        _call("a", [1, 2, 3, 4, 5, 6], [7], "c2"),
        _call("a", [], [8, 9], "c3"),
    )
    calls = [
        Call(prompt_tokens=c.prompt_tokens, completion_tokens=c.completion_tokens, logprobs=c.logprobs)
        for c in (first, second, third)
    ]
    # The rollout's advantage 0.5, at a depth weighted 2, over a batch of 8 trained tokens.
    datums = [with_advantage(d, 0.5 * 2 / 8) for d in merge_calls(calls, agent_id="a")]
    stored = [StoredDatum(4, d, 8, 2.0) for d in datums]
    assert len(datums) == 2
    assert locate_in_datum(second.prompt_tokens, second.completion_tokens, datums) == (0, 5)
    tokens = call_tokens(second, stored, normalization="token_mean")
    assert tokens["tokens"] == [
        {
            "id": 7,
            "logprob": -0.1,
            "position": 5,
            "weight": 1.0,
            "advantage": 0.5,  # the rollout's
            "trained_advantage": 0.125,  # what the loss used: x 2 (depth), / 8 (token_mean)
            "datum_logprob": -0.1,
            "text": None,
        }
    ]
    datum = tokens["datum"]
    assert (datum["step"], datum["advantages"], datum["trained_advantages"]) == (4, [0.5], [0.125])
    assert (datum["normalization"], datum["batch_tokens"], datum["depth_weight"]) == ("token_mean", 8, 2.0)
    assert tokens["trained_tokens"] == 1
    # Summed losses divide by nothing; a run whose lock does not say is shown as trained, but weighted.
    assert call_tokens(second, stored, normalization="sum")["tokens"][0]["advantage"] == 0.0625
    assert call_tokens(second, stored)["datum"]["advantages"] == [0.0625]
    # A sequence's first token is never a target: it shows as not trained.
    empty_prompt = call_tokens(third, stored)
    assert [t["weight"] for t in empty_prompt["tokens"]] == [0.0, 1.0]
    # A call in no datum says why.
    other = call_tokens(_call("b", [1], [2], "x"), stored)
    assert other["datum"] is None and "no datum" in other["untrained_reason"]
    assert all("weight" not in t for t in other["tokens"])


def test_a_call_over_http_shows_the_messages_it_carried():
    call = msgspec.structs.replace(_call("root", [1, 2], [3], "c1"), messages=[ChatMessage("user", "hi")])
    events = [
        AgentSpawned(
            episode_id="ep", agent_id="root", parent_id=None, depth=0, harness="codex", instruction="go"
        ),
        call,
    ]
    view = episode_view({"episode_id": "ep"}, _records(events))
    [item] = [i for i in view["agents"][0]["items"] if i["kind"] == "model_call"]
    assert item["messages"] == [{"role": "user", "content": "hi"}] and item["call_id"] == "c1"


def test_a_judges_reasoning_and_calls_are_in_the_episode():
    judge_call = ModelCallFinished(
        call_id="j1",
        episode_id="ep",
        agent_id="judge",
        prompt_tokens=[],
        completion_tokens=[],
        logprobs=[],
        stop_reason="stop",
        policy_version=0,
        kind="judge",
        completion_text="Clear and right. Score: 9",
    )
    graded = EpisodeGraded(
        episode_id="ep",
        group_id="g",
        task=TASK,
        reward=1.4,
        rewards={"rule/env": 1.0, "rule/judge": 0.9},
        notes={"judge": "Clear and right. Score: 9"},
    )
    view = episode_view(
        None,
        _records(
            [
                AgentSpawned(
                    episode_id="ep", agent_id="root", parent_id=None, depth=0, harness="h", instruction="i"
                ),
                judge_call,
                graded,
            ]
        ),
    )
    assert view["graded"]["notes"] == {"judge": "Clear and right. Score: 9"}
    assert view["graded"]["rewards"] == {"rule/env": 1.0, "rule/judge": 0.9}
    (judge,) = [a for a in view["agents"] if a["agent_id"] == "judge"]
    assert [(i["call_kind"], i["completion_text"]) for i in judge["items"]] == [
        ("judge", "Clear and right. Score: 9")
    ]

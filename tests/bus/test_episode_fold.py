"""The event log folded into episodes: requests paired with their replies, a model call's record
with its call, children where they were spawned, replies routed to their request's episode."""

from platoon.bus.episodes import (
    ChildTurn,
    EpisodeFold,
    GradeTurn,
    ModelTurn,
    Router,
    SessionTurn,
    ToolTurn,
    fold_events,
    fold_records,
)
from platoon.bus.eventlog import Record
from platoon.bus.events import (
    AgentOpenRequested,
    AgentSpawned,
    ChatReplied,
    ChatRequested,
    EpisodeAbandoned,
    EpisodeGraded,
    EpisodeRequested,
    Graded,
    GradeRequested,
    ModelCallFinished,
    SessionOpened,
    SessionOpenRequested,
    TaskRef,
    ToolCalled,
    ToolReturned,
    TrainStepFinished,
)

TASK = TaskRef(env="e", split="train", task_id="t")


def _spawned(agent, parent=None, episode="ep"):
    return AgentSpawned(
        episode_id=episode,
        agent_id=agent,
        parent_id=parent,
        depth=0 if parent is None else 1,
        harness="h",
        instruction="go",
    )


def _record(agent, call_id, episode="ep"):
    return ModelCallFinished(
        call_id=call_id,
        episode_id=episode,
        agent_id=agent,
        prompt_tokens=[1],
        completion_tokens=[2],
        logprobs=[-0.5],
        stop_reason="stop",
        policy_version=0,
    )


def test_requests_pair_with_replies_and_a_record_with_its_bus_call():
    session = SessionOpenRequested(episode_id="ep", agent_id="root", task=TASK)
    chat = ChatRequested(episode_id="ep", agent_id="root", messages=[{"role": "user", "content": "hi"}])
    spawn = ToolCalled(episode_id="ep", agent_id="root", env="", name="spawn_subagent", arguments={})
    grade = GradeRequested(episode_id="ep", agent_id="child", env="e")
    events = [
        EpisodeRequested(episode_id="ep", group_id="g", task=TASK, purpose="eval"),
        _spawned("root"),
        AgentOpenRequested(episode_id="ep", agent_id="root", role="planner"),
        session,
        SessionOpened(reply_to=session.request_id, instruction="do it"),
        chat,
        _record("root", "c1"),
        ChatReplied(reply_to=chat.request_id, call_id="c1"),
        spawn,
        _spawned("child", parent="root"),
        grade,
        Graded(reply_to=grade.request_id, reward=1.0),
        ToolReturned(reply_to=spawn.request_id, episode_id="ep", agent_id="root", name="spawn_subagent"),
        _record("child", "http-call"),  # a call over HTTP: no ChatRequested before it
        ToolReturned(reply_to="unknown", episode_id="ep", agent_id="child", name="read", output="x"),
        EpisodeGraded(episode_id="ep", group_id="g", task=TASK, reward=None, reason="no grade"),
        EpisodeGraded(episode_id="ep", group_id="g", task=TASK, reward=1.0),
        TrainStepFinished(step=0, metrics={}),  # of no episode
    ]
    (log,) = fold_events(events).values()
    assert log.requested is not None and log.requested.event.purpose == "eval"
    assert [g.event.reward for g in log.grades] == [None, 1.0]
    assert list(log.agents) == ["root", "child"] and log.children_of("root") == ["child"]
    assert log.roles == {"root": "planner"}

    root, child = log.agents["root"], log.agents["child"]
    opened, called, tool, spawned = root.turns
    assert (
        isinstance(opened, SessionTurn) and opened.reply is not None and opened.reply.instruction == "do it"
    )
    assert isinstance(called, ModelTurn) and called.request is chat
    assert called.call is not None and called.call.call_id == "c1" and called.reply is not None
    # The spawn call, the child spawned while it ran, then its result: each at its place in the log.
    assert isinstance(tool, ToolTurn) and isinstance(spawned, ChildTurn) and spawned.agent_id == "child"
    assert tool.replied_at is not None and tool.at < spawned.at < tool.replied_at

    graded, http, unpaired = child.turns
    assert isinstance(graded, GradeTurn) and graded.reply is not None and graded.reply.reward == 1.0
    assert isinstance(http, ModelTurn) and http.request is None and http.call is not None
    assert isinstance(unpaired, ToolTurn) and unpaired.request is None and unpaired.reply is not None
    assert [c.call_id for c in root.calls()] == ["c1"] and [c.call_id for c in child.calls()] == ["http-call"]


def test_a_record_goes_to_the_latest_bus_call_still_without_one():
    first = ChatRequested(episode_id="ep", agent_id="a", messages=[])
    second = ChatRequested(episode_id="ep", agent_id="a", messages=[])
    (log,) = fold_events([_spawned("a"), first, second, _record("a", "c2"), _record("a", "c1")]).values()
    turns = [t for t in log.agents["a"].turns if isinstance(t, ModelTurn)]
    assert [t.call.call_id for t in turns if t.call] == ["c1", "c2"]
    # calls() are in the order they were recorded, whatever order they were asked in.
    assert [c.call_id for c in log.agents["a"].calls()] == ["c2", "c1"]


def test_replies_without_an_episode_go_to_their_requests_episode():
    a = SessionOpenRequested(episode_id="a", agent_id="x", task=TASK)
    b = SessionOpenRequested(episode_id="b", agent_id="y", task=TASK)
    records = [
        Record(0, 1, 10.0, a),
        Record(1, 2, 11.0, b),
        Record(2, 3, 12.0, SessionOpened(reply_to=b.request_id, instruction="for b")),
        Record(3, 4, 13.0, SessionOpened(reply_to=a.request_id, instruction="for a")),
        Record(4, 5, 14.0, EpisodeAbandoned(episode_id="a", group_id="g", task=TASK)),
    ]
    episodes = fold_records(records)
    assert list(episodes) == ["a", "b"]
    for name in "ab":
        (turn,) = episodes[name].agents["x" if name == "a" else "y"].turns
        assert isinstance(turn, SessionTurn) and turn.reply is not None
        assert turn.reply.instruction == f"for {name}"
    assert episodes["a"].abandoned[0].time == 14.0 and not episodes["b"].abandoned


def test_the_router_asks_earlier_for_requests_it_did_not_see_and_forgets_answered_ones():
    asked_earlier: list[str] = []

    def earlier(request_id):
        asked_earlier.append(request_id)
        return "old" if request_id == "from-before" else None

    fold = EpisodeFold()
    fold.router = Router(earlier=earlier)
    chat = ChatRequested(episode_id="ep", agent_id="a", messages=[])
    tool = ToolCalled(episode_id="ep", agent_id="a", env="e", name="t", arguments={})
    fold.add(chat)
    fold.add(tool)
    # A tool's result names its episode itself: its call need not be remembered.
    assert fold.router.pending == {chat.request_id: "ep"}
    assert fold.add(ChatReplied(reply_to=chat.request_id)) is fold.episodes["ep"]
    assert fold.router.pending == {}
    assert fold.router.episode_of(ChatReplied(reply_to="from-before")) == "old"
    assert fold.add(ChatReplied(reply_to="nobody")) is None
    assert asked_earlier == ["from-before", "nobody"]

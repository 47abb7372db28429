"""The event graph joins the components' declarations: who publishes each type, who takes it."""

from platoon.bus import ComponentBase
from platoon.bus.events import (
    BatchReady,
    EpisodeGraded,
    Event,
    Graded,
    GradeRequested,
    PolicyUpdated,
    TrainStepFinished,
)
from platoon.bus.graph import event_graph


class Grades(ComponentBase):
    name = "grades"
    subscribes = (Graded,)
    publishes = (GradeRequested, EpisodeGraded)


class Env(ComponentBase):
    subscribes = (GradeRequested,)
    publishes = (Graded,)


class Learner(ComponentBase):
    name = "learner"
    subscribes = (EpisodeGraded, BatchReady)
    publishes = (PolicyUpdated, TrainStepFinished)


class Log(ComponentBase):
    name = "log"
    subscribes = (Event,)


class Undeclared:
    async def run(self, bus):
        pass


def test_publishers_takers_and_edges():
    graph = event_graph([Grades, ("env:a", Env), Learner(), Log, Undeclared()])
    assert [n.name for n in graph.nodes] == ["grades", "env:a", "learner", "log", "Undeclared"]
    assert graph.publishers(EpisodeGraded) == ["grades"]
    assert graph.takers(EpisodeGraded) == ["learner"]  # the log takes everything: not on each edge
    assert graph.takers(BatchReady) == ["learner"] and graph.publishers(BatchReady) == []
    named = {(graph.nodes[a].name, e, graph.nodes[b].name) for a, e, b in graph.edges()}
    assert named == {
        ("grades", "GradeRequested", "env:a"),
        ("env:a", "Graded", "grades"),
        ("grades", "EpisodeGraded", "learner"),
    }
    assert [n.name for n in graph.observers] == ["log"]
    assert [n.name for n in graph.undeclared] == ["Undeclared"]
    text = graph.text()
    assert "GradeRequested (request)" in text and "grades -> env:a" in text
    assert "PolicyUpdated" in text and "learner -> (none here)" in text
    assert "every event also goes to: log" in text
    assert "declares nothing (not on the graph): Undeclared (Undeclared)" in text
    mermaid = graph.mermaid()
    assert 'c3["log (takes every event)"]' in mermaid
    assert "c0 -- EpisodeGraded --> c2" in mermaid


def test_a_subscription_takes_subclasses_and_instances_declare_their_own():
    class Special(EpisodeGraded, frozen=True, kw_only=True):
        extra: int = 0

    class Maker(ComponentBase):
        publishes = (Special,)

    relay = Grades()
    relay.subscribes = (PolicyUpdated,)  # an instance's own declarations win
    graph = event_graph([Maker, Learner, ("relay", relay)])
    assert graph.takers(Special) == ["learner"]
    assert graph.takers(PolicyUpdated) == ["relay"]
    assert graph.takers(Graded) == []

"""The event log folded into episodes: each episode's agents, and each agent's turns with their
requests and replies paired.

The viewer's episode page, `platoon rollout`'s tree, the viewer's index and the recorded episodes
`platoon sft` trains on all read a log through this one fold, so what an event means to an episode
is said once, here. A reader renders the fold; it does not walk the events again.

A turn keeps where its events sat in the log (`at`, `replied_at`, `recorded_at`: positions, in
the order the events were folded), for a reader that shows a call and its answer apart, with what
happened between them (a subagent spawned by a tool call, before the call returned).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeAlias, TypeVar

from platoon.bus.eventlog import Record
from platoon.bus.events import (
    AgentFinished,
    AgentOpenRequested,
    AgentProcessExited,
    AgentProcessRequested,
    AgentSpawned,
    ChatReplied,
    ChatRequested,
    EpisodeAbandoned,
    EpisodeFinished,
    EpisodeGraded,
    EpisodeRequested,
    EpisodeStarted,
    Event,
    Graded,
    GradeRequested,
    ModelCallFinished,
    Reply,
    Request,
    SessionOpened,
    SessionOpenRequested,
    ToolCalled,
    ToolReturned,
    reply_type,
)

__all__ = [
    "AgentLog",
    "ChildTurn",
    "EpisodeFold",
    "EpisodeLog",
    "GradeTurn",
    "ModelTurn",
    "ProcessTurn",
    "Router",
    "SessionTurn",
    "Stamped",
    "ToolTurn",
    "Turn",
    "fold_events",
    "fold_records",
]

E = TypeVar("E", bound=Event, covariant=True)


@dataclass(frozen=True)
class Stamped(Generic[E]):
    """An event with the time its record was written (0.0 where the reader had none)."""

    event: E
    time: float


@dataclass
class SessionTurn:
    """An env session asked for (`SessionOpenRequested`) and, once answered, opened."""

    time: float
    at: int
    request: SessionOpenRequested
    reply: SessionOpened | None = None
    replied_at: int | None = None


@dataclass
class ModelTurn:
    """A model call: asked over the bus (`request`, answered by `reply`) or over HTTP (no
    request), with its record (`call`: the tokens) once the gateway published it."""

    time: float
    at: int
    request: ChatRequested | None = None
    reply: ChatReplied | None = None
    replied_at: int | None = None
    call: ModelCallFinished | None = None
    recorded_at: int | None = None


@dataclass
class ToolTurn:
    """A tool call and its result; a result whose call is not in the log has no `request`."""

    time: float
    at: int
    request: ToolCalled | None = None
    reply: ToolReturned | None = None
    replied_at: int | None = None


@dataclass
class ProcessTurn:
    """An agent's command line run in its sandbox (`AgentProcessRequested`) and how it exited."""

    time: float
    at: int
    request: AgentProcessRequested
    reply: AgentProcessExited | None = None
    replied_at: int | None = None


@dataclass
class GradeTurn:
    """A grade asked of the env for this agent, and the grade."""

    time: float
    at: int
    request: GradeRequested
    reply: Graded | None = None
    replied_at: int | None = None


@dataclass
class ChildTurn:
    """Where a subagent was spawned among its parent's turns."""

    time: float
    at: int
    agent_id: str


Turn: TypeAlias = SessionTurn | ModelTurn | ToolTurn | ProcessTurn | GradeTurn | ChildTurn
_Asked: TypeAlias = SessionTurn | ModelTurn | ToolTurn | ProcessTurn | GradeTurn


@dataclass
class AgentLog:
    """One agent of an episode: how it was spawned and ended, and its turns in the order they began."""

    agent_id: str
    spawned: Stamped[AgentSpawned] | None = None
    finished: Stamped[AgentFinished] | None = None
    turns: list[Turn] = field(default_factory=list)

    @property
    def parent_id(self) -> str | None:
        return self.spawned.event.parent_id if self.spawned is not None else None

    def calls(self) -> list[ModelCallFinished]:
        """The agent's recorded model calls, in the order they were recorded."""
        turns = [t for t in self.turns if isinstance(t, ModelTurn) and t.call is not None]
        turns.sort(key=lambda t: t.recorded_at or 0)
        return [t.call for t in turns if t.call is not None]


@dataclass
class EpisodeLog:
    """One episode as its events tell it. Where an event came more than once, the last one
    counts, except the grades and abandonments, which are all kept in order."""

    episode_id: str
    requested: Stamped[EpisodeRequested] | None = None
    started: Stamped[EpisodeStarted] | None = None
    finished: Stamped[EpisodeFinished] | None = None
    grades: list[Stamped[EpisodeGraded]] = field(default_factory=list)
    abandoned: list[Stamped[EpisodeAbandoned]] = field(default_factory=list)
    agents: dict[str, AgentLog] = field(default_factory=dict)  # in the order they first appear
    roles: dict[str, str] = field(default_factory=dict)  # agent id -> the role it was opened with
    _asked: dict[str, _Asked] = field(default_factory=dict)  # request id -> its turn
    _count: int = 0

    def agent(self, agent_id: str) -> AgentLog:
        if agent_id not in self.agents:
            self.agents[agent_id] = AgentLog(agent_id)
        return self.agents[agent_id]

    def add(self, event: Event, time: float = 0.0) -> None:
        """Fold one more event of this episode (a reply is this episode's when its request was)."""
        at, self._count = self._count, self._count + 1
        match event:
            case EpisodeRequested():
                self.requested = Stamped(event, time)
            case EpisodeStarted():
                self.started = Stamped(event, time)
            case EpisodeFinished():
                self.finished = Stamped(event, time)
            case EpisodeGraded():
                self.grades.append(Stamped(event, time))
            case EpisodeAbandoned():
                self.abandoned.append(Stamped(event, time))
            case AgentSpawned():
                parent = self.agents.get(event.parent_id) if event.parent_id else None
                self.agent(event.agent_id).spawned = Stamped(event, time)
                if parent is not None:
                    parent.turns.append(ChildTurn(time, at, event.agent_id))
            case AgentFinished():
                self.agent(event.agent_id).finished = Stamped(event, time)
            case AgentOpenRequested():
                self.roles[event.agent_id] = event.role
            case ModelCallFinished():
                self._recorded(event, time, at)
            case Request():
                self._asked_by(event, time, at)
            case Reply():
                self._answered(event, time, at)

    def _recorded(self, event: ModelCallFinished, time: float, at: int) -> None:
        """A model call's record belongs to the agent's latest bus call still without one (the
        gateway records a call before it replies); a call over HTTP has none: its own turn."""
        agent = self.agents.get(event.agent_id)
        pending = [t for t in agent.turns if isinstance(t, ModelTurn)] if agent is not None else []
        turn = next((t for t in reversed(pending) if t.request is not None and t.call is None), None)
        if turn is None:
            turn = ModelTurn(time, at)
            self.agent(event.agent_id).turns.append(turn)
        turn.call, turn.recorded_at = event, at

    def _asked_by(self, event: Request[Reply], time: float, at: int) -> None:
        turn: _Asked
        if isinstance(event, SessionOpenRequested):
            turn = SessionTurn(time, at, event)
        elif isinstance(event, ChatRequested):
            turn = ModelTurn(time, at, event)
        elif isinstance(event, ToolCalled):
            turn = ToolTurn(time, at, event)
        elif isinstance(event, AgentProcessRequested):
            turn = ProcessTurn(time, at, event)
        elif isinstance(event, GradeRequested):
            turn = GradeTurn(time, at, event)
        else:
            return
        self.agent(event.agent_id).turns.append(turn)
        self._asked[event.request_id] = turn

    def _answered(self, event: Reply, time: float, at: int) -> None:
        turn = self._asked.get(event.reply_to)
        if isinstance(event, ToolReturned):
            if not isinstance(turn, ToolTurn):  # its call is not in the log
                turn = ToolTurn(time, at)
                self.agent(event.agent_id).turns.append(turn)
            turn.reply, turn.replied_at = event, at
        elif isinstance(event, SessionOpened) and isinstance(turn, SessionTurn):
            turn.reply, turn.replied_at = event, at
        elif isinstance(event, ChatReplied) and isinstance(turn, ModelTurn):
            turn.reply, turn.replied_at = event, at
        elif isinstance(event, AgentProcessExited) and isinstance(turn, ProcessTurn):
            turn.reply, turn.replied_at = event, at
        elif isinstance(event, Graded) and isinstance(turn, GradeTurn):
            turn.reply, turn.replied_at = event, at

    def children_of(self, agent_id: str) -> list[str]:
        """The agents `agent_id` spawned, in the order they first appear."""
        return [a.agent_id for a in self.agents.values() if a.parent_id and a.parent_id == agent_id]


class Router:
    """Which episode an event belongs to: its own `episode_id`, or, for a reply that names none,
    the episode of the request it answers. `earlier` finds a request routed before this router
    began (the viewer's index keeps them between refreshes)."""

    def __init__(self, earlier: Callable[[str], str | None] | None = None) -> None:
        self.pending: dict[str, str] = {}  # request id -> episode, for a reply that will not say
        self._earlier = earlier

    def episode_of(self, event: Event) -> str | None:
        episode_id = getattr(event, "episode_id", None)
        if episode_id is None and isinstance(event, Reply):
            episode_id = self.pending.pop(event.reply_to, None)
            if episode_id is None and self._earlier is not None:
                episode_id = self._earlier(event.reply_to)
        if not isinstance(episode_id, str):
            return None
        if isinstance(event, Request) and "episode_id" not in reply_type(type(event)).__struct_fields__:
            self.pending[event.request_id] = episode_id
        return episode_id


class EpisodeFold:
    """Every episode of a log, folded as its events come (`add`), in the order each first appears."""

    def __init__(self) -> None:
        self.episodes: dict[str, EpisodeLog] = {}
        self.router = Router()

    def add(self, event: Event, time: float = 0.0) -> EpisodeLog | None:
        """Fold an event into its episode; None for an event of no episode (a training step)."""
        episode_id = self.router.episode_of(event)
        if episode_id is None:
            return None
        log = self.episodes.get(episode_id)
        if log is None:
            log = self.episodes[episode_id] = EpisodeLog(episode_id)
        log.add(event, time)
        return log


def fold_events(events: Iterable[Event]) -> dict[str, EpisodeLog]:
    """The episodes of a sequence of events (no times: they read as 0.0)."""
    fold = EpisodeFold()
    for event in events:
        fold.add(event)
    return fold.episodes


def fold_records(records: Iterable[Record] | Iterable[tuple[float, Event]]) -> dict[str, EpisodeLog]:
    """The episodes of a log's records (`scan`'s `Record`s or `read_records`' (time, event))."""
    fold = EpisodeFold()
    for time, event in _stamped(records):
        fold.add(event, time)
    return fold.episodes


def _stamped(records: Iterable[Record] | Iterable[tuple[float, Event]]) -> Iterator[tuple[float, Event]]:
    for record in records:
        yield (record.time, record.event) if isinstance(record, Record) else record

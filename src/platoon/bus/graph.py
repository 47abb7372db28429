"""The event graph of a set of components, from their declarations.

Each component declares the event types it takes (`subscribes`) and publishes (`publishes`);
see `ComponentBase`. The graph joins them: for each event type, who publishes it and who takes
it (a subscription to a type takes its subclasses too). A component that takes `Event` takes
every event (the event log, a plugin that named no events): it is listed once, not on every
edge. Declarations are class attributes, so a graph can be drawn from classes alone, before
anything is built; an instance whose declarations depend on its settings (the NATS bridge, a
plugin handler) is drawn from its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from platoon.bus.events import Event, Reply, Request, event_types

__all__ = ["EventGraph", "Node", "event_graph"]


@dataclass(frozen=True)
class Node:
    """One component on the graph: its name and declarations (None: it declares nothing)."""

    name: str
    cls: type  # its class
    subscribes: tuple[type[Event], ...] | None
    publishes: tuple[type[Event], ...] | None

    @property
    def takes_anything(self) -> bool:
        return self.subscribes is not None and Event in self.subscribes

    def takes(self, event_type: type[Event]) -> bool:
        return self.subscribes is not None and issubclass(event_type, self.subscribes)

    @property
    def publishes_anything(self) -> bool:
        return self.publishes is not None and Event in self.publishes


@dataclass(frozen=True)
class EventGraph:
    nodes: list[Node]

    @property
    def undeclared(self) -> list[Node]:
        return [n for n in self.nodes if n.subscribes is None]

    @property
    def observers(self) -> list[Node]:
        """The components that take every event."""
        return [n for n in self.nodes if n.takes_anything]

    @property
    def relays(self) -> list[Node]:
        """The components that may publish any event (what their settings name)."""
        return [n for n in self.nodes if n.publishes_anything]

    def event_types(self) -> list[type[Event]]:
        """Every type some component names, in the catalogue's order (roughly a step's)."""
        named = {
            t for n in self.nodes for t in (*(n.subscribes or ()), *(n.publishes or ())) if t is not Event
        }
        known = [t for t in event_types() if t in named]
        return known + sorted(named - set(known), key=lambda t: t.__name__)

    def _publishing(self, event_type: type[Event]) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.publishes is not None and event_type in n.publishes]

    def _taking(self, event_type: type[Event]) -> list[int]:
        return [i for i, n in enumerate(self.nodes) if n.takes(event_type) and not n.takes_anything]

    def publishers(self, event_type: type[Event]) -> list[str]:
        """Who publishes `event_type`, besides the components that may publish any event."""
        return [self.nodes[i].name for i in self._publishing(event_type)]

    def takers(self, event_type: type[Event]) -> list[str]:
        """Who takes `event_type`, besides the components that take every event."""
        return [self.nodes[i].name for i in self._taking(event_type)]

    def edges(self) -> list[tuple[int, str, int]]:
        """(publisher's index, event type name, taker's index) for every declared pair."""
        out = []
        for event_type in self.event_types():
            for pub in self._publishing(event_type):
                for sub in self._taking(event_type):
                    if pub != sub:
                        out.append((pub, event_type.__name__, sub))
        return out

    def text(self, title: str = "") -> str:
        """One line per event type: who publishes it -> who takes it."""
        types = self.event_types()
        width = max((len(t.__name__) for t in types), default=0) + 2
        lines = [title] if title else []
        lines.append("components: " + ", ".join(n.name for n in self.nodes))
        lines.append("")
        for event_type in types:
            pubs = ", ".join(self.publishers(event_type)) or "(none here)"
            subs = ", ".join(self.takers(event_type)) or "(none here)"
            kind = (
                " (request)"
                if issubclass(event_type, Request)
                else " (reply)"
                if issubclass(event_type, Reply)
                else ""
            )
            lines.append(f"{event_type.__name__ + kind:<{width + 10}} {pubs} -> {subs}")
        if self.observers or self.relays:
            lines.append("")
        if self.observers:
            lines.append("every event also goes to: " + ", ".join(n.name for n in self.observers))
        if self.relays:
            lines.append("may publish any event: " + ", ".join(n.name for n in self.relays))
        if self.undeclared:
            lines.append(
                "declares nothing (not on the graph): "
                + ", ".join(f"{n.name} ({n.cls.__name__})" for n in self.undeclared)
            )
        return "\n".join(lines) + "\n"

    def mermaid(self) -> str:
        """A Mermaid flowchart: one node per component, one labelled edge per event type."""
        lines = ["flowchart LR"]
        for i, node in enumerate(self.nodes):
            note = " (takes every event)" if node.takes_anything else ""
            label = f"{node.name}{note}".replace('"', "'")
            lines.append(f'    c{i}["{label}"]')
        for pub, name, sub in self.edges():
            lines.append(f"    c{pub} -- {name} --> c{sub}")
        return "\n".join(lines) + "\n"


def event_graph(components: Iterable[object | tuple[str, object]]) -> EventGraph:
    """The graph of `components`: instances or classes, or (name, instance or class) pairs."""
    nodes = []
    for item in components:
        name, component = item if isinstance(item, tuple) else (None, item)
        cls = component if isinstance(component, type) else type(component)
        name = name or getattr(component, "name", None) or cls.__name__
        subscribes = getattr(component, "subscribes", None)
        publishes = getattr(component, "publishes", None)
        declared = isinstance(subscribes, tuple) and isinstance(publishes, tuple)
        nodes.append(
            Node(
                name=str(name),
                cls=cls,
                subscribes=tuple(subscribes or ()) if declared else None,
                publishes=tuple(publishes or ()) if declared else None,
            )
        )
    return EventGraph(nodes)

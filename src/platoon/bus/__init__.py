"""The typed event bus, its events, their wire codec and the run's event log."""

from platoon.bus import events
from platoon.bus.codec import decode, encode, to_json
from platoon.bus.components import Component, ComponentBase, attach, run_components, running
from platoon.bus.core import Bus, BusClosed, NoResponder, RequestTimeout, Stream, Subscription
from platoon.bus.eventlog import EventLog, LogDamage, read_events, read_records
from platoon.bus.events import Event, Reply, Request, register_event

__all__ = [
    "Bus",
    "BusClosed",
    "Component",
    "ComponentBase",
    "Event",
    "EventLog",
    "LogDamage",
    "NoResponder",
    "Reply",
    "Request",
    "RequestTimeout",
    "Stream",
    "Subscription",
    "attach",
    "decode",
    "encode",
    "events",
    "read_events",
    "read_records",
    "register_event",
    "run_components",
    "running",
    "to_json",
]

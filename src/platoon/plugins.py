"""Entry points: how installed packages add harnesses, programs, environments, reward
processors, sandbox providers and event handlers.

Nothing is imported at start-up. A config names a thing (`harness: my-agent`,
`plugins: [{handler: my-plugin}]`), and only then is the entry point with that name loaded.
A name with a colon (`package.module:attr`) is imported directly instead.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import structlog

from platoon.bus import Bus, ComponentBase, Event, events
from platoon.naming import unknown_name

__all__ = [
    "GROUPS",
    "EventHandlerPlugin",
    "PluginError",
    "available",
    "import_ref",
    "load",
    "plugin_component",
]

log = structlog.get_logger("platoon.plugins")

GROUPS = {
    "harnesses": "platoon.harnesses",
    "programs": "platoon.programs",
    "environments": "platoon.environments",
    "reward_processors": "platoon.reward_processors",
    "reward_rules": "platoon.reward_rules",
    "event_handlers": "platoon.event_handlers",
    "sandbox_providers": "platoon.sandbox_providers",
}


class PluginError(LookupError):
    """A named plugin could not be found or loaded."""


def import_ref(ref: str) -> Any:
    """Import `package.module:attr.sub` and return the attribute."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise PluginError(f"{ref!r} is not a reference of the form 'package.module:attribute'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise PluginError(f"cannot import {module_name!r} for {ref!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise PluginError(f"{module_name!r}: {unknown_name('name', part, names)}") from None
    return obj


def available(kind: str) -> dict[str, EntryPoint]:
    """The installed entry points of one kind (see `GROUPS`), by name, without importing them."""
    return {ep.name: ep for ep in entry_points(group=GROUPS[kind])}


def load(kind: str, name: str) -> Any:
    """Load the entry point `name` of `kind`, or import `name` if it is a `module:attr` ref."""
    if ":" in name:
        return import_ref(name)
    found = available(kind)
    if name not in found:
        raise PluginError(unknown_name(kind[:-1].replace("_", " "), name, found))
    try:
        return found[name].load()
    except Exception as exc:
        raise PluginError(f"loading {kind[:-1].replace('_', ' ')} {name!r} failed: {exc}") from exc


class EventHandlerPlugin(ComponentBase):
    """A component that feeds the events a plugin asked for to its handler.

    Its declarations are its instance's: the event types the config named (`Event`, any
    event, when it named none); a handler gets events only, so it publishes nothing."""

    subscribes: tuple[type[Event], ...] = (Event,)  # the class: any event a config may name

    def __init__(
        self, name: str, handler: Callable[[Event], Awaitable[None] | None], types: Sequence[type[Event]]
    ):
        self.name = name
        self.handler = handler
        self.types = tuple(types)
        self.subscribes = self.types

    def on_attach(self, bus: Bus) -> None:
        for event_type in self.types:
            bus.subscribe(event_type, self.handler, name=self.name)

    async def run(self, bus: Bus) -> None:
        self.attach(bus)


def _event_type(name: str) -> type[Event]:
    for cls in events.event_types():
        if cls.__name__ == name:
            return cls
    if ":" in name:
        cls = import_ref(name)
        if isinstance(cls, type) and issubclass(cls, Event):
            return cls
    raise PluginError(f"unknown event type {name!r}")


def plugin_component(
    ref: str, *, event_names: Sequence[str] = (), options: dict[str, Any] | None = None
) -> Any:
    """Turn a `plugins:` entry into a component.

    The referenced object may be a component class or factory (called with the options, and
    used as is when it has `run(bus)`), or a handler function, which then receives the events
    named in `event_names` (or those it declares in an `events` attribute; all events if none).
    """
    obj = load("event_handlers", ref)
    options = options or {}
    if inspect.isclass(obj) or (callable(obj) and getattr(obj, "platoon_factory", False)):
        obj = obj(**options)
        if not hasattr(obj, "run"):
            raise PluginError(f"{ref!r} built {obj!r}, which has no `run(bus)` method")
        return obj
    if hasattr(obj, "run"):
        return obj
    if not callable(obj):
        raise PluginError(f"{ref!r} is neither a component nor a handler")
    if options:
        raise PluginError(f"{ref!r} is a handler function; it takes no options")
    names = list(event_names) or list(getattr(obj, "events", ()))
    types = [_event_type(n) for n in names] or [Event]
    return EventHandlerPlugin(ref, obj, types)

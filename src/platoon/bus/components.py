"""Components: the units that meet on the bus.

A component is any object with `async def run(bus)`. It subscribes to what it needs and
publishes what it learns; it never holds a reference to another component. `run_components`
runs a set of them in one task group, trio style: they start together, and if one fails the
failure is published as `ComponentFailed` and the others are cancelled, so a broken run stops
instead of limping on.

A component may also have a plain `attach(bus)` method, which subscribes without awaiting.
`run_components` attaches every component before any of them runs, so no component misses an
event that another publishes as soon as it starts.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

import anyio
import structlog

from platoon.bus.core import Bus
from platoon.bus.events import ComponentFailed

__all__ = ["Component", "attach", "component_name", "run_components"]

log = structlog.get_logger("platoon.components")


@runtime_checkable
class Component(Protocol):
    async def run(self, bus: Bus) -> None: ...


def attach(components: Iterable[object], bus: Bus) -> None:
    """Call `attach(bus)` on every component that has one."""
    for component in components:
        hook = getattr(component, "attach", None)
        if hook is not None:
            hook(bus)


def component_name(component: object) -> str:
    return getattr(component, "name", None) or type(component).__name__


async def run_components(bus: Bus, components: Iterable[Component]) -> None:
    """Run every component's `run(bus)` concurrently until all have returned."""

    async def guarded(component: Component) -> None:
        try:
            await component.run(bus)
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:
            name = component_name(component)
            log.error("component failed", component=name, error=f"{type(exc).__name__}: {exc}")
            if bus.running:
                bus.publish_nowait(
                    ComponentFailed(
                        component=name,
                        error=f"{type(exc).__name__}: {exc}",
                        traceback="".join(traceback.format_exception(exc)),
                    )
                )
            raise

    components = list(components)
    attach(components, bus)
    async with anyio.create_task_group() as tg:
        for component in components:
            tg.start_soon(guarded, component, name=f"platoon:{component_name(component)}")

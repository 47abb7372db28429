"""Components: the units that meet on the bus.

A component is an object with `async def run(bus)`. It subscribes to what it needs and
publishes what it learns; it never holds a reference to another component. `run_components`
runs a set of them in one task group, trio style: they start together, and if one fails the
failure is published as `ComponentFailed` and the others are cancelled, so a broken run stops
instead of limping on.

A component may also have a plain `attach(bus)` method, which subscribes without awaiting
(and does nothing when called again). `run_components` attaches every component before any
of them runs, so no component misses an event that another publishes as soon as it starts.

Every component of platoon's own derives from `ComponentBase`, which declares what it takes
(`subscribes`) and what it publishes (`publishes`) and does the attach-once bookkeeping; the
declarations are what `platoon graph` draws and what the tests hold the real subscriptions
to. An object with only `run(bus)` still runs; it is just not on the graph.
"""

from __future__ import annotations

import contextlib
import inspect
import traceback
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Protocol, runtime_checkable

import anyio
import anyio.abc
import structlog

from platoon.bus.core import Bus
from platoon.bus.events import ComponentFailed, Event

__all__ = ["Component", "ComponentBase", "attach", "component_name", "run_components"]

log = structlog.get_logger("platoon.components")


@runtime_checkable
class Component(Protocol):
    """What a component of platoon is: its declarations, `attach(bus)` and `run(bus)`."""

    subscribes: tuple[type[Event], ...]
    publishes: tuple[type[Event], ...]

    def attach(self, bus: Bus) -> None: ...

    async def run(self, bus: Bus) -> None: ...


class ComponentBase:
    """The base of platoon's components: declarations, and `attach(bus)` done once.

    `subscribes` is every event type the component takes: what it subscribes to or streams,
    requests it answers, and the replies to requests it sends (`bus.request` takes those for
    it). `publishes` is every type it publishes: facts, requests it sends and replies it
    gives. `Event` means any event: the event log takes every one, and a NATS bridge or a
    plugin handler, as a class, may take any its settings name. Declarations are class
    attributes; a component whose types come from its settings sets them on the instance.

    A subclass opens its subscriptions in `on_attach(bus)`, which `attach` calls once, and
    calls `self.attach(bus)` at the top of `run`, which then does nothing when
    `run_components` attached it already.
    """

    subscribes: tuple[type[Event], ...] = ()
    publishes: tuple[type[Event], ...] = ()
    _attached: bool = False

    def attach(self, bus: Bus) -> None:
        """Subscribe to what this component takes; a second call does nothing."""
        if self._attached:
            return
        self._attached = True
        self.on_attach(bus)

    def on_attach(self, bus: Bus) -> None:
        """Open the component's subscriptions (without awaiting); called once, by `attach`."""


def attach(components: Iterable[object], bus: Bus) -> None:
    """Call `attach(bus)` on every component that has one."""
    for component in components:
        hook = getattr(component, "attach", None)
        if hook is not None:
            hook(bus)


def component_name(component: object) -> str:
    return getattr(component, "name", None) or type(component).__name__


async def run_components(
    bus: Bus,
    components: Iterable[Component],
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run every component's `run(bus)` concurrently until all have returned.

    A component whose `run` takes a `task_status` (trio's convention) is started with
    `TaskGroup.start`, so it can say when it is ready; `task_status.started()` is called once
    every component is attached and started.
    """

    async def guarded(
        component: Component, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            if _takes_task_status(component):
                await component.run(bus, task_status=task_status)  # type: ignore[call-arg]
            else:
                task_status.started()
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
            await tg.start(guarded, component, name=f"platoon:{component_name(component)}")
        task_status.started()


def _takes_task_status(component: object) -> bool:
    try:
        return "task_status" in inspect.signature(component.run).parameters  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        return False


@contextlib.asynccontextmanager
async def running(bus: Bus, components: Sequence[object]) -> AsyncIterator[None]:
    """Run `components` on `bus` for the duration of the block, then cancel them.

    Every component is attached (subscribed) before any of them runs, so a request published
    inside the block always finds its responder. A block that ends normally first lets the
    components handle what was published (up to the bus's `drain_timeout`): the last step's
    metrics and events were often published a moment before the run ended.
    """
    attach(components, bus)
    async with anyio.create_task_group() as tg:
        await tg.start(run_components, bus, components)
        ended = False
        try:
            yield
            ended = True
        finally:
            if ended:
                with anyio.move_on_after(bus.drain_timeout) as waited:
                    await bus.drained()
                if waited.cancelled_caught:
                    log.warning("components still busy when the run ended", busy=bus.busy())
            tg.cancel_scope.cancel()

"""The in-process event bus.

Components meet only here: they publish typed events and subscribe to the types they care
about. The bus is built on anyio memory streams, so it runs under asyncio and trio and can be
embedded in another application:

    async with platoon.Bus() as bus:
        bus.subscribe(EpisodeGraded, on_graded)
        await bus.publish(event)

Guarantees, and why:

* Routing is by class: a subscription to `T` receives `T` and its subclasses (so a
  subscription to `Event` sees everything, which is how the event log works). One
  subscription may name several types, `(A, B)`, and then sees all of them in publish order.
* Every subscriber has a bounded buffer. A slow subscriber makes `publish` wait rather than
  letting memory grow without bound: backpressure travels back to whoever produces too much.
* A subscriber receives events in publish order, one at a time.
* A handler that raises is reported as a `ComponentFailed` event and in the log; the bus and
  the other subscribers carry on.
* Leaving the `async with` block drains what is buffered (up to `drain_timeout`), then
  cancels what is left, so shutdown never hangs.
"""

from __future__ import annotations

import inspect
import math
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Generic, TypeVar, TypeVarTuple

import anyio
import structlog
from anyio.abc import TaskGroup

from platoon.bus.events import ComponentFailed, Event, Reply, Request, reply_type

__all__ = ["Bus", "BusClosed", "NoResponder", "RequestTimeout", "Stream", "Subscription"]

E = TypeVar("E", bound=Event)
# A subscription's type only narrows what its reader sees: the bus may hold a subscription to
# EpisodeGraded as a subscription to Event (covariant), sending it only what matches its types.
E_co = TypeVar("E_co", bound=Event, covariant=True)
R = TypeVar("R", bound=Reply)
Args = TypeVarTuple("Args")
EventTypes = type[Event] | tuple[type[Event], ...]  # what one subscription takes

log = structlog.get_logger("platoon.bus")


class BusClosed(RuntimeError):
    """The bus is not running: enter `async with Bus()` first, or it has shut down."""


class NoResponder(LookupError):
    """A request was published but nothing subscribes to its type."""


class RequestTimeout(TimeoutError):
    """No reply arrived within the request's timeout."""


class Subscription(Generic[E_co]):
    """One subscriber's buffer. Close it to unsubscribe; what is buffered is then dropped."""

    def __init__(self, bus: Bus, event_type: EventTypes, name: str, buffer: int) -> None:
        self.bus = bus
        self.event_type = event_type
        self.name = name
        self._send, self._receive = anyio.create_memory_object_stream[E_co](buffer)
        self.closed = False
        self.held = False  # an event taken and not yet handled

    def unhandled(self) -> int:
        """Events published to this subscriber and not yet handled."""
        return self._receive.statistics().current_buffer_used + self.held

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.bus._remove(self)
            self._send.close()
            # What is still buffered (or taken) will never be handled: count it as done.
            self.bus._done(self.unhandled())
            self.held = False
            self._receive.close()


class Stream(Generic[E]):
    """`async with bus.stream(T) as events: async for event in events: ...`"""

    def __init__(
        self, bus: Bus, event_type: type[E] | tuple[type[Event], ...], buffer: int | None, name: str | None
    ) -> None:
        self._bus = bus
        self._event_type = event_type
        self._buffer = buffer
        self._name = name
        self._sub: Subscription[E] | None = None

    def open(self) -> Stream[E]:
        """Subscribe now, without awaiting: events published from here on are kept.

        Components call this in `attach(bus)`, so nothing published before their `run`
        starts is missed. Pair it with `close()`, or use `with`/`async with`."""
        if self._sub is None:
            name = self._name or f"stream:{_names(self._event_type)}"
            self._sub = self._bus._add(self._event_type, name, self._buffer)
        return self

    def close(self) -> None:
        self._release()
        if self._sub is not None:
            self._sub.close()

    def _release(self) -> None:
        # An event counts as handled when its reader asks for the next one (or closes the
        # stream), so `Bus.drained()` also waits for the work a reader does with each event.
        if self._sub is not None and self._sub.held:
            self._sub.held = False
            self._bus._done(1)

    def __enter__(self) -> Stream[E]:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Stream[E]:
        return self.open()

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __aiter__(self) -> AsyncIterator[E]:
        if self._sub is None:
            raise RuntimeError("use `async with bus.stream(T) as events:` before iterating")
        return self

    async def __anext__(self) -> E:
        if self._sub is None:
            raise RuntimeError("use `async with bus.stream(T) as events:` before iterating")
        self._release()
        receive = self._sub._receive
        try:
            event = receive.receive_nowait()
        except anyio.WouldBlock:
            try:
                event = await receive.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                raise StopAsyncIteration from None
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None
        self._sub.held = True
        return event

    async def receive(self) -> E:
        """The next event; raises `StopAsyncIteration` when the bus has closed."""
        return await self.__anext__()

    def receive_nowait(self) -> E:
        """The next event if one waits, else `anyio.WouldBlock`; `StopAsyncIteration` once closed."""
        if self._sub is None:
            raise RuntimeError("use `async with bus.stream(T) as events:` before receiving")
        self._release()
        try:
            event = self._sub._receive.receive_nowait()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None
        self._sub.held = True
        return event


class Bus:
    """The typed, in-process publish/subscribe bus. See the module docstring."""

    def __init__(self, *, buffer_size: int = 1024, drain_timeout: float = 5.0) -> None:
        if buffer_size < 1:
            raise ValueError("buffer_size must be at least 1")
        self.buffer_size = buffer_size
        self.drain_timeout = drain_timeout
        self._subs: list[Subscription[Event]] = []
        self._routes: dict[type, tuple[Subscription[Event], ...]] = {}
        self._waiters: dict[str, _Waiter] = {}
        self._tg: TaskGroup | None = None
        self._pending = 0
        self._idle = anyio.Event()
        self._closing = False

    # --- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Bus:
        if self._tg is not None:
            raise RuntimeError("this bus is already running")
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._tg is not None
        if exc_type is None:
            with anyio.move_on_after(self.drain_timeout):
                await self.drained()
        self._closing = True
        for sub in list(self._subs):
            sub.close()
        self._tg.cancel_scope.cancel()
        try:
            return await self._tg.__aexit__(exc_type, exc, tb)
        finally:
            self._tg = None

    @property
    def running(self) -> bool:
        return self._tg is not None and not self._closing

    async def drained(self) -> None:
        """Wait until every published event has been handled by every subscriber."""
        while self._pending:
            if self._idle.is_set():
                self._idle = anyio.Event()
            await self._idle.wait()

    def busy(self) -> list[str]:
        """The subscriptions with events not yet handled (what `drained()` waits for)."""
        return [s.name for s in self._subs if s.unhandled()]

    def start_soon(
        self,
        func: Callable[[*Args], Coroutine[object, object, object]],
        *args: *Args,
        name: str | None = None,
    ) -> None:
        """Run a task for the lifetime of the bus (cancelled when it shuts down)."""
        if self._tg is None:
            raise BusClosed("the bus is not running")
        self._tg.start_soon(func, *args, name=name)

    # --- subscribing -----------------------------------------------------------------------

    def subscribe(
        self,
        event_type: type[E] | tuple[type[Event], ...],
        handler: Callable[[E], Awaitable[None] | None],
        *,
        name: str | None = None,
        buffer: int | None = None,
    ) -> Subscription[E]:
        """Call `handler(event)` for every event of `event_type` (or a subclass), in order.

        `event_type` may be a tuple of types: one handler then sees all of them in order.

        The handler may be a plain function or a coroutine function. It runs in a task of the
        bus; while it works, further events wait in this subscription's buffer.
        """
        if self._tg is None or self._closing:
            raise BusClosed("subscribe needs a running bus: use `async with Bus() as bus:`")
        name = name or str(getattr(handler, "__qualname__", None) or repr(handler))
        sub = self._add(event_type, name, buffer)
        self._tg.start_soon(self._handle, sub, handler, name=f"platoon.bus:{name}")
        return sub

    def stream(
        self,
        event_type: type[E] | tuple[type[Event], ...],
        *,
        buffer: int | None = None,
        name: str | None = None,
    ) -> Stream[E]:
        """An async iterator over events of `event_type` (a type or a tuple of types, seen in
        publish order); use it as `async with bus.stream(T) as s`."""
        return Stream(self, event_type, buffer, name)

    def _add(
        self, event_type: type[E] | tuple[type[Event], ...], name: str, buffer: int | None
    ) -> Subscription[E]:
        types = event_type if isinstance(event_type, tuple) else (event_type,)
        if not types or not all(isinstance(t, type) and issubclass(t, Event) for t in types):
            raise TypeError(f"can only subscribe to Event types, got {event_type!r}")
        if self._tg is None or self._closing:
            raise BusClosed("the bus is not running")
        sub: Subscription[E] = Subscription(self, event_type, name, buffer or self.buffer_size)
        self._subs.append(sub)
        self._routes.clear()
        return sub

    def _remove(self, sub: Subscription[Event]) -> None:
        if sub in self._subs:
            self._subs.remove(sub)
            self._routes.clear()

    def _done(self, n: int) -> None:
        self._pending -= n
        if self._pending <= 0:
            self._pending = 0
            self._idle.set()

    async def _handle(self, sub: Subscription[E], handler: Callable[[E], Awaitable[None] | None]) -> None:
        receive = sub._receive
        try:
            while True:
                try:
                    event = receive.receive_nowait()
                except anyio.WouldBlock:
                    event = await receive.receive()
                try:
                    result = handler(event)
                    if inspect.isawaitable(result):
                        await result
                except anyio.get_cancelled_exc_class():
                    raise
                except Exception as exc:
                    self._report_failure(sub.name, event, exc)
                finally:
                    self._done(1)
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            return

    def _report_failure(self, component: str, event: Event | None, exc: BaseException) -> None:
        log.error(
            "handler failed",
            component=component,
            event_type=type(event).__name__ if event is not None else None,
            error=f"{type(exc).__name__}: {exc}",
        )
        failed = ComponentFailed(
            component=component,
            error=f"{type(exc).__name__}: {exc}",
            event_type=type(event).__name__ if event is not None else None,
            traceback="".join(traceback.format_exception(exc)),
        )
        if isinstance(event, ComponentFailed):
            return  # a failing failure handler must not feed itself forever
        # Never wait here: the failing subscriber may itself be the one whose buffer is full.
        self.publish_nowait(failed)

    # --- publishing ------------------------------------------------------------------------

    def _targets(self, event_type: type) -> tuple[Subscription[Event], ...]:
        targets = self._routes.get(event_type)
        if targets is None:
            targets = tuple(s for s in self._subs if issubclass(event_type, s.event_type))
            self._routes[event_type] = targets
        return targets

    async def publish(self, event: Event) -> None:
        """Deliver `event` to every matching subscriber, waiting where a buffer is full."""
        if self._tg is None:
            raise BusClosed("publish needs a running bus: use `async with Bus() as bus:`")
        if isinstance(event, Reply):
            self._resolve(event)
        for sub in self._targets(type(event)):
            self._pending += 1
            try:
                sub._send.send_nowait(event)
            except anyio.WouldBlock:
                try:
                    await sub._send.send(event)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    self._done(1)
                except BaseException:
                    self._done(1)
                    raise
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._done(1)

    def publish_nowait(self, event: Event) -> None:
        """Deliver without waiting: a full buffer gets the event from a background task.

        For callers that must not block (failure reports, callbacks from other threads'
        results); ordering against concurrent `publish` calls is then not guaranteed.
        """
        if self._tg is None:
            raise BusClosed("the bus is not running")
        if isinstance(event, Reply):
            self._resolve(event)
        for sub in self._targets(type(event)):
            self._pending += 1
            try:
                sub._send.send_nowait(event)
            except anyio.WouldBlock:
                self._tg.start_soon(self._send_later, sub, event)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                self._done(1)

    async def _send_later(self, sub: Subscription[Event], event: Event) -> None:
        try:
            await sub._send.send(event)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._done(1)

    # --- request / reply -------------------------------------------------------------------

    async def request(self, event: Request[R], *, timeout: float | None = 30.0) -> R:
        """Publish a request and wait for the reply whose `reply_to` is its `request_id`, of the
        type the request names (`Request[R]`).

        Raises `NoResponder` when nothing subscribes to the request's type,
        `RequestTimeout` when no reply comes within `timeout` seconds (None waits forever), and
        `TypeError` when the reply is not of the request's reply type.
        """
        expected = reply_type(type(event))
        if not self._targets(type(event)):
            raise NoResponder(f"nothing on the bus answers {type(event).__name__}")
        waiter = self._waiters[event.request_id] = _Waiter()
        try:
            with anyio.fail_after(math.inf if timeout is None else timeout):
                await self.publish(event)
                await waiter.done.wait()
        except TimeoutError:
            raise RequestTimeout(
                f"no reply to {type(event).__name__} {event.request_id} within {timeout} s"
            ) from None
        finally:
            self._waiters.pop(event.request_id, None)
        reply = waiter.reply
        if not isinstance(reply, expected):
            raise TypeError(
                f"{type(event).__name__} was answered by a {type(reply).__name__}; its reply type is {expected.__name__}"
            )
        return reply

    def subscriptions(self) -> list[tuple[str, tuple[type[Event], ...]]]:
        """(name, event types) of every open subscription: what `platoon graph`'s tests check
        against the components' declarations."""
        return [
            (s.name, s.event_type if isinstance(s.event_type, tuple) else (s.event_type,)) for s in self._subs
        ]

    def _resolve(self, reply: Reply) -> None:
        waiter = self._waiters.pop(reply.reply_to, None)
        if waiter is not None:  # the first reply answers; a request waits for no other
            waiter.reply = reply
            waiter.done.set()


class _Waiter:
    """A request's reply, once it comes (an event and a slot: lighter than a stream of one)."""

    __slots__ = ("done", "reply")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.reply: Reply | None = None


def _names(event_type: EventTypes) -> str:
    types = event_type if isinstance(event_type, tuple) else (event_type,)
    return ",".join(t.__name__ for t in types)

"""Facts: event types whose latest value matters to whoever comes later, such as the current
policy and the run's end.

A bridge with `write_state=True` also keeps each one it sends in the run's state stream
(`platoon-<run>-state`, one message per type); a bridge with `read_state=True` reads them at
start and after every reconnect, so a worker that was down, or started after the trainer said
something once, still learns it. A writer clears the stream when it starts, so a trainer that
reuses a run name does not inherit its predecessor's end (a worker started before it may still
read that end and stop: start the trainer first, or use a new run).
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import nats.errors
import nats.js.errors
import structlog
from nats.js import JetStreamContext, api

from platoon.bus.events import Event
from platoon.bus.nats.wire import tag

log = structlog.get_logger("platoon.bus.nats")


class Facts:
    """The run's state stream: the last value of each type in `types`."""

    def __init__(
        self,
        run: str,
        types: Sequence[type[Event]],
        *,
        write: bool,
        read: bool,
        timeout: float,
        max_age: float,
    ) -> None:
        self.run = run
        self.types = types
        self.write = write
        self.read = read
        self.timeout = timeout
        self.max_age = max_age
        self.stream = f"platoon-{run}-state"

    def kept(self, event: Event) -> bool:
        """Whether this bridge keeps `event` in the state stream when it sends it."""
        return self.write and type(event) in self.types

    def subject(self, event_type: type[Event]) -> str:
        return f"platoon.{self.run}.state.{tag(event_type)}"

    async def ensure(self, js: JetStreamContext) -> None:
        """Create the run's state stream, or clear the facts an earlier writer (a trainer this
        one replaces, under the same run name) left there."""
        try:
            await js.stream_info(self.stream)
            await js.purge_stream(self.stream)
        except nats.js.errors.NotFoundError:
            try:
                await js.add_stream(
                    name=self.stream,
                    subjects=[f"platoon.{self.run}.state.>"],
                    max_msgs_per_subject=1,
                    max_age=self.max_age,
                )
            except nats.js.errors.BadRequestError:
                pass  # another bridge made it first

    async def keep(self, js: JetStreamContext | None, event: Event, data: bytes) -> None:
        """Keep `event` as the last value of its type (best effort: the mirror still carries it)."""
        if js is None:
            return
        try:
            with anyio.fail_after(self.timeout):
                await js.publish(self.subject(type(event)), data)
        except (TimeoutError, nats.errors.Error) as exc:
            log.warning(
                "could not keep a fact in the state stream", type=type(event).__name__, error=str(exc)
            )

    async def last(self, js: JetStreamContext | None) -> list[api.RawStreamMsg]:
        """The kept message of each type (none if this bridge does not read facts)."""
        if not self.read or js is None:
            return []
        found = []
        for event_type in self.types:
            try:
                with anyio.fail_after(self.timeout):
                    found.append(await js.get_last_msg(self.stream, self.subject(event_type)))
            except (TimeoutError, nats.errors.Error) as exc:
                log.debug("no fact in the state stream", type=event_type.__name__, error=str(exc))
        return found

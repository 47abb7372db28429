"""`system.running`: the components of a run, started together and stopped together."""

import anyio
import pytest

from platoon import system
from platoon.bus import Bus, ComponentBase
from platoon.bus.events import TrainStepFinished

pytestmark = pytest.mark.anyio


class SlowRecorder(ComponentBase):
    """Takes each step after a pause, as a metrics sink writing to a slow disk does."""

    subscribes = (TrainStepFinished,)

    def __init__(self) -> None:
        self.seen: list[int] = []

    def on_attach(self, bus: Bus) -> None:
        self._events = bus.stream(TrainStepFinished, name="slow").open()

    async def run(self, bus: Bus) -> None:
        self.attach(bus)
        with self._events as events:
            async for event in events:
                for _ in range(20):  # a handful of scheduler turns per event
                    await anyio.lowlevel.checkpoint()
                self.seen.append(event.step)


async def test_a_run_that_ends_lets_its_components_take_what_was_published():
    recorder = SlowRecorder()
    async with Bus() as bus:
        async with system.running(bus, [recorder]):
            for step in range(5):
                await bus.publish(TrainStepFinished(step=step, metrics={}))
        # the last steps were published moments before the run ended: none is lost
        assert recorder.seen == [0, 1, 2, 3, 4]

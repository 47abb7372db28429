"""A tiny event-handler plugin used by platoon's tests."""

seen = []


def count_steps(event):
    seen.append(event)


count_steps.events = ["TrainStepFinished"]


class Recorder:
    def __init__(self, prefix="rec"):
        self.prefix = prefix
        self.events = []

    async def run(self, bus):
        from platoon.bus.events import RunFinished

        bus.subscribe(RunFinished, self.events.append, name=f"{self.prefix}-recorder")

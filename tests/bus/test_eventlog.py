import pytest

from platoon.bus import Bus, EventLog, read_events, run_components
from platoon.bus.events import ComponentFailed, RunFinished, TrainStepFinished

pytestmark = pytest.mark.anyio


async def test_event_log_writes_every_event_and_reads_back(tmp_path):
    log = EventLog(tmp_path, flush_every=3)
    async with Bus() as bus:
        log.attach(bus)  # subscribed before anything is published
        bus.start_soon(log.run, bus)
        for i in range(10):
            await bus.publish(TrainStepFinished(step=i, metrics={"loss:sum": float(i)}))
        await bus.publish(RunFinished(status="completed"))
    events = list(read_events(tmp_path))
    assert [e.step for e in events[:10]] == list(range(10))
    assert events[-1] == RunFinished(status="completed")


async def test_a_truncated_last_record_ends_reading(tmp_path):
    log = EventLog(tmp_path)
    async with Bus() as bus:
        log.attach(bus)  # subscribed before anything is published
        bus.start_soon(log.run, bus)
        await bus.publish(RunFinished(status="completed"))
        await bus.publish(RunFinished(status="failed"))
    data = log.path.read_bytes()
    log.path.write_bytes(data[:-3])
    assert list(read_events(tmp_path)) == [RunFinished(status="completed")]


def test_missing_log_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no event log"):
        list(read_events(tmp_path))


class Counter:
    name = "counter"

    def __init__(self, n):
        self.n = n

    async def run(self, bus):
        for i in range(self.n):
            await bus.publish(TrainStepFinished(step=i, metrics={}))


class Crashes:
    name = "crashes"

    async def run(self, bus):
        raise RuntimeError("cannot start")


async def test_run_components_runs_all_and_reports_a_failure():
    got, failures = [], []
    async with Bus() as bus:
        bus.subscribe(TrainStepFinished, got.append)
        await run_components(bus, [Counter(3), Counter(2)])
        bus.subscribe(ComponentFailed, failures.append)
        with pytest.raises(Exception) as info:
            await run_components(bus, [Crashes()])
        assert "cannot start" in repr(info.value) or "cannot start" in str(info.value.exceptions)
    assert len(got) == 5
    assert failures[0].component == "crashes"

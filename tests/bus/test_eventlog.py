import struct
import time

import anyio
import anyio.lowlevel
import pytest

from platoon.bus import Bus, EventLog, LogDamage, read_events, read_records, run_components
from platoon.bus.chat import ChatMessage
from platoon.bus.eventlog import SYNC
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


async def _log_of(tmp_path, events) -> EventLog:
    log = EventLog(tmp_path)
    async with Bus() as bus:
        log.attach(bus)
        bus.start_soon(log.run, bus)
        for event in events:
            await bus.publish(event)
    return log


async def test_every_record_has_a_time_and_a_checksum(tmp_path):
    before = time.time()
    log = await _log_of(tmp_path, [TrainStepFinished(step=i, metrics={}) for i in range(3)])
    records = list(read_records(tmp_path))
    assert [e.step for _, e in records] == [0, 1, 2]
    assert all(before <= t <= time.time() for t, _ in records)
    assert log.path.read_bytes().startswith(b"PLTNEV03")


async def test_a_damaged_record_is_skipped_and_counted(tmp_path):
    log = await _log_of(tmp_path, [TrainStepFinished(step=i, metrics={"x": 1.0}) for i in range(5)])
    data = bytearray(log.path.read_bytes())
    at = [i for i in range(len(data)) if data[i : i + 2] == SYNC][2]  # the third record
    data[at + 20] ^= 0xFF  # one flipped byte in its body
    log.path.write_bytes(bytes(data))
    damage = LogDamage(path=str(log.path))
    assert [e.step for e in read_events(tmp_path, damage)] == [0, 1, 3, 4]
    assert damage.damaged_records == 1 and damage.found


async def test_garbage_in_the_middle_is_skipped_up_to_the_next_record(tmp_path):
    log = await _log_of(tmp_path, [TrainStepFinished(step=i, metrics={}) for i in range(2)])
    data = log.path.read_bytes()
    first_end = data.index(SYNC, len(b"PLTNEV02") + 1)
    log.path.write_bytes(data[:first_end] + b"garbage" * 50 + data[first_end:])
    damage = LogDamage(path=str(log.path))
    assert [e.step for e in read_events(tmp_path, damage)] == [0, 1]
    assert damage.skipped_bytes == 350


def test_a_log_from_before_the_framing_still_reads(tmp_path):
    from platoon.bus.codec import encode

    records = b"".join(
        struct.pack(">I", len(data)) + data for data in (encode(RunFinished(status="completed")),) * 2
    )
    (tmp_path / "events.msgpack").write_bytes(records)
    assert list(read_events(tmp_path)) == [RunFinished(status="completed")] * 2


def test_platoon_events_exits_non_zero_on_a_damaged_log_unless_salvage(tmp_path, capsys):
    import anyio

    from platoon.cli import main

    log = anyio.run(_log_of, tmp_path, [RunFinished(status="completed"), RunFinished(status="failed")])
    log.path.write_bytes(log.path.read_bytes()[:-3])
    assert main(["events", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "RunFinished status='completed'" in captured.out
    assert "cut short" in captured.err
    assert main(["events", str(tmp_path), "--salvage"]) == 0
    assert main(["events", str(tmp_path), "--type", "RunFinishd"]) != 0
    assert "did you mean RunFinished" in capsys.readouterr().err


def test_a_file_that_is_no_event_log_says_so(tmp_path, capsys):
    from platoon.bus import LogDamage
    from platoon.cli import main

    (tmp_path / "events.msgpack").write_bytes(bytes(range(256)) * 20)  # garbage, no header
    damage = LogDamage(path="")
    assert list(read_events(tmp_path, damage)) == []
    assert damage.found and damage.not_a_log
    assert main(["events", str(tmp_path)]) == 1
    assert "is not a platoon event log (no PLTNEV header" in capsys.readouterr().err


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


async def test_what_the_bus_handed_over_is_on_disk_while_the_run_goes_on(tmp_path):
    """The log flushes whenever it has nothing more to write: a crash now loses nothing."""
    log = EventLog(tmp_path, flush_every=10_000)
    async with Bus() as bus:
        log.attach(bus)
        bus.start_soon(log.run, bus)
        for i in range(5):
            await bus.publish(TrainStepFinished(step=i, metrics={}))
        await bus.drained()
        while log.count < 5:  # noqa: ASYNC110 - the log's progress, in its own task
            await anyio.sleep(0.001)
        await anyio.lowlevel.checkpoint()  # let it see that nothing more is waiting, and flush
        on_disk = [e.step for e in read_events(tmp_path)]
    assert on_disk == [0, 1, 2, 3, 4]


async def test_large_records_are_stored_compressed_and_read_back_the_same(tmp_path):
    from platoon.bus.events import ModelCallFinished

    call = ModelCallFinished(
        call_id="c",
        episode_id="e",
        agent_id="a",
        prompt_tokens=[151_000 + i % 7 for i in range(4000)],
        completion_tokens=list(range(300)),
        logprobs=[-0.5] * 300,
        stop_reason="stop",
        policy_version=0,
    )
    log = await _log_of(tmp_path, [call, RunFinished(status="completed")])
    assert log.path.stat().st_size < len(__import__("platoon").bus.encode(call)) / 3
    assert list(read_events(tmp_path)) == [call, RunFinished(status="completed")]


async def test_scan_gives_offsets_that_read_at_reads_back(tmp_path):
    from platoon.bus.eventlog import read_at, scan

    events = [
        TrainStepFinished(step=i, metrics={"x": float(i)} | {f"k{j}": 1.0 for j in range(60)})
        for i in range(4)
    ]
    log = await _log_of(tmp_path, events)
    records = list(scan(tmp_path))
    assert [r.event for r in records] == events
    with log.path.open("rb") as file:
        assert [read_at(file, r.offset).event for r in reversed(records)] == events[::-1]
        with pytest.raises(ValueError):
            read_at(file, records[1].offset + 1)
    # Reading on from an offset `scan` gave: the records after it.
    assert [r.event for r in scan(tmp_path, start=records[1].end)] == events[2:]


async def test_a_pltnev02_log_reads_and_is_appended_in_its_own_format(tmp_path):
    from platoon.bus.eventlog import frame

    first = TrainStepFinished(step=0, metrics={f"k{j}": 1.0 for j in range(100)})
    (tmp_path / "events.msgpack").write_bytes(b"PLTNEV02" + frame(first, compress=False))
    later = TrainStepFinished(step=1, metrics={f"k{j}": 2.0 for j in range(100)})
    log = await _log_of(tmp_path, [later])
    assert list(read_events(tmp_path)) == [first, later]
    data = log.path.read_bytes()
    assert data.startswith(b"PLTNEV02") and not any(
        struct.unpack_from(">I", data, at + 2)[0] & 0x8000_0000
        for at in range(len(data))
        if data[at : at + 2] == SYNC
    )


def _call(agent: str, prompt: list[int], completion: list[int]):
    from platoon.bus.events import ModelCallFinished

    return ModelCallFinished(
        call_id=f"{agent}-{len(prompt)}",
        episode_id="e",
        agent_id=agent,
        prompt_tokens=prompt,
        completion_tokens=completion,
        logprobs=[-0.5] * len(completion),
        stop_reason="stop",
        policy_version=0,
    )


def _conversation(agents: int, turns: int, *, compact_at: int | None = None):
    """Interleaved agents whose prompts extend their previous prompt and completion; with
    `compact_at`, one agent's context is cut there (a new prompt that extends nothing)."""
    import random

    from platoon.bus.events import ChatRequested

    rng = random.Random(0)
    prompts = {f"a{i}": [rng.randrange(150_000) for _ in range(300)] for i in range(agents)}
    messages = {agent: [ChatMessage("user", "go")] for agent in prompts}
    events = []
    for turn in range(turns):
        for agent in prompts:
            if turn == compact_at and agent == "a0":
                prompts[agent] = [7] * 100
                messages[agent] = [ChatMessage("user", "summary")]
            events.append(ChatRequested(episode_id="e", agent_id=agent, messages=list(messages[agent])))
            completion = [rng.randrange(150_000) for _ in range(40)]
            events.append(_call(agent, list(prompts[agent]), completion))
            prompts[agent] = prompts[agent] + completion + [rng.randrange(150_000) for _ in range(20)]
            messages[agent] = [*messages[agent], ChatMessage("assistant", f"t{turn}")]
    return events


async def test_an_agents_growing_context_is_stored_once_and_reads_back_exactly(tmp_path):
    from platoon.bus.codec import encode
    from platoon.bus.eventlog import RecordReader, read_at, scan

    events = _conversation(agents=3, turns=40, compact_at=25)
    log = await _log_of(tmp_path, events)
    assert list(read_events(tmp_path)) == events
    stored = log.path.stat().st_size
    assert stored < sum(len(encode(e)) for e in events) / 5
    records = list(scan(tmp_path))
    # Any record reads alone at its offset (following at most 16 bases), or in any order.
    with log.path.open("rb") as file:
        assert [read_at(file, r.offset).event for r in records[::7]] == events[::7]
        reader = RecordReader(file)
        assert [reader.at(r.offset).event for r in reversed(records)] == events[::-1]
    # Scanning on from the middle rebuilds deltas whose bases come before where it starts.
    middle = records[len(records) // 2].offset
    assert [r.event for r in scan(tmp_path, start=middle)] == events[len(records) // 2 :]


async def test_a_damaged_base_loses_its_deltas_not_the_rest(tmp_path):
    from platoon.bus.eventlog import scan

    events = _conversation(agents=2, turns=6)
    log = await _log_of(tmp_path, events)
    records = list(scan(tmp_path))
    data = bytearray(log.path.read_bytes())
    victim = records[1]  # the first ModelCallFinished of agent a0: the base of its next calls
    data[victim.offset + 30] ^= 0xFF
    log.path.write_bytes(bytes(data))
    damage = LogDamage(path=str(log.path))
    read = list(read_events(tmp_path, damage))
    assert damage.damaged_records >= 2  # the record and what was built on it
    assert all(e in events for e in read)
    assert [e for e in read if getattr(e, "agent_id", "") == "a1"] == [
        e for e in events if getattr(e, "agent_id", "") == "a1"
    ]

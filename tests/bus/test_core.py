import anyio
import anyio.lowlevel
import pytest

from platoon.bus import Bus, BusClosed, NoResponder, RequestTimeout
from platoon.bus.events import ComponentFailed, Event, Reply, Request, RunFinished, TrainStepFinished

pytestmark = pytest.mark.anyio


class Ping(Request, frozen=True, kw_only=True):
    n: int


class Pong(Reply, frozen=True, kw_only=True):
    n: int


class Ask(Request["Answer"], frozen=True, kw_only=True):
    n: int


class Answer(Reply, frozen=True, kw_only=True):
    n: int


def step(i: int) -> TrainStepFinished:
    return TrainStepFinished(step=i, metrics={})


async def test_delivers_in_publish_order_to_each_subscriber():
    a, b = [], []
    async with Bus(buffer_size=4) as bus:

        async def slow(event):
            await anyio.lowlevel.checkpoint()
            b.append(event.step)

        bus.subscribe(TrainStepFinished, lambda e: a.append(e.step))
        bus.subscribe(TrainStepFinished, slow)
        for i in range(100):
            await bus.publish(step(i))
    assert a == list(range(100))
    assert b == list(range(100))


async def test_routes_by_class_and_subclass():
    everything, only_steps = [], []
    async with Bus() as bus:
        bus.subscribe(Event, everything.append)
        bus.subscribe(TrainStepFinished, only_steps.append)
        await bus.publish(step(1))
        await bus.publish(RunFinished(status="completed"))
    assert [type(e) for e in everything] == [TrainStepFinished, RunFinished]
    assert only_steps == [step(1)]


async def test_one_subscription_takes_several_types_in_publish_order():
    class Special(TrainStepFinished, frozen=True, kw_only=True):
        pass

    seen, handled = [], []
    async with Bus() as bus:
        stream = bus.stream((TrainStepFinished, RunFinished), name="both").open()
        bus.subscribe((RunFinished, Ping), handled.append)
        assert ("both", (TrainStepFinished, RunFinished)) in bus.subscriptions()
        with pytest.raises(TypeError):
            bus.stream((TrainStepFinished, int)).open()
        for event in (step(1), RunFinished(status="completed"), ComponentFailed(component="x", error="e")):
            await bus.publish(event)
        await bus.publish(Special(step=2, metrics={}))
        with stream:
            for _ in range(3):
                seen.append(await stream.receive())
    assert seen == [step(1), RunFinished(status="completed"), Special(step=2, metrics={})]
    assert handled == [RunFinished(status="completed")]


async def test_stalled_subscriber_bounds_memory_by_blocking_the_publisher():
    release = anyio.Event()
    published = 0
    async with Bus(buffer_size=8, drain_timeout=1) as bus:

        async def stalled(event):
            await release.wait()

        sub = bus.subscribe(TrainStepFinished, stalled)

        async def producer():
            nonlocal published
            for i in range(1000):
                await bus.publish(step(i))
                published += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(producer)
            for _ in range(50):
                await anyio.lowlevel.checkpoint()
            # one event in the handler, `buffer_size` in the buffer: the rest wait in publish
            assert published == 9
            assert sub._receive.statistics().current_buffer_used == 8
            release.set()
    assert published == 1000


async def test_failing_handler_is_reported_and_others_carry_on():
    seen, failures, after = [], [], []
    async with Bus() as bus:

        def broken(event):
            after.append(event.step)
            if event.step == 1:
                raise ValueError("boom")

        bus.subscribe(TrainStepFinished, broken, name="broken")
        bus.subscribe(TrainStepFinished, seen.append)
        bus.subscribe(ComponentFailed, failures.append)
        for i in range(3):
            await bus.publish(step(i))
    assert [e.step for e in seen] == [0, 1, 2]
    assert after == [0, 1, 2]
    assert len(failures) == 1
    assert failures[0].component == "broken"
    assert failures[0].error == "ValueError: boom"
    assert failures[0].event_type == "TrainStepFinished"
    assert "ValueError" in failures[0].traceback


async def test_shutdown_drains_buffered_events():
    got = []
    async with Bus(buffer_size=100) as bus:

        async def slow(event):
            await anyio.sleep(0.001)
            got.append(event.step)

        bus.subscribe(TrainStepFinished, slow)
        for i in range(20):
            await bus.publish(step(i))
    assert got == list(range(20))


async def test_shutdown_cancels_a_stuck_handler_after_the_drain_timeout():
    cancelled = False
    async with Bus(drain_timeout=0.05) as bus:

        async def stuck(event):
            nonlocal cancelled
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                cancelled = True
                raise

        bus.subscribe(TrainStepFinished, stuck)
        await bus.publish(step(0))
    assert cancelled


async def test_a_publish_blocked_on_a_full_buffer_can_be_cancelled():
    async with Bus(buffer_size=1, drain_timeout=0.05) as bus:
        async with bus.stream(TrainStepFinished) as _events:
            await bus.publish(step(0))
            with anyio.move_on_after(0.05) as scope:
                await bus.publish(step(1))
            assert scope.cancelled_caught


async def test_request_reply():
    async with Bus() as bus:

        async def responder(ping: Ping):
            await bus.publish(Pong(reply_to=ping.request_id, n=ping.n + 1))

        bus.subscribe(Ping, responder)
        replies = [await bus.request(Ping(n=i), timeout=1) for i in range(5)]
    assert [r.n for r in replies] == [1, 2, 3, 4, 5]


async def test_a_request_is_answered_by_the_reply_type_it_names():
    async with Bus() as bus:

        async def responder(ask: Ask):
            reply = (
                Answer(reply_to=ask.request_id, n=ask.n + 1) if ask.n else Pong(reply_to=ask.request_id, n=0)
            )
            await bus.publish(reply)

        bus.subscribe(Ask, responder)
        answer = await bus.request(Ask(n=1), timeout=1)
        assert type(answer) is Answer and answer.n == 2
        with pytest.raises(TypeError, match="Ask was answered by a Pong; its reply type is Answer"):
            await bus.request(Ask(n=0), timeout=1)


async def test_a_request_takes_its_first_reply_and_a_reply_after_its_end_is_dropped():
    """Answered twice, a request returns the first reply; the second, like a reply to a request
    that gave up (timed out, cancelled), reaches the subscribers and answers nothing."""
    async with Bus() as bus:
        late: list[Ping] = []
        asked = anyio.Event()

        async def responder(ping: Ping):
            if ping.n == 0:  # answered only after the request gave up
                late.append(ping)
                asked.set()
                return
            await bus.publish(Pong(reply_to=ping.request_id, n=1))
            await bus.publish(Pong(reply_to=ping.request_id, n=2))

        bus.subscribe(Ping, responder)
        async with bus.stream(Pong) as pongs:
            assert (await bus.request(Ping(n=1), timeout=1)).n == 1
            async with anyio.create_task_group() as tg:
                tg.start_soon(bus.request, Ping(n=0))
                await asked.wait()
                tg.cancel_scope.cancel()
            await bus.publish(Pong(reply_to=late[0].request_id, n=3))
            assert [(await pongs.receive()).n for _ in range(3)] == [1, 2, 3]
            assert (await bus.request(Ping(n=1), timeout=1)).n == 1


async def test_request_times_out_and_without_responder_fails_at_once():
    async with Bus() as bus:
        with pytest.raises(NoResponder, match="Ping"):
            await bus.request(Ping(n=1), timeout=1)
        bus.subscribe(Ping, lambda ping: None)
        with pytest.raises(RequestTimeout, match="no reply to Ping"):
            await bus.request(Ping(n=1), timeout=0.05)


async def test_stream_iterates_until_closed():
    got = []
    async with Bus() as bus:
        async with bus.stream(TrainStepFinished) as events:
            for i in range(3):
                await bus.publish(step(i))
            async for event in events:
                got.append(event.step)
                if event.step == 2:
                    break
    assert got == [0, 1, 2]


async def test_stream_must_be_entered():
    async with Bus() as bus:
        with pytest.raises(RuntimeError, match="async with"):
            async for _ in bus.stream(TrainStepFinished):
                pass


async def test_a_bus_that_is_not_running_says_so():
    bus = Bus()
    with pytest.raises(BusClosed):
        await bus.publish(step(0))
    with pytest.raises(BusClosed):
        bus.subscribe(TrainStepFinished, print)


async def test_embeds_in_an_application_task_group():
    got = []
    async with Bus() as bus, anyio.create_task_group() as app:
        bus.subscribe(TrainStepFinished, got.append)

        async def worker():
            await bus.publish(step(7))

        app.start_soon(worker)
    assert got == [step(7)]

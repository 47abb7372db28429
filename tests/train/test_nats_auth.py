"""A distributed run's NATS, as an attacker on the network meets it (loopback only).

The server runs the config `platoon nats init` writes: nobody gets in without credentials, a
worker cannot steer the run, and results count only from the worker given the episode.
"""

from __future__ import annotations

import json
import stat

import anyio
import pytest

pytest.importorskip("nats")

import nats
import nats.errors

from platoon.bus import Bus
from platoon.bus.codec import encode
from platoon.bus.events import (
    EpisodeGraded,
    EpisodeRequested,
    PolicyAnnounced,
    RunFinished,
    TaskRef,
    WorkerStatus,
)
from platoon.bus.nats import ConnectionSettings, Leases, NatsBridge, Routes, subject_for
from platoon.bus.nats.connection import synced
from platoon.bus.nats_server import NatsServer, NatsServerError, find_nats_server
from platoon.train.nats_auth import WORK_QUEUE, write_nats_setup

try:
    find_nats_server()
except NatsServerError:  # pragma: no cover
    pytest.skip("nats-server is not installed", allow_module_level=True)

pytestmark = pytest.mark.anyio
RUN = "demo"
TASK = TaskRef(env="toy", split="train", task_id="t0")


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def secured(tmp_path):
    setup = write_nats_setup(tmp_path / "nats", run=RUN)
    with NatsServer(args=["-c", str(setup.server_config)]) as server:
        yield server, setup


async def _ignore(exc: Exception) -> None:
    """The server's permission errors: expected here."""


def login(path) -> dict[str, str]:
    return json.loads(path.read_text())


def test_the_files_are_private_and_the_server_takes_the_config(tmp_path):
    setup = write_nats_setup(tmp_path / "n", run=RUN, host="0.0.0.0", port=4333)
    for path in (setup.server_config, setup.trainer_credentials, setup.worker_credentials):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert login(setup.worker_credentials)["password"] != login(setup.trainer_credentials)["password"]
    assert '"0.0.0.0:4333"' in setup.server_config.read_text()


async def test_nobody_gets_in_without_the_password(secured):
    server, setup = secured
    with pytest.raises((nats.errors.Error, OSError)):
        await nats.connect(server.url, allow_reconnect=False, connect_timeout=2)
    wrong = {**login(setup.worker_credentials), "password": "guess"}
    with pytest.raises((nats.errors.Error, OSError)):
        await nats.connect(server.url, allow_reconnect=False, connect_timeout=2, **wrong)


async def test_a_worker_cannot_steer_the_run(secured):
    """Announcing a policy, ending the run or requesting episodes: the server drops them."""
    server, setup = secured
    trainer = await nats.connect(server.url, **login(setup.trainer_credentials))
    worker = await nats.connect(server.url, error_cb=_ignore, **login(setup.worker_credentials))
    heard: list[str] = []
    done = anyio.Event()

    async def hear(msg) -> None:
        heard.append(msg.subject)
        if msg.subject.endswith("WorkerStatus"):
            done.set()

    await trainer.subscribe(f"platoon.{RUN}.>", cb=hear)
    await synced(trainer)
    forged = [
        PolicyAnnounced(trainer="evil", version=99, base_url="http://127.0.0.1:1"),
        RunFinished(status="completed"),
        EpisodeRequested(episode_id="e", group_id="g", task=TASK),
    ]
    for event in forged:
        await worker.publish(subject_for(RUN, type(event)), encode(event))
    await worker.publish(subject_for(RUN, WorkerStatus), encode(WorkerStatus(worker="w")))  # allowed
    await synced(worker)
    with anyio.fail_after(10):
        await done.wait()  # the server handles one connection's messages in order
    assert heard == [subject_for(RUN, WorkerStatus)]
    await worker.close()
    await trainer.close()


async def test_a_worker_takes_work_only_through_the_queue_group(secured):
    """So an episode's request, and its lease token, reaches one worker only."""
    server, setup = secured
    trainer = await nats.connect(server.url, **login(setup.trainer_credentials))
    worker = await nats.connect(server.url, error_cb=_ignore, **login(setup.worker_credentials))
    snooper = await nats.connect(server.url, error_cb=_ignore, **login(setup.worker_credentials))
    snooped, taken = [], anyio.Event()

    async def snoop(msg) -> None:
        snooped.append(msg)

    async def take(msg) -> None:
        taken.set()

    subject = subject_for(RUN, EpisodeRequested)
    await worker.subscribe(subject, queue=WORK_QUEUE, cb=take)
    await synced(worker)
    await snooper.subscribe(subject, cb=snoop)  # refused by the server
    await snooper.subscribe(f"platoon.{RUN}.>", cb=snoop)  # refused too
    await synced(snooper)
    await trainer.publish(subject, encode(EpisodeRequested(episode_id="e", group_id="g", task=TASK)))
    await synced(trainer)
    with anyio.fail_after(10):
        await taken.wait()
    await synced(snooper)  # anything delivered to it has been handed over by now
    assert snooped == []
    await snooper.close()
    await worker.close()
    await trainer.close()


async def test_results_count_only_from_the_worker_given_the_episode(secured):
    """A forged grade (no lease, or a made-up one) never reaches the trainer's bus."""
    server, setup = secured
    got: list[EpisodeGraded] = []
    real_in = anyio.Event()
    as_trainer = ConnectionSettings(credentials=setup.trainer_credentials)
    as_worker = ConnectionSettings(credentials=setup.worker_credentials)
    trainer_bridge = NatsBridge(
        server.url,
        run=RUN,
        routes=Routes(
            work=[EpisodeRequested], durable=[EpisodeGraded], consume_durable=True, durable_name="trainer"
        ),
        connection=as_trainer,
        issue_leases=True,
    )
    leases = Leases()
    work = NatsBridge(
        server.url,
        run=RUN,
        routes=Routes(work=[EpisodeRequested], consume_work=True),
        connection=as_worker,
        leases=leases,
    )
    results = NatsBridge(
        server.url, run=RUN, routes=Routes(durable=[EpisodeGraded]), connection=as_worker, leases=leases
    )
    forger = NatsBridge(server.url, run=RUN, routes=Routes(durable=[EpisodeGraded]), connection=as_worker)

    def on_grade(event: EpisodeGraded) -> None:
        got.append(event)
        if event.reward == 1.0:
            real_in.set()

    async with Bus() as trainer_bus, Bus() as worker_bus, Bus() as forger_bus:
        trainer_bus.subscribe(EpisodeGraded, on_grade)
        requested = anyio.Event()
        worker_bus.subscribe(EpisodeRequested, lambda _: requested.set())
        async with anyio.create_task_group() as tg:
            await tg.start(trainer_bridge.run, trainer_bus)
            await tg.start(work.run, worker_bus)
            await tg.start(results.run, worker_bus)
            await tg.start(forger.run, forger_bus)
            await trainer_bus.publish(EpisodeRequested(episode_id="ep-1", group_id="g", task=TASK))
            with anyio.fail_after(10):
                await requested.wait()
            for episode in ("ep-1", "ep-other"):
                await forger_bus.publish(
                    EpisodeGraded(episode_id=episode, group_id="g", task=TASK, reward=0.0)
                )
            await forger.flush()  # stored in the stream ahead of the real grade
            await worker_bus.publish(EpisodeGraded(episode_id="ep-1", group_id="g", task=TASK, reward=1.0))
            with anyio.fail_after(20):
                await real_in.wait()
            tg.cancel_scope.cancel()
    assert [(g.episode_id, g.reward) for g in got] == [("ep-1", 1.0)]
    assert trainer_bridge.stats.unleased == 2


def _certificate(directory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1, made with the openssl command."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = directory / "server.pem", directory / "server-key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


async def test_with_tls_events_travel_encrypted_and_plain_clients_are_refused(tmp_path):
    import ssl

    cert, key = _certificate(tmp_path)
    setup = write_nats_setup(tmp_path / "nats", run=RUN, tls_cert=cert, tls_key=key)
    assert setup.url.startswith("tls://")
    with NatsServer(args=["-c", str(setup.server_config)]) as server:
        with pytest.raises((nats.errors.Error, OSError)):
            await nats.connect(
                server.url, allow_reconnect=False, connect_timeout=2, **login(setup.trainer_credentials)
            )
        context = ssl.create_default_context(cafile=cert)
        heard = anyio.Event()
        routes = Routes(mirror=[WorkerStatus])
        trainer = NatsBridge(
            server.url,
            run=RUN,
            routes=routes,
            connection=ConnectionSettings(tls=context, credentials=setup.trainer_credentials),
        )
        worker = NatsBridge(
            server.url,
            run=RUN,
            routes=routes,
            connection=ConnectionSettings(tls=context, credentials=setup.worker_credentials),
        )
        async with Bus() as trainer_bus, Bus() as worker_bus, anyio.create_task_group() as tg:
            trainer_bus.subscribe(WorkerStatus, lambda _: heard.set())
            await tg.start(trainer.run, trainer_bus)
            await tg.start(worker.run, worker_bus)
            await worker_bus.publish(WorkerStatus(worker="w"))
            with anyio.fail_after(10):
                await heard.wait()
            tg.cancel_scope.cancel()

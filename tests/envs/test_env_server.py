"""platoon's ORS server, spoken to by the openreward client and on the wire (asyncio: the SDK's
environments and client are asyncio-only)."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest
from env_test_helpers import wait_until
from openreward.api.environments.client import AsyncEnvironmentsAPI
from openreward.api.errors import ToolCallError, ToolFailed
from ors_sample_envs import BrokenSetup, GuessTheNumber, Workshop

from platoon.envs import EnvError
from platoon.envs.server import EnvServer, load_env_classes, running_env_server

pytestmark = pytest.mark.anyio

HERE = Path(__file__).parent


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_openreward_client_against_our_server() -> None:
    async with running_env_server([GuessTheNumber, Workshop]) as url:
        api = AsyncEnvironmentsAPI(base_url=url, api_key=None)  # type: ignore[arg-type]
        try:
            guess = api.get("guessthenumber", base_url=url)
            assert await guess.list_splits() == ["train", "test"]
            tasks = await guess.list_tasks("test")
            assert len(tasks) == 20 and tasks[0].environment_name == "guessthenumber"
            assert await guess.num_tasks("test") == 20
            assert (await guess.get_task("test", 3)).task_spec == {"id": "test-4", "secret": 4}
            assert [t.task_spec["secret"] for t in await guess.get_task_range("test", 1, 3)] == [2, 3]
            assert [t.name for t in await guess.list_tools()] == ["guess"]
            async with guess.session(task=tasks[5]) as session:
                prompt = await session.get_prompt()
                assert [b.text for b in prompt] == ["Find the secret number from 1 to 20.", "Use guess."]
                (message,) = await session.get_messages()
                assert message.role == "user"
                assert (await session.call_tool("guess", {"number": 2})).blocks[0].text == "higher"
                with pytest.raises(ToolCallError) as refused:
                    await session.call_tool("guess", {"number": "two"})
                assert refused.value.reason == "input_validation"
                with pytest.raises(ToolCallError) as missing:
                    await session.call_tool("fly", {})
                assert missing.value.reason == "not_found"
                out = await session.call_tool("guess", {"number": 6})
                assert (out.reward, out.finished) == (1.0, True)
            assert GuessTheNumber.live == set()

            shop = api.get("workshop", variant="workshop", base_url=url)
            async with httpx.AsyncClient() as http:
                splits_seen = [s["type"] for s in (await http.get(f"{url}/workshop/splits")).json()]
            assert splits_seen == ["train", "validation"]  # a split not named train/validation/test
            async with shop.session(split="holdout", index=0, secrets={"API_KEY": ("k-3", [])}) as session:
                names = [t.name for t in await session.list_tools()]
                assert "bonus" in names and "note" in names and "submit" not in names
                assert (await session.terminal_tool()).arg == "answer"
                assert (await session.call_tool("secret")).blocks[0].text == "k-3"
                long_text = " x" * 5000  # spaces at the 4096-character chunk boundaries
                assert (await session.call_tool("echo", {"answer": long_text})).blocks[0].text == long_text
                with pytest.raises(ToolFailed, match="kaboom"):
                    await session.call_tool("boom")
            async with shop.session(split="train", index=0) as session:
                out = await session.call_terminal_tool("3")
                assert (out.blocks[0].text, out.reward, out.finished) == ("right", 1.0, True)
            await wait_until(lambda: not Workshop.live)
        finally:
            await api.aclose()


async def test_setup_errors_reach_the_client() -> None:
    async with running_env_server(BrokenSetup) as url:
        api = AsyncEnvironmentsAPI(base_url=url, api_key=None)  # type: ignore[arg-type]
        try:
            env = api.get("brokensetup", base_url=url)
            async with env.session(split="train", index=0) as session:
                with pytest.raises(Exception, match="ValueError: no sandbox for you"):
                    await session.get_prompt()
        finally:
            await api.aclose()
    assert BrokenSetup.live == set()


async def test_wire_protocol_details() -> None:
    async with running_env_server([Workshop], setup_wait=0.1) as url, httpx.AsyncClient(base_url=url) as http:
        assert (await http.get("/health")).json() == {"status": "ok"}
        assert (await http.get("/list_environments")).json() == ["workshop"]
        assert (await http.get("/nope/splits")).status_code == 404
        assert (await http.post("/workshop/tasks", json={"split": "x"})).status_code == 400
        assert (await http.post("/create", json={"split": "train", "index": 0})).status_code == 400  # no sid
        created = await http.post("/create_session")
        assert created.headers["content-type"].startswith("text/event-stream")
        sid = created.text.split("data: ")[1].split("\n")[0]
        secrets = base64.b64encode(json.dumps({"API_KEY": {"value": "v", "allowed_domains": []}}).encode())
        headers = {"X-Session-ID": sid, "X-Secrets": secrets.decode()}
        spec = {"target": 2, "setup_delay": 0.5}
        assert (await http.post("/create", json={"task_spec": spec}, headers=headers)).json() == {"sid": sid}
        again = await http.post("/create", json={"task_spec": spec}, headers=headers)
        assert again.status_code == 400
        starting = await http.get("/prompt", headers=headers)
        assert starting.status_code == 503 and starting.headers["X-Backend-State"] == "starting"
        with anyio.fail_after(10):  # ready once its setup (0.5 s) is done
            while (prompt := await http.get("/prompt", headers=headers)).status_code == 503:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert prompt.json()[0]["text"] == "Count to 2."
        call = await http.post("/call", json={"name": "secret", "input": {}}, headers=headers)
        events = [line for line in call.text.splitlines() if line.startswith("event:")]
        assert events == ["event: task_id", "event: end"]
        task_id = call.text.split("data: ")[1].split("\n")[0]
        replay = await http.post(
            "/call", json={"name": "secret", "input": {}, "task_id": task_id}, headers=headers
        )
        assert replay.text.split("data: ")[-1].strip() == call.text.split("data: ")[-1].strip()
        result = json.loads(call.text.split("data: ")[-1])
        assert result["ok"] and result["output"]["blocks"][0]["text"] == "v"
        assert (await http.post("/ping", headers=headers)).json() == {"status": "ok"}
        assert (await http.post("/delete", headers=headers)).json() == {"sid": sid}
        assert (await http.post("/ping", headers=headers)).status_code == 404
        assert Workshop.live == set()


async def test_sessions_are_reaped_and_torn_down_at_shutdown() -> None:
    async with running_env_server([Workshop], session_ttl=0.2, reap_every=0.05) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            await http.post("/create", json={"split": "train", "index": 0}, headers={"X-Session-ID": "a"})
            await wait_until(lambda: len(Workshop.live) == 1)
            await wait_until(lambda: not Workshop.live)  # no pings: torn down
    async with running_env_server([Workshop]) as url:
        async with httpx.AsyncClient(base_url=url) as http:
            await http.post("/create", json={"split": "train", "index": 1}, headers={"X-Session-ID": "b"})
            await wait_until(lambda: len(Workshop.live) == 1)
    assert Workshop.live == set()  # the server's shutdown tore it down


def test_loading_targets() -> None:
    assert load_env_classes("ors_sample_envs:Workshop") == [Workshop]
    assert load_env_classes(["python://ors_sample_envs:Workshop", GuessTheNumber]) == [
        Workshop,
        GuessTheNumber,
    ]
    assert load_env_classes("platoon-number-search@1")[0].__name__ == "NumberSearch"
    with pytest.raises(EnvError, match="is not an openreward Environment class"):
        load_env_classes("json:dumps")
    with pytest.raises(EnvError, match="two environments are named 'workshop'"):
        EnvServer([Workshop, Workshop])


@pytest.mark.slow
def test_platoon_env_serve_main() -> None:
    """`platoon env serve module:Class --port N` serves until interrupted."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    code = "import sys; from platoon.envs.server import main; sys.exit(main(sys.argv[1:]))"
    argv = [sys.executable, "-c", code, "ors_sample_envs:GuessTheNumber", "--port", str(port)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # It says so once it listens: connections made from then on wait in the backlog.
        assert proc.stdout is not None
        key = proc.stdout.readline().split()[1]  # made up, as none was given: loopback has a key too
        assert proc.stdout.readline().strip() == f"serving guessthenumber on http://127.0.0.1:{port}"
        assert httpx.get(f"http://127.0.0.1:{port}/list_environments").status_code == 401
        answer = httpx.get(f"http://127.0.0.1:{port}/list_environments", headers={"x-api-key": key})
        assert answer.json() == ["guessthenumber"]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0 and out.strip() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_taken_port_is_one_line_and_nothing_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        argv = [sys.executable, "-m", "platoon", "env", "serve", "ors_sample_envs:GuessTheNumber"]
        done = subprocess.run(
            [*argv, "--port", str(port)], env=env, capture_output=True, text=True, timeout=60
        )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip() == f"platoon: error: cannot listen on 127.0.0.1:{port}: Address already in use"

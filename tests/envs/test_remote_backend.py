"""`service: http://host:port`: ORS servers through the openreward client.

Each test runs against the SDK's own `Server` and against platoon's. The client is
aiohttp-based, so these run under asyncio; under trio the service answers with a clear error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from env_test_helpers import call_tool, open_session, sdk_server, serving, wait_until
from ors_sample_envs import BrokenSetup, GuessTheNumber, Workshop

from platoon.bus.events import EpisodeGraded, GradeRequested, TaskRef, TasksRequested
from platoon.envs import EnvError, build_env_service
from platoon.envs.server import running_env_server

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["sdk", "platoon"])
def server_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@asynccontextmanager
async def ors_server(kind: str, *classes: type) -> AsyncIterator[str]:
    if kind == "sdk":
        async with sdk_server(*classes) as url:
            yield url
    else:
        async with running_env_server(list(classes)) as url:
            yield url


def graded(env: str, episode: str = "ep") -> EpisodeGraded:
    return EpisodeGraded(
        episode_id=episode, group_id="g", task=TaskRef(env=env, split="train", task_id="0"), reward=None
    )


async def test_default_environment_end_to_end(server_kind: str) -> None:
    async with ors_server(server_kind, GuessTheNumber, Workshop) as url:
        service = build_env_service("guess", service=url)
        async with serving(service) as bus:
            listed = await bus.request(TasksRequested(env="guess", split="train"))
            assert [t.task_id for t in listed.tasks][:2] == ["train-1", "train-2"]
            opened = await open_session(bus, "guess", "train-4")
            assert opened.error is None, opened.error
            assert opened.instruction == "Find the secret number from 1 to 20.\nUse guess."
            assert [t.name for t in opened.tools] == ["guess"]
            assert (await call_tool(bus, "guess", "guess", {"number": 9})).output == "lower"
            hit = await call_tool(bus, "guess", "guess", {"number": 4})
            assert (hit.output, hit.reward, hit.finished) == ("Correct!", 1.0, True)
            grade = await bus.request(GradeRequested(episode_id="ep", agent_id="root", env="guess"))
            assert grade.reward == 1.0
            assert len(GuessTheNumber.live) == 1
            await bus.publish(graded("guess"))
            await wait_until(lambda: service.open_sessions == 0)
            await wait_until(lambda: not GuessTheNumber.live)  # the server tore it down
    assert service.open_sessions == 0


@pytest.mark.slow
async def test_named_environment_features_and_failures(server_kind: str) -> None:
    async with ors_server(server_kind, GuessTheNumber, Workshop) as url:
        service = build_env_service(
            "shop",
            service=f"{url}/workshop",
            service_kwargs={"secrets": {"API_KEY": "k-2"}},
            tool_timeout=0.5,
        )
        async with serving(service) as bus:
            opened = await open_session(bus, "shop", "0", split="holdout")
            assert opened.error is None, opened.error
            tools = {t.name: t for t in opened.tools}
            assert {"inc", "note", "bonus", "submit"} <= set(tools)
            assert tools["submit"].terminal and tools["submit"].input_schema["required"] == ["answer"]
            assert (await call_tool(bus, "shop", "secret")).output == "k-2"
            assert (await call_tool(bus, "shop", "inc")).reward == 0.5
            assert (await call_tool(bus, "shop", "note", {"answer": "x"})).output == "1 notes"
            bad = await call_tool(bus, "shop", "nap", {"seconds": "soon"})
            assert bad.error is not None and bad.error.startswith("bad arguments for tool nap: ")
            long_text = "word " * 3000
            assert (await call_tool(bus, "shop", "echo", {"answer": long_text})).output == long_text
            done = await call_tool(bus, "shop", "submit", {"answer": "3"})
            assert (done.reward, done.finished) == (1.0, True), done
            grade = await bus.request(GradeRequested(episode_id="ep", agent_id="root", env="shop"))
            assert grade.reward == 1.0  # remote sessions are graded `final` unless told otherwise
            # (A remote call that times out goes on running on the server, where it holds up
            # an exclusive tool such as `submit`: so the timeout is tried on a session of its own.)
            await open_session(bus, "shop", "1", episode="ep4")
            slow = await call_tool(bus, "shop", "nap", {"seconds": 1.5}, episode="ep4")
            assert slow.error == "tool nap timed out after 0.5s"

            await open_session(bus, "shop", "1", episode="ep2")
            boom = await call_tool(bus, "shop", "boom", episode="ep2")
            assert boom.error is not None and "kaboom" in boom.error

            await open_session(bus, "shop", "1", episode="ep3")
            await call_tool(bus, "shop", "inc", episode="ep3")
            copied = await open_session(
                bus, "shop", "1", episode="ep3", agent="kid", fork_of="root", fork="copy"
            )
            assert (
                copied.error
                == "a session on an ORS server cannot be forked 'copy': fork it 'fresh' or 'shared'"
            )
            fresh = await open_session(
                bus, "shop", "1", episode="ep3", agent="kid", fork_of="root", fork="fresh"
            )
            assert fresh.error is None
            assert (await call_tool(bus, "shop", "inc", episode="ep3", agent="kid")).output == "1"
            assert service.open_sessions == 5
        assert service.open_sessions == 0
        await wait_until(lambda: not Workshop.live)


async def test_setup_failure(server_kind: str) -> None:
    async with ors_server(server_kind, BrokenSetup) as url:
        service = build_env_service("broken", service=url)
        async with serving(service) as bus:
            reply = await open_session(bus, "broken", "only")
            assert reply.error is not None and "no sandbox for you" in reply.error
            assert service.open_sessions == 0
        await wait_until(lambda: not BrokenSetup.live)


@pytest.mark.slow
async def test_unreachable_server() -> None:
    async with running_env_server(GuessTheNumber) as url:
        pass  # a port that was just closed: nothing listens there now
    gone = build_env_service("gone", service=url)
    async with serving(gone) as bus:
        listed = await bus.request(TasksRequested(env="gone", split="train"), timeout=60)
        assert listed.error is not None and listed.error.startswith(f"listing the splits of {url} failed")


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_trio_gets_a_clear_error() -> None:
    service = build_env_service("remote", service="http://127.0.0.1:9")
    async with serving(service) as bus:
        listed = await bus.request(TasksRequested(env="remote", split="train"))
        assert listed.error == "ORS servers are reached with the openreward client, which needs asyncio"


def test_bad_urls() -> None:
    with pytest.raises(EnvError, match="names at most one environment"):
        build_env_service("x", service="http://127.0.0.1:8080/a/b")
    with pytest.raises(EnvError, match="unknown service 'ftp://host'"):
        build_env_service("x", service="ftp://host")


async def test_a_keyed_env_server_refuses_a_wrong_or_missing_key() -> None:
    """The key openreward's client sends as `X-API-Key` is checked on every route."""
    import httpx

    async with running_env_server([GuessTheNumber], api_key="env-key") as url:
        good = build_env_service("guess", service=url, service_kwargs={"api_key": "env-key"})
        async with serving(good) as bus:
            listed = await bus.request(TasksRequested(env="guess", split="train"))
            assert listed.tasks
        for key in (None, "env-kez"):
            bad = build_env_service("guess", service=url, service_kwargs={"api_key": key} if key else None)
            async with serving(bad) as bus:
                refused = await bus.request(TasksRequested(env="guess", split="train"))
                assert not refused.tasks and "AuthenticationError" in (refused.error or "")
        async with httpx.AsyncClient(base_url=url) as client:
            for path in ("/health", "/version", "/list_environments", "/guess/splits"):
                assert (await client.get(path)).status_code == 401, path
            assert (await client.get("/health", headers={"x-api-key": "env-key"})).status_code == 200


async def test_an_env_server_beyond_loopback_needs_a_key() -> None:
    from platoon.serving import ServingError

    with pytest.raises(ServingError, match="no key"):
        async with running_env_server([GuessTheNumber], host="0.0.0.0"):
            pass

"""The generic env service over a scripted backend, under asyncio and trio."""

from __future__ import annotations

import time

import anyio
import pytest
from env_test_helpers import ScriptedBackend, call_tool, open_session, serving, wait_until

from platoon.bus import Bus
from platoon.bus.events import (
    EpisodeGraded,
    Graded,
    GradeRequested,
    TaskRef,
    TasksListed,
    TasksRequested,
    ToolCalled,
    ToolReturned,
)
from platoon.envs import EnvService

pytestmark = pytest.mark.anyio

ENV = "scripted"


def graded(episode: str = "ep") -> EpisodeGraded:
    return EpisodeGraded(
        episode_id=episode, group_id="g", task=TaskRef(env=ENV, split="train", task_id="t0"), reward=None
    )


async def test_lists_tasks_and_refuses_unknown_splits() -> None:
    service = EnvService(ENV, ScriptedBackend())
    async with serving(service) as bus:
        listed = await bus.request(TasksRequested(env=ENV, split="train"))
        assert isinstance(listed, TasksListed) and listed.error is None
        assert [t.task_id for t in listed.tasks][:3] == ["t0", "t1", "t2"]
        assert all(t.env == ENV and t.split == "train" for t in listed.tasks)
        assert [t.index for t in listed.tasks] == list(range(len(listed.tasks)))
        bad = await bus.request(TasksRequested(env=ENV, split="nope"))
        assert bad.error == "unknown split 'nope' (splits: train)"


async def test_session_end_to_end_and_closed_on_episode_graded() -> None:
    backend = ScriptedBackend()
    service = EnvService(ENV, backend, secrets={"TOKEN": "s3"})
    async with serving(service) as bus:
        opened = await open_session(bus, ENV, "t1")
        assert opened.error is None
        assert opened.instruction == "solve t1"
        assert [t.name for t in opened.tools if t.terminal] == ["finish"]
        assert backend.secrets == [{"TOKEN": "s3"}]
        assert (await call_tool(bus, ENV, "add", {"n": 2})).output == "2"
        done = await call_tool(bus, ENV, "finish")
        assert (done.output, done.reward, done.finished, done.error) == ("done", 2.0, True, None)
        assert done.duration_s >= 0
        grade = await bus.request(GradeRequested(episode_id="ep", agent_id="root", env=ENV))
        assert isinstance(grade, Graded)
        assert (grade.reward, grade.rewards, grade.reason) == (2.0, {"total": 2.0}, None)
        assert service.open_sessions == 1
        await bus.publish(graded())
        await wait_until(lambda: service.open_sessions == 0)
        assert backend.live == set()
        after = await call_tool(bus, ENV, "echo", {"text": "hi"})
        assert after.error == "no open env session for agent root of episode ep"
        gone = await bus.request(GradeRequested(episode_id="ep", agent_id="root", env=ENV))
        assert gone.reward is None and gone.reason == "no open env session for agent root of episode ep"
    assert backend.backend_closed


async def test_ungraded_session_grades_none_with_reason() -> None:
    service = EnvService(ENV, ScriptedBackend())
    async with serving(service) as bus:
        await open_session(bus, ENV, "t0")
        grade = await bus.request(GradeRequested(episode_id="ep", agent_id="root", env=ENV))
        assert grade.error is None and grade.reward is None and grade.reason == "not finished"


async def test_other_envs_requests_are_left_alone() -> None:
    service = EnvService(ENV, ScriptedBackend())
    other = EnvService("other", ScriptedBackend())
    async with serving(service) as bus, anyio.create_task_group() as tg:
        await tg.start(other.run, bus)
        await open_session(bus, "other", "t0")
        assert (service.open_sessions, other.open_sessions) == (0, 1)
        reply = await call_tool(bus, "other", "echo", {"text": "x"})
        assert reply.output == "x"
        tg.cancel_scope.cancel()
    assert other.open_sessions == 0


async def test_failures_become_errors_and_leave_nothing_open() -> None:
    backend = ScriptedBackend()
    service = EnvService(ENV, backend, tool_timeout=0.2)
    async with serving(service) as bus:
        failed = await open_session(bus, ENV, "fail")
        assert failed.error == "the sandbox would not start"
        unknown = await open_session(bus, ENV, "t99")
        assert unknown.error == "unknown task 't99' in split 'train' of scripted"
        bad_split = await open_session(bus, ENV, "t0", split="dev")
        assert bad_split.error == "unknown split 'dev' (splits: train)"
        assert service.open_sessions == 0

        await open_session(bus, ENV, "t0")
        boom = await call_tool(bus, ENV, "boom")
        assert boom.error == "tool boom failed: RuntimeError: kaboom"
        refused = await call_tool(bus, ENV, "refuse")
        assert refused.error == "bad arguments for tool refuse: nope"
        missing = await call_tool(bus, ENV, "fly")
        assert missing.error == "unknown tool 'fly' (tools: add, boom, echo, finish, hang, nap, refuse)"
        start = time.perf_counter()
        hung = await call_tool(bus, ENV, "hang")
        assert hung.error == "tool hang timed out after 0.2s"
        assert 0.15 < time.perf_counter() - start < 2
        # The session is still usable after each failure.
        assert (await call_tool(bus, ENV, "echo", {"text": "still here"})).output == "still here"
        assert service.open_sessions == 1
    assert service.open_sessions == 0 and backend.live == set()


async def test_open_timeout() -> None:
    backend = ScriptedBackend()
    service = EnvService(ENV, backend, open_timeout=0.1)
    async with serving(service) as bus:
        reply = await open_session(bus, ENV, "slow")
        assert reply.error == "opening task train:slow timed out after 0.1s"
    assert service.open_sessions == 0 and backend.live == set()


async def test_calls_to_one_session_run_one_at_a_time_in_arrival_order() -> None:
    backend = ScriptedBackend()
    service = EnvService(ENV, backend)
    async with serving(service) as bus:
        await open_session(bus, ENV, "t0")
        naps = [0.05, 0.0, 0.03, 0.0, 0.01, 0.0]
        async with bus.stream(ToolReturned) as replies:
            for n, seconds in enumerate(naps):
                await bus.publish(
                    ToolCalled(
                        request_id=f"r{n}",
                        episode_id="ep",
                        agent_id="root",
                        env=ENV,
                        name="nap",
                        arguments={"seconds": seconds},
                    )
                )
            order = [(await replies.receive()).reply_to for _ in naps]
        assert order == [f"r{n}" for n in range(len(naps))]
        assert [entry[2]["seconds"] for entry in backend.log] == naps


async def test_different_sessions_run_concurrently() -> None:
    service = EnvService(ENV, ScriptedBackend())
    async with serving(service) as bus:
        await open_session(bus, ENV, "t0", agent="a")
        await open_session(bus, ENV, "t1", agent="b")
        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for agent in ("a", "b"):
                tg.start_soon(lambda a=agent: call_tool(bus, ENV, "nap", {"seconds": 0.3}, agent=a))
        assert time.perf_counter() - start < 0.55


async def test_forks_fresh_copy_and_shared() -> None:
    backend = ScriptedBackend()
    service = EnvService(ENV, backend)
    async with serving(service) as bus:
        await open_session(bus, ENV, "t2")
        await call_tool(bus, ENV, "add", {"n": 5})
        fresh = await open_session(bus, ENV, "t2", agent="fresh", fork_of="root", fork="fresh")
        copied = await open_session(
            bus, ENV, "t2", agent="copy", fork_of="root", fork="copy", instruction="sub"
        )
        shared = await open_session(bus, ENV, "t2", agent="shared", fork_of="root", fork="shared")
        assert fresh.error is None and copied.error is None and shared.error is None
        assert copied.instruction == "sub" and fresh.instruction == "solve t2"
        assert service.open_sessions == 3  # root+shared are one session
        assert (await call_tool(bus, ENV, "add", {"n": 1}, agent="fresh")).output == "1"
        assert (await call_tool(bus, ENV, "add", {"n": 1}, agent="copy")).output == "6"
        assert (await call_tool(bus, ENV, "add", {"n": 1}, agent="shared")).output == "6"
        assert (await call_tool(bus, ENV, "add", {"n": 1}, agent="root")).output == "7"
        orphan = await open_session(bus, ENV, "t2", agent="x", fork_of="nobody", fork="fresh")
        assert orphan.error == "cannot fork: agent nobody of episode ep has no open session"
        twice = await open_session(bus, ENV, "t2", agent="copy", fork_of="root", fork="fresh")
        assert twice.error == "agent copy of episode ep already has a session"
        assert service.open_sessions == 3
        await bus.publish(graded())
        await wait_until(lambda: service.open_sessions == 0)
    assert backend.live == set()


async def test_copy_fork_the_backend_cannot_do_is_an_error() -> None:
    service = EnvService(ENV, ScriptedBackend(copyable=False))
    async with serving(service) as bus:
        await open_session(bus, ENV, "t0")
        reply = await open_session(bus, ENV, "t0", agent="kid", fork_of="root", fork="copy")
        assert reply.error == "this backend cannot copy sessions"
        assert service.open_sessions == 1


async def test_session_opening_after_its_episode_was_graded_is_closed() -> None:
    backend = ScriptedBackend()
    service = EnvService(ENV, backend)
    async with serving(service) as bus:
        async with anyio.create_task_group() as tg:

            async def open_slow() -> None:
                reply = await open_session(bus, ENV, "slow")
                assert reply.error == "episode ep was graded before its session opened"

            tg.start_soon(open_slow)
            await wait_until(lambda: len(backend.secrets) == 1)  # opening: the slow task takes 0.3 s
            await bus.publish(graded())
        await wait_until(lambda: service.open_sessions == 0)
    assert backend.live == set()


async def test_cancelling_the_service_closes_sessions_even_mid_call() -> None:
    backend = ScriptedBackend()
    service = EnvService(ENV, backend)
    async with Bus() as bus, anyio.create_task_group() as tg:
        await tg.start(service.run, bus)
        await open_session(bus, ENV, "t0")
        await open_session(bus, ENV, "t1", episode="ep2")
        await bus.publish(ToolCalled(episode_id="ep", agent_id="root", env=ENV, name="hang"))
        await wait_until(lambda: len(backend.log) == 1)
        tg.cancel_scope.cancel()
    assert service.open_sessions == 0 and backend.live == set() and backend.closed == 2


async def test_bus_shutdown_closes_sessions() -> None:
    backend = ScriptedBackend()
    service = EnvService(ENV, backend)
    async with anyio.create_task_group() as tg:
        async with Bus() as bus:
            await tg.start(service.run, bus)
            await open_session(bus, ENV, "t0")
            await open_session(bus, ENV, "t1", agent="kid", fork_of="root", fork="fresh")
            assert service.open_sessions == 2
        # Leaving the bus ends the service's streams: it stops and closes everything.
    assert service.open_sessions == 0 and backend.live == set() and backend.backend_closed


async def test_secrets_from_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLATOON_TEST_TOKEN", "abc")
    backend = ScriptedBackend()
    async with serving(EnvService(ENV, backend, secrets=["PLATOON_TEST_TOKEN"])) as bus:
        await open_session(bus, ENV, "t0")
        assert backend.secrets == [{"PLATOON_TEST_TOKEN": "abc"}]
    async with serving(EnvService(ENV, backend, secrets=["PLATOON_TEST_MISSING"])) as bus:
        reply = await open_session(bus, ENV, "t0")
        assert reply.error == "secrets not set in the environment: PLATOON_TEST_MISSING"

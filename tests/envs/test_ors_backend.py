"""`service: python://module:Class`: ORS classes in process, through the bus.

The openreward SDK is asyncio-only; environments whose tools are `async def` also run under
trio, so most tests run under both and the plain-function tool is checked on each.
"""

from __future__ import annotations

import pytest
from env_test_helpers import call_tool, open_session, serving, wait_until
from ors_sample_envs import BrokenSetup, GuessTheNumber, Workshop

from platoon.bus.events import EpisodeGraded, GradeRequested, TaskRef, TasksRequested
from platoon.envs import EnvError, build_env_service
from platoon.envs.ors import OrsBackend

pytestmark = pytest.mark.anyio


def graded(env: str, episode: str = "ep") -> EpisodeGraded:
    return EpisodeGraded(
        episode_id=episode, group_id="g", task=TaskRef(env=env, split="train", task_id="0"), reward=None
    )


async def test_quickstart_environment_end_to_end() -> None:
    service = build_env_service("guess", service="python://ors_sample_envs:GuessTheNumber")
    async with serving(service) as bus:
        listed = await bus.request(TasksRequested(env="guess", split="test"))
        assert [t.task_id for t in listed.tasks][:2] == ["test-1", "test-2"]
        opened = await open_session(bus, "guess", "test-7", split="test")
        assert opened.error is None
        assert opened.instruction == "Find the secret number from 1 to 20.\nUse guess."
        (spec,) = opened.tools
        assert spec.name == "guess" and not spec.terminal
        assert spec.description == "Guess the number; the answer says whether the secret is higher or lower."
        assert spec.input_schema["properties"]["number"]["type"] == "integer"
        assert spec.input_schema["required"] == ["number"]
        low = await call_tool(bus, "guess", "guess", {"number": 3})
        assert (low.output, low.reward, low.finished, low.error) == ("higher", None, False, None)
        hit = await call_tool(bus, "guess", "guess", {"number": 7})
        assert (hit.output, hit.reward, hit.finished) == ("Correct!", 1.0, True)
        late = await call_tool(bus, "guess", "guess", {"number": 7})
        assert "the episode has finished" in (late.error or "")
        grade = await bus.request(GradeRequested(episode_id="ep", agent_id="root", env="guess"))
        assert (grade.reward, grade.reason) == (1.0, None)
        assert len(GuessTheNumber.live) == 1
        await bus.publish(graded("guess"))
        await wait_until(lambda: service.open_sessions == 0)
        assert GuessTheNumber.live == set()


async def test_an_unfinished_episode_is_graded_by_the_sum_of_its_rewards() -> None:
    """An agent that stops or runs out of steps failed: it is graded (0 here) and trained on."""
    service = build_env_service("guess", service="python://ors_sample_envs:GuessTheNumber")
    async with serving(service) as bus:
        await open_session(bus, "guess", "train-5")
        await call_tool(bus, "guess", "guess", {"number": 1})
        grade = await bus.request(GradeRequested(episode_id="ep", agent_id="root", env="guess"))
        assert grade.reward == 0.0
        assert grade.reason.startswith("the episode did not finish (no tool result had finished=True)")
    assert GuessTheNumber.live == set()


async def test_workshop_features() -> None:
    service = build_env_service(
        "shop", service="python://ors_sample_envs:Workshop", service_kwargs={"secrets": {"API_KEY": "k-1"}}
    )
    async with serving(service) as bus:
        listed = await bus.request(TasksRequested(env="shop", split="train"))
        assert [t.task_id for t in listed.tasks] == ["0", "1"]  # no ids in the specs: indexes
        opened = await open_session(bus, "shop", "0")
        assert opened.instruction == "Count to 3."
        tools = {t.name: t for t in opened.tools}
        assert set(tools) == {"inc", "secret", "sync_inc", "echo", "boom", "nap", "note", "submit"}
        assert tools["submit"].terminal
        assert tools["submit"].input_schema["required"] == ["answer"]
        assert tools["note"].input_schema["properties"]["answer"]["type"] == "string"
        assert tools["inc"].input_schema == {"type": "object", "properties": {}}
        assert (await call_tool(bus, "shop", "secret")).output == "k-1"
        assert (await call_tool(bus, "shop", "note", {"answer": "a"})).output == "1 notes"
        assert (await call_tool(bus, "shop", "inc")).reward == 0.5
        assert (await call_tool(bus, "shop", "inc")).output == "2"
        bad = await call_tool(bus, "shop", "nap", {"seconds": "soon"})
        assert bad.error is not None and bad.error.startswith("bad arguments for tool nap: ")
        done = await call_tool(bus, "shop", "submit", {"answer": "3"})
        assert (done.output, done.reward, done.finished) == ("right", 1.0, True)
        grade = await bus.request(GradeRequested(episode_id="ep", agent_id="root", env="shop"))
        assert grade.reward == 2.0  # platoon_reward = "sum": 0.5 + 0.5 + 1.0

        bonus = await open_session(bus, "shop", "0", split="holdout", episode="ep2")
        assert "bonus" in {t.name for t in bonus.tools}
        assert (await call_tool(bus, "shop", "bonus", episode="ep2")).reward == 10.0

        # A tool that raises ends its session (the ORS contract, as the openreward client has
        # it for a server): an environment failure, and no tool of that session runs after it.
        await open_session(bus, "shop", "0", episode="ep3")
        boom = await call_tool(bus, "shop", "boom", episode="ep3")
        assert (boom.error, boom.env_fault) == ("tool boom failed: RuntimeError: kaboom", True)
        after = await call_tool(bus, "shop", "inc", episode="ep3")
        assert after.error == "the session was terminated: tool boom raised RuntimeError: kaboom"
        assert after.env_fault
    assert service.open_sessions == 0 and Workshop.live == set()


async def test_plain_function_tools(anyio_backend: str) -> None:
    service = build_env_service("shop", service="python://ors_sample_envs:Workshop")
    async with serving(service) as bus:
        await open_session(bus, "shop", "1")
        reply = await call_tool(bus, "shop", "sync_inc")
        if anyio_backend == "asyncio":
            assert (reply.output, reply.error) == ("1", None)
        else:
            assert reply.error == (
                "tool sync_inc is a plain function, which the openreward SDK runs with "
                "asyncio.to_thread: run platoon under asyncio for this environment"
            )


async def test_hanging_tool_times_out() -> None:
    service = build_env_service("shop", service="python://ors_sample_envs:Workshop", tool_timeout=0.2)
    async with serving(service) as bus:
        await open_session(bus, "shop", "0")
        reply = await call_tool(bus, "shop", "nap", {"seconds": 30})
        assert reply.error == "tool nap timed out after 0.2s"
        assert (await call_tool(bus, "shop", "inc")).output == "1"
    assert Workshop.live == set()


async def test_forks() -> None:
    service = build_env_service("shop", service="python://ors_sample_envs:Workshop")
    async with serving(service) as bus:
        await open_session(bus, "shop", "0")
        await call_tool(bus, "shop", "inc")
        setups = Workshop.setups
        await open_session(bus, "shop", "0", agent="copy", fork_of="root", fork="copy")
        await open_session(bus, "shop", "0", agent="fresh", fork_of="root", fork="fresh")
        await open_session(bus, "shop", "0", agent="shared", fork_of="root", fork="shared")
        assert Workshop.setups == setups + 1  # a copy is not set up again
        assert (await call_tool(bus, "shop", "inc", agent="copy")).output == "2"
        assert (await call_tool(bus, "shop", "inc", agent="fresh")).output == "1"
        assert (await call_tool(bus, "shop", "inc", agent="shared")).output == "2"
        assert (await call_tool(bus, "shop", "inc", agent="root")).output == "3"
        kid = await bus.request(GradeRequested(episode_id="ep", agent_id="copy", env="shop"))
        assert kid.reward == 0.5  # the copy is graded on its own rewards
        assert service.open_sessions == 3
        await bus.publish(graded("shop"))
        await wait_until(lambda: service.open_sessions == 0)
    # Teardown ran for the root, the copy and the fresh session.
    assert Workshop.live == set()


async def test_setup_failure_is_an_open_error_and_tears_down() -> None:
    service = build_env_service("broken", service="python://ors_sample_envs:BrokenSetup")
    async with serving(service) as bus:
        reply = await open_session(bus, "broken", "only")
        assert reply.error == "BrokenSetup.setup() failed: ValueError: no sandbox for you"
        assert service.open_sessions == 0
    assert BrokenSetup.live == set() and BrokenSetup.teardowns == BrokenSetup.setups


async def test_bad_classes_and_options() -> None:
    with pytest.raises(EnvError, match="is not an openreward Environment class"):
        OrsBackend(dict)  # type: ignore[arg-type]
    with pytest.raises(EnvError, match="cannot import 'no_such_module'"):
        build_env_service("x", service="python://no_such_module:Env")
    with pytest.raises(EnvError, match="GuessTheNumber takes no options"):
        build_env_service(
            "x", service="python://ors_sample_envs:GuessTheNumber", service_kwargs={"options": {"a": 1}}
        )
    with pytest.raises(EnvError, match="reward must be 'final' or 'sum', not 'best'"):
        build_env_service(
            "x", service="python://ors_sample_envs:GuessTheNumber", service_kwargs={"reward": "best"}
        )
    with pytest.raises(EnvError, match="bad service_kwargs for python://ors_sample_envs:GuessTheNumber"):
        build_env_service(
            "x", service="python://ors_sample_envs:GuessTheNumber", service_kwargs={"colour": "red"}
        )

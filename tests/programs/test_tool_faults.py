"""An environment's failure is not a reward, wherever the environment runs.

A real ORS class whose tools raise, answer something that is not a `ToolOutput`, or hang is
played in process, behind the openreward SDK's own server and behind `platoon env serve`. In all
three the episode ends as an error with the reason, is never graded (so never trained on as a
0), and the tool timeout is the same one; an env that declares such errors the agent's doing has
its episodes graded as usual.
"""

# ruff: noqa: F811 - pytest fixtures imported by name

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from openreward.environments import Environment, TextBlock, ToolOutput, tool
from programs_helpers import entry, toy_system
from pydantic import BaseModel

import platoon as pt
from platoon.bus.events import EpisodeFinished, EpisodeGraded, ToolCalled, ToolReturned
from platoon.envs.ors import OrsBackend
from platoon.envs.remote import RemoteBackend
from platoon.envs.server import running_env_server
from platoon.stats.failures import failure_kind
from tokenizer_fixtures import toy_tokenizer  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "envs"))
from env_test_helpers import sdk_server, wait_until

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the openreward HTTP client and the SDK's server are asyncio-only


class Answer(BaseModel):
    answer: str


class Faulty(Environment):
    """Each task names the tool to try before submitting; `submit` always earns 1.0."""

    hanging: ClassVar[int] = 0  # hang calls still running

    @classmethod
    def list_splits(cls) -> list[str]:
        return ["train"]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return [{"id": name, "tool": name} for name in ("fine", "boom", "garbage", "hang", "nan")]

    async def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=self.task_spec["tool"])]

    @tool
    async def fine(self) -> ToolOutput:
        """Works."""
        return ToolOutput(blocks=[TextBlock(text="fine")])

    @tool
    async def boom(self) -> ToolOutput:
        """Raises."""
        raise RuntimeError("kaboom")

    @tool
    async def garbage(self) -> ToolOutput:
        """Answers something that is not a ToolOutput."""
        return {"blocks": "not a list"}  # type: ignore[return-value]

    @tool
    async def hang(self) -> ToolOutput:
        """Never answers."""
        Faulty.hanging += 1
        try:
            await anyio.sleep_forever()
        finally:
            Faulty.hanging -= 1
        raise AssertionError("unreachable")

    @tool
    async def nan(self) -> ToolOutput:
        """Finishes the episode with a reward that is not a number."""
        return ToolOutput(blocks=[TextBlock(text="done")], reward=float("nan"), finished=True)

    @tool
    async def submit(self, args: Answer) -> ToolOutput:
        """Earns 1.0."""
        return ToolOutput(blocks=[TextBlock(text="ok")], reward=1.0, finished=True)


@pt.harness("fault-try-then-submit")
async def try_then_submit(ctx: pt.AgentContext) -> pt.AgentResult:
    """Calls the tool its instruction names, then submits: a policy that would earn 1.0."""
    await ctx.call_tool(ctx.instruction, {})
    done = await ctx.call_tool("submit", {"answer": "x"})
    return pt.AgentResult("completed", final_message=done.output)


@asynccontextmanager
async def backend_for(where: str) -> AsyncIterator[Any]:
    if where == "in process":
        yield OrsBackend(Faulty)
    elif where == "sdk server":
        async with sdk_server(Faulty) as url:
            yield RemoteBackend(url)
    else:
        async with running_env_server([Faulty]) as url:
            yield RemoteBackend(url)


WHERE = ["in process", "sdk server", "platoon env serve"]
FAULTS = {
    "boom": "kaboom",
    "garbage": "'garbage' returned dict; expected ToolOutput",
    "hang": "tool hang timed out after 0.3s",
}


def one(events: list, kind: type) -> Any:
    (event,) = [e for e in events if isinstance(e, kind)]
    return event


@pytest.mark.slow
@pytest.mark.parametrize("where", WHERE)
async def test_a_tool_that_raises_answers_garbage_or_hangs_fails_its_episode_with_the_reason(
    toy_tokenizer, where
):
    Faulty.hanging = 0
    async with (
        backend_for(where) as backend,
        toy_system(toy_tokenizer, entry("fault-try-then-submit"), backend=backend, tool_timeout=0.3) as toy,
    ):
        played = {name: await toy.play(name) for name in ("fine", *FAULTS)}
    assert one(played["fine"], EpisodeGraded).reward == 1.0  # the control: the same policy earns 1.0
    for name, why in FAULTS.items():
        events = played[name]
        returned = next(e for e in events if isinstance(e, ToolReturned) and e.name == name)
        assert returned.env_fault and why in (returned.error or ""), returned
        # The episode ends at the fault: the agent does not go on to call a dead environment
        # (a hang once held an episode for max_steps x the tool timeout).
        assert [e.name for e in events if isinstance(e, ToolCalled)] == [name]
        finished = one(events, EpisodeFinished)
        assert finished.status == "error"
        assert finished.reason.startswith("the environment failed: ") and why in finished.reason
        graded = one(events, EpisodeGraded)
        assert graded.reward is None and graded.reason == finished.reason  # never a 0 that trains
        assert failure_kind(graded.reason) == "env_fault"  # how a step's metrics and evals count it
    # No tool is left running once its episode is over: in process the timeout cancels it, and
    # platoon's server cancels it when the client ends the session.
    if where != "sdk server":
        await wait_until(lambda: Faulty.hanging == 0)


@pytest.mark.parametrize("where", WHERE)
async def test_a_non_finite_reward_is_not_graded_wherever_the_env_runs(toy_tokenizer, where):
    async with (
        backend_for(where) as backend,
        toy_system(toy_tokenizer, entry("fault-try-then-submit"), backend=backend) as toy,
    ):
        events = await toy.play("nan")
    graded = one(events, EpisodeGraded)
    assert graded.reward is None  # never trained on
    # In process the NaN reaches the grader; JSON has no NaN, so a server sends null instead.
    expected = "non_finite_reward" if where == "in process" else "no_reward"
    assert failure_kind(graded.reason) == expected, graded.reason


@pytest.mark.slow
@pytest.mark.parametrize("where", WHERE)
async def test_an_env_that_declares_tool_errors_the_agents_doing_is_graded(toy_tokenizer, where):
    """As the ORS contract has it, a tool that raises ends the session (behind a server the
    openreward client marks it dead; in process the same): the agent cannot submit, and its
    episode is graded on what it earned, not failed."""
    async with (
        backend_for(where) as backend,
        toy_system(
            toy_tokenizer,
            entry("fault-try-then-submit"),
            backend=backend,
            tool_timeout=0.3,
            tool_errors="agent",
        ) as toy,
    ):
        events = await toy.play("boom")
        hung = await toy.play("hang")
    boom, submit = [e for e in events if isinstance(e, ToolReturned)]
    assert "kaboom" in boom.error and not boom.env_fault
    assert "terminated" in submit.error and not submit.env_fault
    assert one(events, EpisodeFinished).status == "completed"
    assert one(events, EpisodeGraded).reward == 0.0
    # A tool that timed out leaves its session usable: the agent submits and earns 1.0.
    assert one(hung, EpisodeFinished).reason is None
    assert one(hung, EpisodeGraded).reward == 1.0


def test_the_tool_timeout_is_set_per_entry_and_checked():
    from platoon.envs import EnvError, build_env_service

    def timeout(**kwargs: Any) -> float | None:
        return build_env_service("f", env="platoon-number-search@1", service_kwargs=kwargs).tool_timeout

    assert (timeout(), timeout(tool_timeout=2.5), timeout(tool_timeout=None)) == (120.0, 2.5, None)
    with pytest.raises(EnvError, match="tool_timeout must be a number of seconds > 0 or null, got 'soon'"):
        timeout(tool_timeout="soon")

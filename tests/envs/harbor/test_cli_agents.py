"""The shipped command-line agents, end to end: each real agent (installed from PyPI or npm by
the toolchain build, pinned) runs inside the bwrap sandbox of a small Harbor task, driven by a
scripted policy that writes the tool calls that agent expects, and solves it. Every model call is
recorded with its exact tokens, and the episode trains as one datum per agent: each agent sends
back the history it was given and the gateway splices its own earlier assistant turns in as the
sampled tokens.

| agent | dialect | its shell tool |
|---|---|---|
| mini-swe-agent | chat completions (litellm) | `bash` {command} |
| codex | Responses, streamed | `exec_command` {cmd} |
| claude-code | Anthropic Messages, streamed | `Bash` {command, description} |
| pi | chat completions, streamed | `bash` {command} |
| openhands | chat completions (litellm) | `terminal` {command, security_risk} |

OpenHands needs Python 3.12: its test runs where the site names one or platoon finds one.

Then each agent for real, on a sampled model: the tiny random-init model (its window fits the
agents' long first prompts) on the embedded Tinker server, through the gateway, from inside the
sandbox. Its replies are noise, so the agent ends soon; what is checked is that its first prompt
reaches the model whole and the sampled tokens come back recorded.
"""

from __future__ import annotations

import itertools
import json
import shutil
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from platoon.bus import Bus, running
from platoon.bus.events import (
    AgentProcessExited,
    AgentSpawned,
    BatchReady,
    EpisodeFinished,
    EpisodeGraded,
    EpisodeRequested,
    Event,
    ModelCallFinished,
    TaskRef,
    new_id,
)
from platoon.config import AgentsConfig, load_site
from platoon.credit import CreditConfig
from platoon.envs import EnvService
from platoon.envs.harbor.service import HarborBackend
from platoon.gateway import Gateway, GatewayPolicy
from platoon.gateway.renderers import get_renderer
from platoon.harness import AgentContext, AgentResult, get_harness, harness
from platoon.harness.toolchain import find_python
from platoon.policy.base import SamplerFactory
from platoon.policy.tinker import TinkerSamplerFactory, closing
from platoon.programs import EntrySettings, EpisodeRunner, Grader
from platoon.testing.policies import ScriptedSamplerFactory
from platoon.train.batcher import CreditAssigner, CreditSettings

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]

ENV = "tasks"
COMMANDS = [
    "cat question.txt",
    "echo $(( $(tr ' ' + < question.txt) )) > answer.txt && cat answer.txt",
]


@dataclass(frozen=True)
class Agent:
    harness: str
    options: dict[str, Any]
    tool: str
    call: Callable[[str], dict[str, Any]]
    done: str | None  # the last turn's text; None: a last tool call that ends the agent

    def policy(self, messages: list[dict[str, Any]]) -> str:
        """One shell tool call per turn in the format the qwen3 renderer parses, then `done`."""
        return self.turn(sum(1 for m in messages if m.get("role") == "assistant"))

    def turn(self, n: int) -> str:
        commands = COMMANDS if self.done is not None else [*COMMANDS, _MINI_SUBMIT]
        if n >= len(commands):
            return self.done or "Done."
        call = {"name": self.tool, "arguments": self.call(commands[n])}
        return f"Step {n + 1}.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"

    @property
    def calls(self) -> int:
        return len(COMMANDS) + 1


_MINI_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
AGENTS = [
    Agent("mini-swe-agent", {"step_limit": 6}, "bash", lambda c: {"command": c}, None),
    Agent("codex", {}, "exec_command", lambda c: {"cmd": c}, "The sum is in answer.txt."),
    Agent(
        "claude-code",
        {"max_turns": 6},
        "Bash",
        lambda c: {"command": c, "description": "run a command"},
        "The sum is in answer.txt.",
    ),
    Agent("pi", {}, "bash", lambda c: {"command": c}, "The sum is in answer.txt."),
    # OpenHands' tools ask for a `security_risk`: a policy that gives one makes a valid call.
    Agent(
        "openhands",
        {},
        "terminal",
        lambda c: {"command": c, "security_risk": "LOW"},
        "The sum is in answer.txt.",
    ),
]


def _no_python(version: str) -> str | None:
    """Why an agent that needs Python `version` cannot run here (None: it can)."""
    if find_python(version, load_site().pythons) is None:
        return f"no Python {version} here (the site's pythons:, PATH, pyenv, uv)"
    return None


def _agent_param(agent: Agent) -> Any:
    why = _no_python("3.12") if agent.harness == "openhands" else None
    return pytest.param(agent, id=agent.harness, marks=pytest.mark.skipif(why is not None, reason=why or ""))


async def play(
    tokenizer: Any, task: Any, tmp_path: Any, factory: SamplerFactory, entry: EntrySettings
) -> tuple[list[Event], list[BatchReady]]:
    """One episode of the `sum` task with `entry` on the policy `factory` samples: its events and
    the batch it made."""
    backend = HarborBackend(
        task.parent,
        provider="bwrap",
        cache=str(tmp_path / "cache"),
        provider_options={"state_dir": str(tmp_path)},
    )
    components = [
        EnvService(ENV, backend),
        Gateway(GatewayPolicy(get_renderer("qwen3_instruct", tokenizer), factory)),
        EpisodeRunner([entry], request_timeout=60),
        Grader(),
        # A group of one keeps its datums (its advantage is 0): the datums are what is checked.
        CreditAssigner(
            CreditSettings(group_size=1, batch_size=1, credit=CreditConfig(remove_constant_groups=False))
        ),
    ]
    episode_id = new_id()
    events: list[Event] = []
    batches: list[BatchReady] = []
    async with Bus() as bus, running(bus, components):
        bus.subscribe(BatchReady, batches.append)
        async with bus.stream(Event, name="test:episode") as stream:
            task_ref = TaskRef(env=ENV, split="train", task_id="sum")
            await bus.publish(EpisodeRequested(episode_id=episode_id, group_id=new_id(), task=task_ref))
            async for event in stream:
                if getattr(event, "episode_id", None) == episode_id or isinstance(event, AgentProcessExited):
                    events.append(event)
                if isinstance(event, EpisodeGraded) and event.episode_id == episode_id:
                    break
        await bus.drained()
    return events, batches


async def installed(name: str) -> None:
    started = time.monotonic()
    await get_harness(name).install()  # its toolchain, from the registry the first time (then cached)
    print(f"{name} toolchain ready in {time.monotonic() - started:.1f} s")


@pytest.mark.slow
@pytest.mark.parametrize("agent", [_agent_param(a) for a in AGENTS])
async def test_agent_solves_a_harbor_task_in_its_sandbox(agent: Agent, toy_tokenizer, sum_task, tmp_path):
    await installed(agent.harness)
    entry = EntrySettings(name=ENV, harness=agent.harness, max_steps=8, harness_options=agent.options)
    factory = ScriptedSamplerFactory(toy_tokenizer, agent.policy)
    events, batches = await play(toy_tokenizer, sum_task, tmp_path, factory, entry)

    exited = next(e for e in events if isinstance(e, AgentProcessExited))
    finished = next(e for e in events if isinstance(e, EpisodeFinished))
    graded = next(e for e in events if isinstance(e, EpisodeGraded))
    assert finished.status == "completed", (finished.reason, exited.stdout[-3000:], exited.stderr[-3000:])
    assert graded.reward == 1.0  # the task's own tests saw the answer the agent's command wrote
    print(f"agent process: {exited.duration_s:.2f} s in the sandbox")

    # Every model call is recorded with the exact tokens the scripted policy sampled.
    calls = [e for e in events if isinstance(e, ModelCallFinished)]
    assert len(calls) == agent.calls == finished.num_model_calls
    [agent_id] = [e.agent_id for e in events if isinstance(e, AgentSpawned)]
    stop = toy_tokenizer.convert_tokens_to_ids("<|im_end|>")
    for turn, call in enumerate(calls):
        text = agent.turn(turn)
        assert call.agent_id == agent_id
        assert call.completion_tokens == [*toy_tokenizer.encode(text, add_special_tokens=False), stop]
    # The agent sends back the history it was given: each prompt extends the previous prompt
    # plus its completion token for token, so the episode trains as one datum for its one agent.
    for before, after in itertools.pairwise(calls):
        previous = [*before.prompt_tokens, *before.completion_tokens]
        assert after.prompt_tokens[: len(previous)] == previous, _where_it_breaks(
            toy_tokenizer, previous, after
        )
    [batch] = batches
    assert [d.agent_id for d in batch.datums] == [agent_id]
    sampled = sum(len(c.completion_tokens) for c in calls)
    assert sum(d.num_trained_tokens for d in batch.datums) == sampled


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny testing model, with the toy tokenizer the scripted tests use."""
    pytest.importorskip("torch")
    pytest.importorskip("tinker")
    from platoon.testing.models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden_size=64, num_layers=2, seed=0)


@asynccontextmanager
async def embedded(model: Path) -> AsyncIterator[SamplerFactory]:
    """Samplers of `model` on the embedded Tinker server (on the CPU), as `train.backend: local`
    opens them."""
    import tinker

    from platoon.backends.local import running_server_in_thread

    async with running_server_in_thread(str(model), device="cpu") as url:
        async with closing(tinker.ServiceClient(base_url=url, api_key="tml-local")) as client:
            yield TinkerSamplerFactory(client, base_model=str(model))


# Each agent as it is shipped (a turn or step limit where its noise would go on long), and the
# least its first prompt holds in the toy tokenizer's tokens: all but mini-swe-agent's are past
# the 2,048-token window the tiny model had.
REAL = {
    "mini-swe-agent": ({"step_limit": 1}, 400),
    "codex": ({}, 15_000),
    "claude-code": ({"max_turns": 1}, 30_000),
    "pi": ({}, 3_000),
}


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("name", list(REAL))
async def test_agent_calls_the_tiny_model_in_its_sandbox(
    name: str, tiny_model, toy_tokenizer, sum_task, tmp_path
):
    await installed(name)
    options, least = REAL[name]
    entry = EntrySettings(name=ENV, harness=name, max_steps=4, harness_options=options)
    started = time.monotonic()
    async with embedded(tiny_model) as factory:
        events, _ = await play(toy_tokenizer, sum_task, tmp_path, factory, entry)
    took = time.monotonic() - started

    exited = next(e for e in events if isinstance(e, AgentProcessExited))
    finished = next(e for e in events if isinstance(e, EpisodeFinished))
    calls = [e for e in events if isinstance(e, ModelCallFinished)]
    # The agent's long first prompt fit the window and was sampled: noise, with its logprobs.
    assert calls, (finished.status, finished.reason, exited.stdout[-3000:], exited.stderr[-3000:])
    assert finished.status != "error", (finished.reason, exited.stderr[-3000:])
    first = calls[0]
    assert len(first.prompt_tokens) >= least
    assert first.completion_tokens and len(first.logprobs) == len(first.completion_tokens)
    assert all(lp <= 0 for lp in first.logprobs)
    longest = max(len(c.prompt_tokens) for c in calls)
    print(
        f"{name}: {len(calls)} model calls, longest prompt {longest} tokens, "
        f"{took:.1f} s in all ({exited.duration_s:.1f} s the agent process), status {finished.status}"
    )


def _where_it_breaks(tokenizer: Any, previous: list[int], call: ModelCallFinished) -> str:
    at = next((i for i, (a, b) in enumerate(zip(previous, call.prompt_tokens, strict=False)) if a != b), None)
    if at is None:
        return "the next prompt is shorter than the previous prompt and completion"
    return (
        f"the prefix breaks at token {at}: had {tokenizer.decode(previous[at : at + 30])!r}, "
        f"got {tokenizer.decode(call.prompt_tokens[at : at + 30])!r}"
    )


@harness("cli-agents-test-delegate")
async def delegate_to_pi(ctx: AgentContext) -> AgentResult:
    """A root agent that hands the whole task to pi, a command-line agent, as its subagent."""
    result = await ctx.spawn(ctx.instruction, harness="pi")
    return AgentResult(result.status, final_message=result.final_message, reason=result.reason)


@pytest.mark.slow
async def test_a_command_line_agent_runs_as_a_subagent_in_the_tasks_sandbox(
    toy_tokenizer, sum_task, tmp_path
):
    """In a recursive program, pi runs as the root's subagent, in the episode's own sandbox, so
    its commands act on the files the task's tests grade; its calls train as its own datum."""
    await installed("pi")
    pi = next(a for a in AGENTS if a.harness == "pi")
    entry = EntrySettings(
        name=ENV,
        harness="cli-agents-test-delegate",
        program="recursive",
        max_steps=8,
        agents=AgentsConfig(max_depth=1),
    )
    factory = ScriptedSamplerFactory(toy_tokenizer, pi.policy)
    events, batches = await play(toy_tokenizer, sum_task, tmp_path, factory, entry)

    root, child = [e for e in events if isinstance(e, AgentSpawned)]
    assert (child.parent_id, child.depth, child.harness) == (root.agent_id, 1, "pi")
    finished = next(e for e in events if isinstance(e, EpisodeFinished))
    assert finished.status == "completed", finished.reason
    assert next(e for e in events if isinstance(e, EpisodeGraded)).reward == 1.0
    calls = [e for e in events if isinstance(e, ModelCallFinished)]
    assert len(calls) == pi.calls and {c.agent_id for c in calls} == {child.agent_id}
    [batch] = batches
    assert [d.agent_id for d in batch.datums] == [child.agent_id]
    assert sum(d.num_trained_tokens for d in batch.datums) == sum(len(c.completion_tokens) for c in calls)


@pytest.mark.slow
@pytest.mark.skipif(_no_python("3.12") is not None, reason=_no_python("3.12") or "")
async def test_openhands_answers_the_calls_its_schemas_do_not_fit(toy_tokenizer, sum_task, tmp_path):
    """OpenHands checks its tool calls itself: a call without `security_risk` and a call of a tool
    it lacks reach it as calls, and it answers each with its own error for the model to read,
    instead of the gateway turning them into text that would end the agent."""
    turns = [
        {"name": "terminal", "arguments": {"command": COMMANDS[0]}},
        {"name": "no_such_tool", "arguments": {"x": 1}},
        *({"name": "terminal", "arguments": {"command": c, "security_risk": "LOW"}} for c in COMMANDS),
        "The sum is in answer.txt.",
    ]

    def policy(messages: list[dict[str, Any]]) -> str:
        turn = turns[sum(1 for m in messages if m.get("role") == "assistant")]
        return turn if isinstance(turn, str) else f"<tool_call>\n{json.dumps(turn)}\n</tool_call>"

    await installed("openhands")
    entry = EntrySettings(name=ENV, harness="openhands", max_steps=8)
    events, _ = await play(
        toy_tokenizer, sum_task, tmp_path, ScriptedSamplerFactory(toy_tokenizer, policy), entry
    )
    finished = next(e for e in events if isinstance(e, EpisodeFinished))
    exited = next(e for e in events if isinstance(e, AgentProcessExited))
    assert finished.status == "completed", (finished.reason, exited.stderr[-3000:])
    assert next(e for e in events if isinstance(e, EpisodeGraded)).reward == 1.0
    calls = [e for e in events if isinstance(e, ModelCallFinished)]
    assert len(calls) == len(turns)
    # What each bad call was answered with: OpenHands' own errors, in the next prompt.
    answers = [
        toy_tokenizer.decode(b.prompt_tokens[len(a.prompt_tokens) :]) for a, b in itertools.pairwise(calls)
    ]
    assert "Failed to provide security_risk field in tool 'terminal'" in answers[0]
    assert "Tool 'no_such_tool' not found" in answers[1]
    assert "19 23" in answers[2]  # the valid calls ran

"""The shipped mini-swe-agent spec, end to end: the real `mini` (installed from PyPI by the
toolchain build) runs inside the bwrap sandbox of a small Harbor task, driven by a scripted
policy that writes the bash tool calls mini expects, and solves it. Every model call is recorded
with its exact tokens and the episode trains as one datum per agent: mini sends back the history
it was given and the gateway splices its own earlier assistant turns as the sampled tokens."""

from __future__ import annotations

import itertools
import json
import shutil
import time
from typing import Any

import pytest

from platoon import system
from platoon.bus import Bus
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
from platoon.credit import CreditConfig
from platoon.envs import EnvService
from platoon.envs.harbor.service import HarborBackend
from platoon.gateway import Gateway
from platoon.gateway.renderers import get_renderer
from platoon.harness import get_harness
from platoon.programs import EntrySettings, EpisodeRunner, Grader
from platoon.testing.policies import ScriptedSamplerFactory
from platoon.train.batcher import CreditAssigner

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),
]

ENV = "tasks"
DOCKERFILE = "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY question.txt /app/question.txt\n"
SUM_TEST = """\
#!/bin/bash
[ "$(cat /app/answer.txt 2>/dev/null)" = "42" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
"""
COMMANDS = [
    "cat question.txt",
    "echo $(( $(tr ' ' + < question.txt) )) > answer.txt && cat answer.txt",
    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
]


def mini_policy(messages: list[dict[str, Any]]) -> str:
    """One bash tool call per turn, in the tool-call format the qwen3 renderer parses."""
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    call = {"name": "bash", "arguments": {"command": COMMANDS[min(turn, len(COMMANDS) - 1)]}}
    return f"Step {turn + 1}.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"


async def test_mini_swe_agent_solves_a_harbor_task_in_its_sandbox(toy_tokenizer, make_task, tmp_path):
    task = make_task(
        "sum",
        instruction="Add the two numbers of question.txt and write the sum to answer.txt.\n",
        test_sh=SUM_TEST,
        dockerfile=DOCKERFILE,
        files={"environment/question.txt": "19 23\n"},
    )
    harness = get_harness("mini-swe-agent")
    started = time.monotonic()
    await harness.install()  # the toolchain, from PyPI the first time (cached in the site cache)
    print(f"toolchain ready in {time.monotonic() - started:.1f} s")

    backend = HarborBackend(
        task.parent,
        provider="bwrap",
        cache=str(tmp_path / "cache"),
        provider_options={"state_dir": str(tmp_path)},
    )
    components = [
        EnvService(ENV, backend),
        Gateway(
            renderer=get_renderer("qwen3_instruct", toy_tokenizer),
            sampler_factory=ScriptedSamplerFactory(toy_tokenizer, mini_policy),
        ),
        EpisodeRunner(
            [
                EntrySettings(
                    name=ENV, harness="mini-swe-agent", max_steps=8, harness_options={"step_limit": 6}
                )
            ],
            request_timeout=60,
        ),
        Grader(),
        # A group of one keeps its datums (its advantage is 0): the datums are what is checked.
        CreditAssigner(group_size=1, batch_size=1, credit=CreditConfig(remove_constant_groups=False)),
    ]
    episode_id = new_id()
    events: list[Event] = []
    batches: list[BatchReady] = []
    async with Bus() as bus, system.running(bus, components):
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

    exited = next(e for e in events if isinstance(e, AgentProcessExited))
    finished = next(e for e in events if isinstance(e, EpisodeFinished))
    graded = next(e for e in events if isinstance(e, EpisodeGraded))
    assert finished.status == "completed", (finished.reason, exited.stdout[-3000:], exited.stderr[-3000:])
    assert graded.reward == 1.0  # the task's own tests saw the answer mini's command wrote
    print(f"agent process: {exited.duration_s:.2f} s in the sandbox")

    # Every model call is recorded with the exact tokens the scripted policy sampled.
    calls = [e for e in events if isinstance(e, ModelCallFinished)]
    assert len(calls) == len(COMMANDS) == finished.num_model_calls
    [agent] = [e.agent_id for e in events if isinstance(e, AgentSpawned)]
    stop = toy_tokenizer.convert_tokens_to_ids("<|im_end|>")
    for turn, call in enumerate(calls):
        text = mini_policy([{"role": "assistant"}] * turn)
        assert call.agent_id == agent
        assert call.completion_tokens == [*toy_tokenizer.encode(text, add_special_tokens=False), stop]
    # mini sends back the history it was given: each prompt extends the previous prompt plus
    # its completion token for token, so the episode trains as one datum for its one agent.
    for before, after in itertools.pairwise(calls):
        previous = [*before.prompt_tokens, *before.completion_tokens]
        assert after.prompt_tokens[: len(previous)] == previous, _where_it_breaks(
            toy_tokenizer, previous, after
        )
    [batch] = batches
    assert [d.agent_id for d in batch.datums] == [agent]
    sampled = sum(len(c.completion_tokens) for c in calls)
    assert sum(d.num_trained_tokens for d in batch.datums) == sampled


def _where_it_breaks(tokenizer: Any, previous: list[int], call: ModelCallFinished) -> str:
    at = next((i for i, (a, b) in enumerate(zip(previous, call.prompt_tokens, strict=False)) if a != b), None)
    if at is None:
        return "the next prompt is shorter than the previous prompt and completion"
    return (
        f"the prefix breaks at token {at}: had {tokenizer.decode(previous[at : at + 30])!r}, "
        f"got {tokenizer.decode(call.prompt_tokens[at : at + 30])!r}"
    )

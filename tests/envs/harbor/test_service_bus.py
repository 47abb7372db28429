"""`service: harbor` end to end on the bus: the runner plays platoon-bash against a scripted
policy whose commands run in a bubblewrap sandbox, and the task's own tests grade the result."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from platoon.bus import Bus, running
from platoon.bus.events import (
    EpisodeFinished,
    EpisodeGraded,
    EpisodeRequested,
    Event,
    TaskRef,
    ToolReturned,
    new_id,
)
from platoon.envs import EnvService
from platoon.envs.harbor.service import HarborBackend
from platoon.gateway import Gateway, GatewayPolicy
from platoon.gateway.renderers import get_renderer
from platoon.programs import EntrySettings, EpisodeRunner, Grader
from platoon.testing.policies import ScriptedSamplerFactory

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
]

ENV = "tasks"
DOCKERFILE = "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY question.txt /app/question.txt\n"
# Reward 1 when answer.txt holds the sum asked in question.txt; "answered" is a second number.
SUM_TEST = """\
#!/bin/bash
answer=$(cat /app/answer.txt 2>/dev/null)
reward=0; [ "$answer" = "42" ] && reward=1
answered=0; [ -n "$answer" ] && answered=1
echo "{\\"reward\\": $reward, \\"answered\\": $answered}" > /logs/verifier/reward.json
"""


def bash_calls(*commands: str) -> Callable[[list[dict[str, Any]]], str]:
    """A policy that runs `commands` one per turn through the bash tool, then says it is done."""

    def script(messages: list[dict[str, Any]]) -> str:
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if turn >= len(commands):
            return "Done."
        call = {"name": "bash", "arguments": {"command": commands[turn]}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

    return script


@asynccontextmanager
async def harbor_system(
    tokenizer: Any, dataset: Any, script: Any, state_dir: Any, grader: Any = None, **entry: Any
) -> AsyncIterator[Bus]:
    backend = HarborBackend(
        dataset,
        provider="bwrap",
        cache=str(state_dir.parent / "cache"),
        provider_options={"state_dir": str(state_dir)},
    )
    components = [
        EnvService(ENV, backend),
        Gateway(
            GatewayPolicy(
                get_renderer("qwen3_instruct", tokenizer), ScriptedSamplerFactory(tokenizer, script)
            ),
        ),
        EpisodeRunner(
            [EntrySettings(name=ENV, harness="platoon-bash", **{"max_steps": 6, **entry})], request_timeout=60
        ),
        grader or Grader(),
    ]
    async with Bus() as bus, running(bus, components):
        yield bus


async def play(bus: Bus, task_id: str) -> list[Event]:
    episode_id = new_id()
    events: list[Event] = []
    async with bus.stream(Event, name="test:episode") as stream:
        task = TaskRef(env=ENV, split="train", task_id=task_id)
        await bus.publish(EpisodeRequested(episode_id=episode_id, group_id=new_id(), task=task))
        async for event in stream:
            if getattr(event, "episode_id", None) == episode_id:
                events.append(event)
            if isinstance(event, EpisodeGraded) and event.episode_id == episode_id:
                break
    return events


def sum_task(make_task, **kwargs):
    return make_task(
        "sum",
        instruction="Add the two numbers of /app/question.txt and write the sum to /app/answer.txt.\n",
        test_sh=SUM_TEST,
        dockerfile=DOCKERFILE,
        files={"environment/question.txt": "19 23\n"},
        **kwargs,
    )


@pytest.mark.parametrize(
    ("command", "reward", "answered"),
    [("echo $(( $(tr ' ' + < question.txt) )) > answer.txt", 1.0, 1.0), ("echo 41 > answer.txt", 0.0, 1.0)],
)
async def test_right_answer_gets_1_and_wrong_gets_0(
    toy_tokenizer, make_task, tmp_path, command, reward, answered
):
    task = sum_task(make_task)
    state = tmp_path / "state"
    script = bash_calls("cat question.txt", command)
    async with harbor_system(toy_tokenizer, task.parent, script, state) as bus:
        events = await play(bus, "sum")
        # The session is closed once the episode is graded: its sandbox state is gone.
        await _until_empty(state)

    returned = [e for e in events if isinstance(e, ToolReturned)]
    finished = next(e for e in events if isinstance(e, EpisodeFinished))
    graded = next(e for e in events if isinstance(e, EpisodeGraded))
    assert returned[0].output == "19 23\n[exit code 0]"  # the task's file, copied by its Dockerfile
    assert (finished.status, finished.final_message, finished.num_model_calls) == ("completed", "Done.", 3)
    assert (graded.reward, graded.rewards, graded.reason) == (
        reward,
        {"reward": reward, "answered": answered},
        None,
    )


@pytest.mark.slow
async def test_agent_timeout_ends_the_agent_and_the_verifier_still_runs(toy_tokenizer, make_task, tmp_path):
    task = sum_task(make_task, toml="[agent]\ntimeout_sec = 1.5\n")
    script = bash_calls("echo 42 > answer.txt", "sleep 30", "echo 0 > answer.txt")
    async with harbor_system(toy_tokenizer, task.parent, script, tmp_path / "state") as bus:
        events = await play(bus, "sum")

    returned = [e for e in events if isinstance(e, ToolReturned)]
    graded = next(e for e in events if isinstance(e, EpisodeGraded))
    assert len(returned) == 2 and returned[1].finished
    assert "time limit of 1.5 s is up" in returned[1].output
    assert graded.reward == 1.0  # the later command never ran


async def test_a_task_that_cannot_start_is_a_failed_episode_not_a_crash(toy_tokenizer, make_task, tmp_path):
    task = make_task("broken", dockerfile="FROM debian\nRUN exit 3\n")
    async with harbor_system(toy_tokenizer, task.parent, bash_calls(), tmp_path / "state") as bus:
        events = await play(bus, "broken")

    finished = next(e for e in events if isinstance(e, EpisodeFinished))
    graded = next(e for e in events if isinstance(e, EpisodeGraded))
    assert finished.status == "error"
    assert "task broken: the sandbox did not start: Dockerfile:2: run failed (exit 3)" in finished.reason
    assert graded.reward is None


async def _until_empty(directory) -> None:
    import anyio

    with anyio.fail_after(10):
        while any(directory.iterdir()):  # noqa: ASYNC110 - closing has no event of its own
            await anyio.sleep(0.02)


async def test_a_judge_reads_the_sandbox_files_the_agent_left(toy_tokenizer, make_task, tmp_path):
    import msgspec

    from platoon.config.schema import JudgeConfig, RewardConfig
    from platoon.rewards import Judge, RewardRules, SamplerJudgeModel
    from platoon.testing.policies import ScriptedSampler

    seen = []

    def judge_script(messages: list[dict[str, Any]]) -> str:
        seen.append(messages[-1]["content"])
        return "Score: 10" if "/app/answer.txt\n42\n" in messages[-1]["content"] else "Score: 0"

    files = ["/app/answer.txt", "/app/../etc/shadow"]
    config = msgspec.convert({"rubric": "{files}", "files": files}, JudgeConfig)
    renderer = get_renderer("qwen3_instruct", toy_tokenizer)
    judge = Judge(config, SamplerJudgeModel(ScriptedSampler(toy_tokenizer, judge_script), renderer))
    rules = RewardRules(
        msgspec.convert({"rules": [{"rule": "env"}, {"rule": "judge"}]}, RewardConfig), entry_judge=judge
    )
    task = sum_task(make_task)
    script = bash_calls("echo 42 > answer.txt")
    grader = Grader(rules={ENV: rules})
    async with harbor_system(toy_tokenizer, task.parent, script, tmp_path / "state", grader=grader) as bus:
        events = await play(bus, "sum")
    graded = next(e for e in events if isinstance(e, EpisodeGraded))
    assert graded.rewards["rule/judge"] == 1.0 and graded.reward == 2.0
    (prompt,) = seen
    assert "[could not read /app/../etc/shadow:" in prompt  # paths with .. are refused

"""A command-line agent runs inside the Harbor task's sandbox: its commands act on the task's
files, it sees only what its spec names and reaches the gateway through one forwarded port, and
an agent that is missing, crashes, never calls the model or floods its output ends its own
episode with a clear status while the run goes on."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from platoon.bus import Bus, running
from platoon.bus.events import (
    AgentProcessExited,
    EpisodeFinished,
    EpisodeGraded,
    EpisodeRequested,
    Event,
    ModelCallFinished,
    TaskRef,
    new_id,
)
from platoon.envs import EnvService
from platoon.envs.harbor.service import HarborBackend
from platoon.gateway import Gateway, GatewayPolicy
from platoon.gateway.renderers import get_renderer
from platoon.harness.command import SpecError, load_spec_harness
from platoon.programs import EntrySettings, EpisodeRunner, Grader
from platoon.testing.policies import ScriptedSamplerFactory

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
    pytest.mark.parametrize("anyio_backend", ["asyncio"]),  # each episode starts a real process
]

ENV = "tasks"
AGENTS = Path(__file__).parent / "agents"


def commands(*steps: str):
    def script(messages: list[dict[str, Any]]) -> str:
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        return steps[turn] if turn < len(steps) else "Done."

    return script


@asynccontextmanager
async def harbor_system(tokenizer, dataset, script, tmp_path, harness) -> AsyncIterator[Bus]:
    backend = HarborBackend(
        dataset,
        provider="bwrap",
        cache=str(tmp_path / "cache"),
        provider_options={"state_dir": str(tmp_path / "state")},
    )
    components = [
        EnvService(ENV, backend),
        Gateway(
            GatewayPolicy(
                get_renderer("qwen3_instruct", tokenizer), ScriptedSamplerFactory(tokenizer, script)
            ),
        ),
        EpisodeRunner([EntrySettings(name=ENV, harness=str(harness), max_steps=6)], request_timeout=60),
        Grader(),
    ]
    async with Bus() as bus, running(bus, components):
        yield bus


async def play(bus: Bus, task_id: str = "sum") -> list[Event]:
    episode_id = new_id()
    events: list[Event] = []
    async with bus.stream(Event, name="test:episode") as stream:
        task = TaskRef(env=ENV, split="train", task_id=task_id)
        await bus.publish(EpisodeRequested(episode_id=episode_id, group_id=new_id(), task=task))
        async for event in stream:
            if getattr(event, "episode_id", None) == episode_id or isinstance(event, AgentProcessExited):
                events.append(event)
            if isinstance(event, EpisodeGraded) and event.episode_id == episode_id:
                break
    return events


@pytest.fixture
def site(tmp_path, monkeypatch):
    (tmp_path / "site.yaml").write_text(f"runs: {tmp_path / 'runs'}\ncache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    monkeypatch.setenv("TINKER_API_KEY", "host-secret")


def only(events, kind):
    [event] = [e for e in events if isinstance(e, kind)]
    return event


async def test_the_agent_acts_on_the_task_files_inside_the_sandbox(toy_tokenizer, sum_task, tmp_path, site):
    task = sum_task
    script = commands(
        "pwd; env | cut -d= -f1 | sort | tr '\\n' ' '; cat question.txt",
        "echo $(( $(tr ' ' + < question.txt) )) > answer.txt",
    )
    async with harbor_system(
        toy_tokenizer, task.parent, script, tmp_path, AGENTS / "shell-agent.toml"
    ) as bus:
        events = await play(bus)

    finished, graded = only(events, EpisodeFinished), only(events, EpisodeGraded)
    assert (finished.status, finished.final_message, finished.num_model_calls) == ("completed", "finished", 3)
    assert graded.reward == 1.0  # the task's tests saw the file the agent wrote
    calls = [e for e in events if isinstance(e, ModelCallFinished)]
    seen = toy_tokenizer.decode(calls[1].prompt_tokens)
    # It ran in the task's workdir, with the task's file, and an environment of only what the
    # spec names (no TINKER_API_KEY, nothing of the host's).
    assert "/app\n" in seen and "19 23" in seen
    names = seen.split("/app\n", 1)[1].split("19 23")[0].split()
    assert "TINKER_API_KEY" not in names
    assert set(names) <= {
        "HOME",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "PATH",
        "PWD",
        "SHLVL",
        "LC_CTYPE",
        "_",
    }


async def test_the_agent_reaches_nothing_of_the_host_but_the_gateway(toy_tokenizer, sum_task, tmp_path, site):
    task = sum_task
    async with await anyio.create_tcp_listener(local_host="127.0.0.1") as host_service:
        port = host_service.extra(anyio.abc.SocketAttribute.local_port)
        probe = (
            f'python3 -c "import socket; s=socket.socket(); s.settimeout(2); '
            f"print('host-service', s.connect_ex(('127.0.0.1', {port})))\"; "
            "ls /opt/platoon; cat /proc/1/environ | tr '\\0' '\\n' | grep -c TINKER"
        )
        async with harbor_system(
            toy_tokenizer, task.parent, commands(probe), tmp_path, AGENTS / "shell-agent.toml"
        ) as bus:
            events = await play(bus)
    calls = [e for e in events if isinstance(e, ModelCallFinished)]
    seen = toy_tokenizer.decode(calls[1].prompt_tokens)
    assert "host-service 111" in seen  # refused: a service on the host's loopback is out of reach
    assert "home\nrun\nspec\n0" in seen  # what platoon mounts (no toolchain here); no host secret


@pytest.mark.parametrize(
    ("command", "status", "reason"),
    [
        ('["/nonexistent/agent"]', "error", "test-bad did not run: cannot start '/nonexistent/agent'"),
        ('["python3", "-c", "import sys; sys.exit(\'boom\')"]', "error", "test-bad exited with code 1: boom"),
        ('["true"]', "error", "test-bad exited without calling the model"),
    ],
)
async def test_a_broken_agent_ends_its_episode_with_a_clear_status(
    toy_tokenizer, sum_task, tmp_path, site, command, status, reason
):
    task = sum_task
    spec = tmp_path / "bad.toml"
    spec.write_text(f'name = "test-bad"\ncommand = {command}\n')
    async with harbor_system(toy_tokenizer, task.parent, commands(), tmp_path, spec) as bus:
        first = await play(bus)
        second = await play(bus)  # the run goes on
    for events in (first, second):
        finished = only(events, EpisodeFinished)
        assert (finished.status, finished.reason[: len(reason)]) == (status, reason)
        assert only(events, EpisodeGraded).reward is None  # an error is no reward to train on


async def test_a_flooding_agent_costs_the_event_log_only_its_capped_tail(
    toy_tokenizer, sum_task, tmp_path, site
):
    task = sum_task
    spec = tmp_path / "flood.toml"
    spec.write_text(
        textwrap.dedent(
            """
            name = "test-flood"
            output_cap = 1000
            command = ["bash", "-c", "head -c 20000000 /dev/zero | tr '\\\\0' x; echo; echo last words; exit 1"]
            """
        )
    )
    async with harbor_system(toy_tokenizer, task.parent, commands(), tmp_path, spec) as bus:
        events = await play(bus)
    exited = only(events, AgentProcessExited)
    assert exited.stdout_bytes == 20_000_000 + len("\nlast words\n")
    assert len(exited.stdout) == 1000 and exited.stdout.endswith("last words\n")
    finished = only(events, EpisodeFinished)
    assert finished.status == "error" and finished.final_message.endswith("last words")


@pytest.mark.slow
async def test_an_agent_past_the_tasks_time_limit_is_stopped_and_graded_on_what_it_left(
    toy_tokenizer, make_task, tmp_path, site
):
    """Harbor's rule: past `[agent].timeout_sec` the agent is stopped, its sandbox kept and the
    task's tests grade what it left. The policy answers the first turn and never the second."""
    task = make_task(
        "sum",
        toml="[agent]\ntimeout_sec = 2\n",
        instruction="Write 42 to /app/answer.txt\n",
        files={"environment/question.txt": "19 23\n"},
    )
    second_turn = anyio.Event()

    async def slow(messages: list[dict[str, Any]]) -> str:
        if any(m.get("role") == "assistant" for m in messages):
            second_turn.set()
            await anyio.sleep_forever()  # a policy slower than the task's limit
        return "echo 42 > answer.txt"

    async with harbor_system(toy_tokenizer, task.parent, slow, tmp_path, AGENTS / "shell-agent.toml") as bus:
        events = await play(bus)

    assert second_turn.is_set()
    exited, finished, graded = (
        only(events, AgentProcessExited),
        only(events, EpisodeFinished),
        only(events, EpisodeGraded),
    )
    assert exited.timed_out and exited.task_limit
    # The record says which limit fired, and the episode is graded as Harbor's runner grades it.
    assert finished.status == graded.status == "limit"
    assert finished.reason.startswith("test-shell-agent was stopped by the task's 2 s timeout")
    assert graded.reward == 1.0  # the task's tests saw the answer written before the limit


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('command = ["a"]\ncolour = "red"\n', "colour: unknown key"),
        ('command = ["a", "{gatway_url}"]\n', "command.1: unknown placeholder {gatway_url}"),
        (
            'command = ["a"]\n[toolchain]\npip = ["mini-swe-agent"]\n',
            "toolchain.pip.0: 'mini-swe-agent' is not pinned",
        ),
        ('command = ["a"]\nruns_in = "vm"\n', "runs_in"),
    ],
)
async def test_a_spec_with_a_mistake_is_refused_naming_the_key(tmp_path, body, message):
    spec = tmp_path / "bad.toml"
    spec.write_text('name = "bad"\n' + body)
    with pytest.raises(SpecError, match=message.replace("{", r"\{").replace("}", r"\}").replace("(", r"\(")):
        load_spec_harness(spec)

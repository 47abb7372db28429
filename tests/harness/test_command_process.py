"""How platoon runs a command-line harness's process: placeholders, files and environment, exit
codes, timeouts and cancellation (the whole process group is killed), and the cached install."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from platoon.bus import Bus
from platoon.bus.events import TaskRef
from platoon.harness import AgentContext, Budget, validate_options
from platoon.harness.command import CommandHarness, SpecError, load_spec_harness

pytestmark = pytest.mark.anyio


def spec(tmp_path: Path, body: str, name: str = "agent") -> CommandHarness:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\nruns_in = "host"\n' + textwrap.dedent(body))
    return load_spec_harness(path)


def script(tmp_path: Path, code: str) -> str:
    """A Python script for `command`, as a TOML string."""
    path = tmp_path / "agent.py"
    path.write_text(textwrap.dedent(code))
    return f'["{sys.executable}", "{path}"]'


async def run(harness: CommandHarness, bus: Bus, **options) -> object:
    ctx = AgentContext(
        bus=bus,
        task=TaskRef(env="env", split="train", task_id="0"),
        episode_id="ep",
        agent_id="ep/root",
        instruction='Say "hi" {twice}.',
        tools=[],
        budget=Budget(5),
        options=validate_options(harness, options),
        gateway_url="http://127.0.0.1:9/v1",
        api_key="secret-key",
    )
    return await harness.run(ctx)


async def test_placeholders_fill_the_command_env_and_files(tmp_path):
    command = script(
        tmp_path,
        """
        import os, sys
        print("argv", sys.argv[1:])
        print("env", os.environ["AGENT_KEY"], os.environ["AGENT_URL"])
        print("file", open("conf/agent.json").read())
        print("cwd", os.getcwd())
        """,
    )
    harness = spec(
        tmp_path,
        f"""
        command = {command[:-1]}, "{{instruction}}", "{{option.level}}", "{{option.verbose}}", "{{max_steps}}"]
        [env]
        AGENT_KEY = "{{api_key}}"
        AGENT_URL = "{{gateway_url}}"
        [files]
        "conf/agent.json" = '{{{{"dir": "{{workdir}}", "level": {{option.level}}}}}}'
        [options.level]
        type = "int"
        default = 2
        [options.verbose]
        type = "bool"
        default = false
        """,
    )
    async with Bus() as bus:
        result = await run(harness, bus, verbose=True)

    lines = result.final_message.splitlines()
    assert result.status == "completed"
    assert lines[0] == "argv ['Say \"hi\" {twice}.', '2', 'true', '5']"
    assert lines[1] == "env secret-key http://127.0.0.1:9/v1"
    workdir = lines[3].removeprefix("cwd ")
    assert lines[2] == f'file {{"dir": "{workdir}", "level": 2}}'
    assert not await anyio.Path(workdir).exists()  # the work dir is removed after the episode


@pytest.mark.parametrize(
    ("code", "status", "reason"),
    [
        ("print('done')", "completed", None),
        ("import sys; print('tried'); sys.exit(3)", "limit", "agent exited with code 3"),
        ("import sys; sys.stderr.write('boom'); sys.exit(5)", "error", "agent exited with code 5: boom"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "error", "agent was killed by SIGKILL"),
        ("import sys; sys.exit(4)", "timeout", "agent exited with code 4"),
    ],
)
async def test_exit_codes_map_to_statuses(tmp_path, code, status, reason):
    harness = spec(
        tmp_path,
        f"""
        command = ["{sys.executable}", "-c", "{code}"]
        [exit_codes]
        3 = "limit"
        4 = "timeout"
        """,
    )
    async with Bus() as bus:
        result = await run(harness, bus)
    assert (result.status, result.reason) == (status, reason)


@pytest.mark.slow
async def test_a_timeout_kills_the_process_group(tmp_path):
    pids = tmp_path / "pids"
    command = script(
        tmp_path,
        f"""
        import os, subprocess, time
        child = subprocess.Popen(["sleep", "60"])
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        print("started", flush=True)
        time.sleep(60)
        """,
    )
    harness = spec(tmp_path, f"command = {command}\ntimeout = 1\n")
    async with Bus() as bus:
        with anyio.fail_after(10):
            result = await run(harness, bus)
    assert (result.status, result.final_message, result.reason) == (
        "timeout",
        "started",
        "agent passed its 1.0 s timeout",
    )
    for pid in map(int, pids.read_text().split()):
        assert await gone(pid)


@pytest.mark.slow
async def test_cancelling_the_episode_kills_the_process_group(tmp_path):
    pids = tmp_path / "pids"
    command = script(
        tmp_path,
        f"""
        import os, signal, subprocess, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL will do
        child = subprocess.Popen(["sleep", "60"])
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        time.sleep(60)
        """,
    )
    harness = spec(tmp_path, f"command = {command}\n")
    async with Bus() as bus:
        with anyio.move_on_after(1):
            await run(harness, bus)
    for pid in map(int, pids.read_text().split()):
        assert await gone(pid)


@pytest.mark.slow
async def test_a_process_that_escaped_the_group_does_not_hold_the_episode(tmp_path):
    pid_file = tmp_path / "pid"
    command = script(
        tmp_path,
        f"""
        import subprocess
        daemon = subprocess.Popen(["sleep", "30"], start_new_session=True)  # keeps our stdout open
        open({str(pid_file)!r}, "w").write(str(daemon.pid))
        print("bye")
        """,
    )
    harness = spec(tmp_path, f"command = {command}\n")
    try:
        async with Bus() as bus:
            with anyio.fail_after(5):
                result = await run(harness, bus)
        assert (result.status, result.final_message) == ("completed", "bye")
    finally:
        os.kill(int(pid_file.read_text()), 9)


async def test_a_missing_program_is_an_error(tmp_path):
    harness = spec(tmp_path, 'command = ["/nonexistent/agent"]\n')
    async with Bus() as bus:
        result = await run(harness, bus)
    assert result.status == "error"
    assert result.reason.startswith("cannot start '/nonexistent/agent': ")


async def test_install_runs_once_and_is_remembered(tmp_path, monkeypatch):
    site = tmp_path / "site.yaml"
    site.write_text(f"cache: {tmp_path / 'cache'}\nruns: {tmp_path / 'runs'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    body = f"""
        install = ["{sys.executable}", "-c", "open('{{cache_dir}}/installs', 'a').write('x')"]
        command = ["{sys.executable}", "-c", "print(open('{{cache_dir}}/installs').read())"]
        """
    harness = spec(tmp_path, body)
    async with Bus() as bus:
        results = [await run(harness, bus) for _ in range(2)]
        results.append(await run(spec(tmp_path, body), bus))  # a fresh process would see the marker
    assert [r.final_message for r in results] == ["x", "x", "x"]
    assert harness.cache_dir() == tmp_path / "cache" / "harnesses" / "agent"

    failing = spec(
        tmp_path,
        f'install = ["{sys.executable}", "-c", "import sys; sys.exit(\'no network\')"]\ncommand = ["true"]\n',
        name="other",
    )
    with pytest.raises(
        SpecError, match=r"^harness 'other': its install command exited with code 1: no network$"
    ):
        await failing.install()


async def gone(pid: int, within: float = 2.0) -> bool:
    """Whether `pid` dies within `within` seconds (a SIGKILL takes a moment to land)."""
    for _ in range(int(within / 0.01)):
        if not _alive(pid):
            return True
        await anyio.sleep(0.01)
    return not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is dead, waiting for a parent to reap it
        return stat.read().split(") ")[1][0] != "Z"

"""A Harbor session's phases, each field of task.toml that shapes them honoured in a real bwrap
sandbox: storage, healthcheck timing, collect hooks, artifacts, a separate verifier, and each
phase's own network."""

from __future__ import annotations

import json
import shutil

import pytest

from platoon.envs import EnvError, TaskInfo
from platoon.envs.harbor import HarborError
from platoon.envs.harbor.service import HarborBackend
from platoon.sandbox._netns import SandboxNetwork

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
]
TASK = TaskInfo(split="train", task_id="task", index=0)


def backend(tmp_path, **kwargs) -> HarborBackend:
    return HarborBackend(tmp_path / "tasks", provider="bwrap", cache=str(tmp_path / "cache"), **kwargs)


def reward_json(body: str) -> str:
    """A test.sh that writes reward.json from shell variables `body` sets."""
    return f'#!/bin/bash\n{body}\necho "{{\\"reward\\": $reward, \\"exact\\": $exact}}" > /logs/verifier/reward.json\n'


async def test_storage_mb_is_a_requirement_the_sandbox_must_meet(make_task, tmp_path):
    make_task("small", toml="[environment]\nstorage_mb = 1\n")
    make_task("huge", toml="[environment]\nstorage_mb = 1000000000\n")  # a petabyte
    harbor = backend(tmp_path)
    session = await harbor.open(TaskInfo(split="train", task_id="small", index=0), {})
    await session.close()
    with pytest.raises(
        EnvError, match=r"task huge: .*environment.storage_mb = 1000000000: the sandbox has \d+ MB free"
    ):
        await harbor.open(TaskInfo(split="train", task_id="huge", index=0), {})


async def test_a_healthcheck_failing_in_its_start_period_is_retried_not_counted(make_task, tmp_path):
    # Fails once (creating the file), then passes: one failure in the start period is not counted.
    check = 'command = "test -e /app/ready || { touch /app/ready; false; }"\nretries = 1\n'
    make_task(
        "grace", toml=f"[environment.healthcheck]\n{check}start_period_sec = 30\nstart_interval_sec = 0.01\n"
    )
    make_task("strict", toml=f"[environment.healthcheck]\n{check}")
    harbor = backend(tmp_path)
    session = await harbor.open(TaskInfo(split="train", task_id="grace", index=0), {})
    await session.close()
    with pytest.raises(EnvError, match="failed 1 times in a row"):
        await harbor.open(TaskInfo(split="train", task_id="strict", index=0), {})


async def test_collect_hooks_then_artifacts_then_the_verifier(make_task, tmp_path):
    toml = """\
artifacts = ["/app/answer.txt", { source = "/app/out", destination = "kept", exclude = ["*.tmp", "skip"] }]
[[verifier.collect]]
command = "echo snapshot > /logs/artifacts/state.txt"
[[verifier.collect]]
command = "exit 4"
"""
    test_sh = reward_json(
        'reward=0; [ "$(cat /logs/artifacts/state.txt)" = snapshot ] && reward=1\n'
        'exact=0; [ "$(cat /app/answer.txt)" = 42 ] && exact=1'
    )
    make_task(toml=toml, test_sh=test_sh)
    harbor = backend(tmp_path, artifacts_dir=tmp_path / "artifacts")
    session = await harbor.open(TASK, {})
    try:
        await session.call_tool(
            "bash",
            {"command": "echo 42 > answer.txt && mkdir -p out/skip && cd out && touch a.log b.tmp skip/c"},
        )
        grade = await session.grade()
    finally:
        await session.close()
    assert (grade.reward, grade.rewards) == (1.0, {"reward": 1.0, "exact": 1.0})
    assert grade.reason == "collect hook 'exit 4' exited with code 4"  # noted, not fatal
    (folder,) = (tmp_path / "artifacts" / "task").iterdir()
    assert (folder / "app" / "answer.txt").read_text() == "42\n"
    assert (folder / "logs" / "artifacts" / "state.txt").read_text() == "snapshot\n"
    assert sorted(p.name for p in (folder / "kept").iterdir()) == ["a.log"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [(m["source"], m["destination"], m["status"]) for m in manifest] == [
        ("/logs/artifacts", "logs/artifacts", "ok"),
        ("/app/answer.txt", "app/answer.txt", "ok"),
        ("/app/out", "kept", "ok"),
    ]


async def test_a_separate_verifier_sees_the_artifacts_and_nothing_else_of_the_agents(make_task, tmp_path):
    toml = 'artifacts = ["/app/answer.txt"]\n[verifier]\nenvironment_mode = "separate"\n'
    test_sh = reward_json(
        'reward=0; [ "$(cat /app/answer.txt)" = 42 ] && reward=1\nexact=1; [ -e /app/scratch.txt ] && exact=0'
    )
    make_task(toml=toml, test_sh=test_sh)
    session = await backend(tmp_path).open(TASK, {})
    try:
        await session.call_tool("bash", {"command": "echo 42 > answer.txt; echo x > scratch.txt"})
        grade = await session.grade()
        # The agent's sandbox never saw the tests: they ran elsewhere.
        left = await session.sandbox.exec("ls -A /tests; ls /logs/verifier/reward.* 2>/dev/null")
    finally:
        await session.close()
    assert (grade.reward, grade.rewards, grade.reason) == (1.0, {"reward": 1.0, "exact": 1.0}, None)
    assert left.stdout == ""


async def test_a_verifier_environment_gives_the_separate_verifier_its_own_settings(make_task, tmp_path):
    toml = '[verifier.environment]\nenv = { ROLE = "verifier" }\nworkdir = "/check"\n'
    test_sh = reward_json('reward=0; [ "$ROLE" = verifier ] && [ "$PWD" = /check ] && reward=1\nexact=0')
    make_task(toml=toml, test_sh=test_sh)
    session = await backend(tmp_path).open(TASK, {})
    try:
        grade = await session.grade()
    finally:
        await session.close()
    assert grade.reward == 1.0


@pytest.mark.skipif(bool(SandboxNetwork.unavailable()), reason=SandboxNetwork.unavailable() or "")
async def test_each_phase_gets_its_own_network(make_task, tmp_path):
    # A default route is the way out: the agent has none, the verifier has one.
    has_route = "awk 'NR > 1 && $2 == \"00000000\"' /proc/net/route | grep -q ."
    toml = '[environment]\nnetwork_mode = "public"\n[agent]\nnetwork_mode = "no-network"\n'
    make_task(toml=toml, test_sh=reward_json(f"reward=0; {has_route} && reward=1\nexact=0"))
    session = await backend(tmp_path).open(TASK, {})
    try:
        assert session.sandbox.spec.network
        agent = await session.call_tool("bash", {"command": f"{has_route} && echo routed || echo offline"})
        grade = await session.grade()
    finally:
        await session.close()
    assert agent.output == "offline\n[exit code 0]"
    assert grade.reward == 1.0


def test_phases_that_differ_in_network_need_a_provider_that_can_part_them(make_task, tmp_path):
    make_task(toml='[environment]\nnetwork_mode = "public"\n[verifier]\nnetwork_mode = "no-network"\n')
    harbor = HarborBackend(tmp_path / "tasks", provider="docker", cache=str(tmp_path / "cache"))
    with pytest.raises(
        HarborError, match=r"agent.network_mode or verifier.network_mode\): the docker provider cannot"
    ):
        harbor.sandboxes.check_phases(harbor.dataset.tasks["task"], True)
    backend(tmp_path).sandboxes.check_phases(harbor.dataset.tasks["task"], True)  # bwrap can


async def test_links_an_agent_plants_among_its_artifacts_do_not_reach_the_host(make_task, tmp_path):
    """Attack: the agent publishes links to host paths as artifacts; the host folder keeps none."""
    make_task(toml='[verifier]\nenvironment_mode = "separate"\n')
    harbor = backend(tmp_path, artifacts_dir=tmp_path / "artifacts")
    session = await harbor.open(TASK, {})
    try:
        plant = "cd /logs/artifacts && ln -s /etc/passwd passwd && ln -s / root && echo 42 > real"
        await session.call_tool("bash", {"command": plant})
        await session.grade()
    finally:
        await session.close()
    (folder,) = (tmp_path / "artifacts" / "task").iterdir()
    published = folder / "logs" / "artifacts"
    assert sorted(p.name for p in published.iterdir()) == ["real"]


async def test_agent_timeout_multiplier_scales_the_tasks_agent_time_limit(make_task, tmp_path):
    """As Harbor's runner's timeout multiplier: a task timed for a fast model, played by a slow one."""
    make_task(toml="[agent]\ntimeout_sec = 2\n")
    session = await backend(tmp_path, agent_timeout_multiplier=5).open(TASK, {})
    try:
        assert session.limit == 10
        assert session._limit() == "the task's 10 s timeout (2 s x 5)"
    finally:
        await session.close()
    with pytest.raises(EnvError, match="agent_timeout_multiplier must be positive, got 0"):
        backend(tmp_path, agent_timeout_multiplier=0)

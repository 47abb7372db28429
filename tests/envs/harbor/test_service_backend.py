"""HarborBackend and its sessions without the bus: splits, datasets from the cache, the bash
tool, the agent time limit, Dockerfile replay and prepared layers."""

from __future__ import annotations

import json
import shutil

import pytest

from platoon.envs import EnvError, TaskInfo, ToolError
from platoon.envs.harbor import HarborError, load_task
from platoon.envs.harbor.prepare import build_layer, find_layer, image_tag, plan_dockerfile
from platoon.envs.harbor.service import HarborBackend

pytestmark = pytest.mark.anyio
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


def backend(dataset, tmp_path, **kwargs) -> HarborBackend:
    return HarborBackend(dataset, provider="bwrap", cache=str(tmp_path / "cache"), **kwargs)


def topic(name: str) -> str:
    return f'[metadata]\ntopic = "{name}"\n'


async def test_splits_hold_out_whole_groups_and_test_is_eval(make_task, tmp_path):
    for name, group in [("a1", "a"), ("a2", "a"), ("b1", "b"), ("c1", "c")]:
        make_task(name, toml=topic(group))
    harbor = backend(
        tmp_path / "tasks",
        tmp_path,
        index=[{"metadata": ["topic"]}],
        holdout={"fraction": 0.25, "group_by": "topic"},
    )
    assert await harbor.list_splits() == ["train", "eval", "test"]
    train, held, test = [await harbor.list_tasks(s) for s in ("train", "eval", "test")]
    assert [t.task_id for t in held] == [t.task_id for t in test] and held
    assert sorted(t.task_id for t in train + held) == ["a1", "a2", "b1", "c1"]
    assert {t.spec["topic"] for t in train}.isdisjoint({t.spec["topic"] for t in held})
    assert [t.index for t in train] == list(range(len(train)))
    with pytest.raises(EnvError, match="unknown split 'dev'"):
        await harbor.list_tasks("dev")


@pytest.mark.parametrize(
    ("dataset", "message"),
    [
        (
            "hf://org/tasks@abc123",
            r"dataset hf://org/tasks@abc123 is not in the cache .*run `platoon prepare CONFIG` first",
        ),
        ("hf://org/tasks", r"pin a commit, hf://org/tasks@<commit>"),
        ("hf://tasks@abc", r"expected hf://<org>/<name>@<commit>"),
    ],
)
def test_hf_datasets_come_only_from_the_cache(tmp_path, dataset, message):
    with pytest.raises(EnvError, match=message):
        backend(dataset, tmp_path)


def test_a_refused_dataset_is_an_env_error(make_task, tmp_path):
    make_task("bad", test_sh=None)
    with pytest.raises(EnvError, match=r"task bad: tests/test\.sh is missing"):
        backend(tmp_path / "tasks", tmp_path)


@needs_bwrap
async def test_bash_tool_runs_in_the_workdir_and_reports_exit_codes_and_timeouts(make_task, tmp_path):
    make_task(dockerfile='FROM debian\nWORKDIR /app\nENV GREETING="hello there"\n')
    harbor = backend(tmp_path / "tasks", tmp_path)
    session = await harbor.open(TaskInfo(split="train", task_id="task", index=0), {})
    try:
        assert session.instruction == "Write 42 to /app/answer.txt\n"
        assert [t.name for t in session.tools] == ["bash"]
        ran = await session.call_tool("bash", {"command": 'pwd; echo "$GREETING"; echo oops >&2; exit 3'})
        assert ran.output == "/app\nhello there\noops\n[exit code 3]" and not ran.finished
        slow = await session.call_tool("bash", {"command": "sleep 5", "timeout": 0.3})
        assert slow.output == "[timed out after 0.3 s]"
        for arguments, message in [
            ({}, "non-empty `command`"),
            ({"command": "ls", "timeout": -1}, "positive number"),
            ({"command": "ls", "cwd": "/"}, "not cwd"),
        ]:
            with pytest.raises(ToolError, match=message):
                await session.call_tool("bash", arguments)
        with pytest.raises(ToolError, match="unknown tool 'python'"):
            await session.call_tool("python", {"code": "1"})
        await session.call_tool("bash", {"command": "echo 42 > /app/answer.txt"})
        grade = await session.grade()
        assert (grade.reward, grade.rewards, grade.reason) == (1.0, {"reward": 1.0}, None)
        with pytest.raises(ToolError, match="has been graded"):
            await session.call_tool("bash", {"command": "true"})
    finally:
        await session.close()


@needs_bwrap
async def test_a_flood_of_output_is_kept_to_its_head_and_tail(make_task, tmp_path):
    """A command that prints megabytes returns (and the event log stores) what a model can read."""
    make_task()
    session = await backend(tmp_path / "tasks", tmp_path, tool_output_chars=2000).open(
        TaskInfo(split="train", task_id="task", index=0), {}
    )
    try:
        flood = await session.call_tool(
            "bash", {"command": "echo FIRST; yes line | head -c 4000000; echo LAST"}
        )
    finally:
        await session.close()
    text = flood.output
    assert len(text) <= 2000 + len("\n[exit code 0]")
    assert text.startswith("FIRST") and text.endswith("LAST\n[exit code 0]")
    assert "characters of output cut" in text


@needs_bwrap
async def test_agent_time_limit_finishes_the_tool(make_task, tmp_path):
    make_task(toml="[agent]\ntimeout_sec = 0.5\n")
    session = await backend(tmp_path / "tasks", tmp_path).open(
        TaskInfo(split="train", task_id="task", index=0), {}
    )
    try:
        cut = await session.call_tool("bash", {"command": "sleep 10"})
        assert cut.finished and "time limit of 0.5 s is up" in cut.output
        after = await session.call_tool("bash", {"command": "echo late"})
        assert after.finished and "late" not in after.output
    finally:
        await session.close()


@needs_bwrap
@pytest.mark.parametrize(
    ("task_limit", "agent_limit", "said"),
    [(0.5, 60.0, "the task's 0.5 s timeout"), (60, 0.5, "its 0.5 s timeout")],
)
async def test_a_stopped_agent_is_told_which_time_limit_stopped_it(
    make_task, tmp_path, task_limit, agent_limit, said
):
    """The task's `[agent].timeout_sec` or the agent's own `timeout`: whichever fired is named."""
    from platoon.bus.events import AgentProcessRequested

    make_task(toml=f"[agent]\ntimeout_sec = {task_limit}\n")
    session = await backend(tmp_path / "tasks", tmp_path).open(
        TaskInfo(split="train", task_id="task", index=0), {}
    )
    try:
        request = AgentProcessRequested(
            episode_id="e",
            agent_id="a",
            env="harbor",
            payload=json.dumps({"argv": ["sleep", "30"]}),
            timeout=agent_limit,
        )
        exited = await session.run_agent(request)
    finally:
        await session.close()
    assert exited.timed_out and exited.error == said


@needs_bwrap
async def test_forks_are_fresh_sandboxes(make_task, tmp_path):
    make_task()
    session = await backend(tmp_path / "tasks", tmp_path).open(
        TaskInfo(split="train", task_id="task", index=0), {}
    )
    child = await session.fork("fresh")
    try:
        await session.call_tool("bash", {"command": "echo parent > note"})
        seen = await child.call_tool("bash", {"command": "cat note"})
        assert "No such file" in seen.output and seen.output.endswith("[exit code 1]")
        with pytest.raises(EnvError, match="fork only `fresh`"):
            await session.fork("copy")
    finally:
        await child.close()
        await session.close()


@needs_bwrap
async def test_a_prepared_layer_replaces_replaying_the_dockerfile(make_task, tmp_path):
    task_dir = make_task(dockerfile="FROM debian\nWORKDIR /app\nRUN date +%s%N > stamp\n")
    task = load_task(task_dir)
    harbor = backend(tmp_path / "tasks", tmp_path)
    info = TaskInfo(split="train", task_id="task", index=0)

    async def stamp() -> str:
        session = await harbor.open(info, {})
        try:
            return (await session.call_tool("bash", {"command": "cat stamp"})).output
        finally:
            await session.close()

    assert await stamp() != await stamp()  # replayed: RUN ran for each session
    assert find_layer(task, tmp_path / "cache") is None
    layer = await build_layer(task, plan_dockerfile(task), tmp_path / "cache")
    assert find_layer(task, tmp_path / "cache") == layer
    assert json.loads((layer / "layer.json").read_text())["dirs"] == ["/app", "/root"]
    first = await stamp()
    assert first == await stamp() == (layer / "files" / "app" / "stamp").read_text() + "[exit code 0]"


@needs_bwrap
async def test_a_failing_healthcheck_stops_the_sandbox(make_task, tmp_path):
    toml = '[environment.healthcheck]\ncommand = "test -e /app/ready"\ninterval_sec = 0.01\nretries = 1\n'
    make_task(toml=toml)
    state = tmp_path / "state"
    harbor = backend(tmp_path / "tasks", tmp_path, provider_options={"state_dir": str(state)})
    with pytest.raises(EnvError, match="healthcheck 'test -e /app/ready' failed 1 times in a row"):
        await harbor.open(TaskInfo(split="train", task_id="task", index=0), {})
    assert list(state.iterdir()) == []


def test_other_providers_run_the_image_prepare_builds_or_the_tasks_own(make_task, tmp_path):
    built = load_task(make_task("built", dockerfile="FROM a AS build\nFROM b\n"))  # multi-stage is fine
    make_task("prebuilt", toml='[environment]\ndocker_image = "python:3.12-slim"\n', dockerfile=None)
    harbor = HarborBackend(tmp_path / "tasks", provider="docker", cache=str(tmp_path / "cache"))
    assert harbor.sandboxes.sandbox_for(harbor.dataset.tasks["built"])[0].image == image_tag(built)
    assert image_tag(built).startswith("localhost/platoon-harbor:")
    assert harbor.sandboxes.sandbox_for(harbor.dataset.tasks["prebuilt"])[0].image == "python:3.12-slim"


@pytest.mark.parametrize(
    ("dockerfile", "message"),
    [
        ("FROM a AS build\nFROM b\n", "Dockerfile:2: multi-stage builds need a container engine"),
        ("FROM a\nCOPY --from=build /x /y\n", "Dockerfile:2: COPY --from needs a container engine"),
        ("FROM a\nUSER nobody\n", "Dockerfile:2: USER nobody needs a container engine"),
        ("FROM a\nADD https://example.com/x /x\n", "ADD of 'https://example.com/x' needs a container engine"),
        ("FROM a\nCOPY missing.txt /app/\n", "COPY source 'missing.txt' is not in environment/"),
        ("FROM a\nRUN --mount=type=cache,target=/c true\n", "RUN options (--mount=type=cache,target=/c)"),
        ('FROM a\nSHELL ["/bin/sh", "-c"]\n', "Dockerfile:2: SHELL needs a container engine"),
        ("WORKDIR /app\n", "Dockerfile:1: WORKDIR before FROM"),
    ],
)
def test_dockerfiles_that_need_an_engine_say_why(make_task, dockerfile, message):
    with pytest.raises(
        HarborError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
    ):
        plan_dockerfile(load_task(make_task(dockerfile=dockerfile)))


def test_a_simple_dockerfile_becomes_steps(make_task):
    dockerfile = (
        "# comment\nARG VERSION=1.2\nFROM python:${VERSION}-slim\nENV HOME_DIR=/srv DEBUG=1\n"
        'ENV LEGACY a value\nWORKDIR $HOME_DIR\nWORKDIR app\nCOPY ["data.csv", "./"]\n'
        'COPY --chmod=755 bin/ /usr/local/bin/\nRUN echo one \\\n    && echo two\nRUN ["ls", "-l"]\n'
        'CMD ["bash"]\nEXPOSE 80\n'
    )
    task = load_task(
        make_task(dockerfile=dockerfile, files={"environment/data.csv": "a\n", "environment/bin/x": ""})
    )
    plan = plan_dockerfile(task)
    assert plan.base == "python:1.2-slim"
    assert plan.env == {"HOME_DIR": "/srv", "DEBUG": "1", "LEGACY": "a value"}
    assert plan.workdir == "/srv/app"
    assert [(s.kind, s.line, s.target) for s in plan.steps] == [
        ("mkdir", 6, "/srv"),
        ("mkdir", 7, "/srv/app"),
        ("copy", 8, "/srv/app/"),
        ("copy", 9, "/usr/local/bin/"),
        ("run", 10, ""),
        ("run", 12, ""),
    ]
    assert plan.steps[3].chmod == "755" and plan.steps[3].sources[0].endswith("environment/bin/")
    assert plan.steps[4].command == "echo one  && echo two" and plan.steps[4].workdir == "/srv/app"
    assert plan.steps[5].command == "ls -l" and plan.steps[5].env["VERSION"] == "1.2"


@pytest.mark.slow
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # aiodocker runs under asyncio only
async def test_docker_provider_runs_the_image_prepare_built(make_task, tmp_path, podman_url, image):
    from platoon.envs.harbor.prepare import build_image

    dockerfile = (
        f"FROM {image}\nWORKDIR /app\nCOPY question.txt /app/question.txt\nRUN echo built > /app/marker\n"
    )
    task = load_task(make_task(dockerfile=dockerfile, files={"environment/question.txt": "6 7\n"}))
    options = {"url": podman_url, "ulimits": {"nofile": 20000, "nproc": 1000}}
    harbor = HarborBackend(
        tmp_path / "tasks", provider="docker", cache=str(tmp_path / "cache"), provider_options=options
    )
    info = TaskInfo(split="train", task_id="task", index=0)
    if not await _image_exists(podman_url, image_tag(task)):
        with pytest.raises(EnvError, match=r"built by `platoon prepare CONFIG`"):
            await harbor.open(info, {})
    assert await build_image(task, podman_url) == image_tag(task)
    session = await harbor.open(info, {})
    try:
        seen = await session.call_tool("bash", {"command": "cat question.txt marker; echo 42 > answer.txt"})
        assert seen.output == "6 7\nbuilt\n[exit code 0]"
        assert (await session.grade()).reward == 1.0
    finally:
        await session.close()


async def _image_exists(url: str, tag: str | None) -> bool:
    import aiodocker

    docker = aiodocker.Docker(url=url)
    try:
        await docker.images.inspect(tag)
        return True
    except aiodocker.DockerError:
        return False
    finally:
        await docker.close()


def test_a_provider_typo_fails_when_the_backend_is_built(make_task, tmp_path):
    """The site profile keeps the name as written; the backend names the typo before a task runs."""
    make_task("t1")
    with pytest.raises(EnvError, match="provider: unknown sandbox provider 'dockr'; did you mean 'docker'"):
        HarborBackend(tmp_path / "tasks", provider="dockr", cache=str(tmp_path / "cache"))

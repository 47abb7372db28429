"""Real tasks end to end: a scripted agent acts in a sandbox, the task's tests grade it."""

import math
import shutil
import time

import anyio
import pytest

from platoon.envs.harbor import Grade, grade, load_task, parse_rewards, sandbox_spec_for
from platoon.sandbox import SandboxSpec, create_sandbox

pytestmark = pytest.mark.anyio
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


def reward_script(body: str) -> str:
    return f"#!/bin/bash\n{body}\n"


async def run_episode(task_dir, commands, provider="bwrap", logs_dir=None, pass_env=(), **options) -> Grade:
    """The scripted agent: run `commands` within the agent timeout, then grade."""
    task = load_task(task_dir)
    async with create_sandbox(sandbox_spec_for(task, **options.pop("spec", {})), provider, **options) as box:
        with anyio.move_on_after(task.config.agent.timeout_sec):
            for command in commands:
                await box.exec(command)
        return await grade(box, task, logs_dir=logs_dir, pass_env=pass_env)


@needs_bwrap
@pytest.mark.parametrize(("answer", "reward"), [("42", 1.0), ("41", 0.0)])
async def test_right_answer_gets_1_and_wrong_gets_0(make_task, tmp_path, answer, reward):
    logs = tmp_path / "logs"
    got = await run_episode(make_task(), [f"echo {answer} > answer.txt"], logs_dir=logs)
    assert got == Grade({"reward": reward}, reward, None)
    assert (logs / "test-stdout.txt").exists() and (logs / "reward.txt").read_text().strip() == str(
        int(reward)
    )


@needs_bwrap
async def test_agent_timeout_ends_the_agent_and_the_verifier_still_runs(make_task):
    task = make_task(toml="[agent]\ntimeout_sec = 0.5\n")
    began = time.monotonic()
    got = await run_episode(task, ["echo 42 > answer.txt", "sleep 30", "echo 0 > answer.txt"])
    assert got.reward == 1.0 and time.monotonic() - began < 10


@needs_bwrap
async def test_verifier_timeout(make_task, tmp_path):
    task = make_task(toml="[verifier]\ntimeout_sec = 0.5\n", test_sh=reward_script("echo started; sleep 30"))
    began = time.monotonic()
    got = await run_episode(task, [], logs_dir=tmp_path / "logs")
    assert got == Grade({}, None, "verifier timed out after 0.5 s")
    assert time.monotonic() - began < 10
    assert (tmp_path / "logs" / "test-stdout.txt").read_text() == "started\n"


@needs_bwrap
@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("true", Grade({}, None, "the verifier wrote neither reward.json nor reward.txt")),
        ("echo abc > /logs/verifier/reward.txt", Grade({}, None, "reward.txt does not hold a number: 'abc'")),
        (
            "echo inf > /logs/verifier/reward.txt",
            Grade({}, None, "reward.txt holds a non-finite number (inf)"),
        ),
        ("echo '{bad' > /logs/verifier/reward.json", None),
        (
            "echo '{\"reward\": NaN}' > /logs/verifier/reward.json",
            Grade({}, None, "reward.json: 'reward' is not finite (nan)"),
        ),
        ('echo \'{"acc": 0.5, "f1": 1}\' > /logs/verifier/reward.json', None),
        ("echo '{\"acc\": 0.25}' > /logs/verifier/reward.json", Grade({"acc": 0.25}, 0.25)),
        (
            'echo \'{"reward": 1, "acc": 0.5}\' > /logs/verifier/reward.json; echo 0 > /logs/verifier/reward.txt',
            Grade({"reward": 1.0, "acc": 0.5}, 1.0),
        ),
        ("echo 1 > /logs/verifier/reward.txt; exit 3", Grade({"reward": 1.0}, 1.0)),  # exit status ignored
    ],
)
async def test_reward_files(make_task, body, expected):
    got = await run_episode(make_task(test_sh=reward_script(body)), [])
    if expected is not None:
        assert got == expected
    else:
        assert got.reward is None and got.reason.startswith("reward.json")


@needs_bwrap
async def test_planted_files_are_removed_and_verifier_env_and_user_apply(make_task, monkeypatch):
    monkeypatch.setenv("PLATOON_SECRET_FOR_TEST", "s3")
    toml = '[verifier]\nuser = 4321\nenv = { TOKEN = "${PLATOON_SECRET_FOR_TEST}", MODE = "${PLATOON_UNSET:-m}" }\n'
    body = 'echo "$(id -u) $TOKEN $MODE" > /logs/verifier/who; [ "$(id -u) $TOKEN $MODE" = "4321 s3 m" ] && echo 1 > /logs/verifier/reward.txt'
    body = "[ -e /tests/.planted ] && exit 0; " + body
    planted = [
        "mkdir -p /logs/verifier /tests && echo 7 > /logs/verifier/reward.txt && touch /tests/.planted"
    ]
    allowed = ["PLATOON_SECRET_FOR_TEST"]
    got = await run_episode(make_task(toml=toml, test_sh=reward_script(body)), planted, pass_env=allowed)
    assert got == Grade({"reward": 1.0}, 1.0)
    # Not passed by the entry: the task cannot read it, however it names it.
    got = await run_episode(make_task("unpassed", toml=toml), [])
    assert got.reward is None and "service_kwargs.pass_env" in got.reason
    monkeypatch.delenv("PLATOON_SECRET_FOR_TEST")
    got = await run_episode(make_task("again", toml=toml), [], pass_env=allowed)
    assert got.reward is None and "PLATOON_SECRET_FOR_TEST" in got.reason


@needs_bwrap
async def test_tests_are_uploaded_only_at_grading(make_task):
    task = load_task(make_task())
    async with create_sandbox(sandbox_spec_for(task), "bwrap") as box:
        assert (await box.exec("ls /tests | wc -l")).stdout.strip() == "0"
        await box.exec("echo 42 > answer.txt")
        assert (await grade(box, task)).reward == 1.0


@needs_bwrap
async def test_network_is_off_for_tasks_that_do_not_ask(make_task):
    """`network_mode = "public"` gives a way out (a default route), never the host's loopback."""
    import socket

    from platoon.sandbox._netns import SandboxNetwork

    if SandboxNetwork.unavailable():
        pytest.skip(SandboxNetwork.unavailable())
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    body = (
        f"if echo hi > /dev/tcp/127.0.0.1/{port}; then host=10; else host=0; fi; "
        "route=$(awk 'NR > 1 && $2 == \"00000000\" {n=1} END {print n+0}' /proc/net/route); "
        "echo $((host + route)) > /logs/verifier/reward.txt"
    )
    try:
        closed = await run_episode(make_task("closed", test_sh=reward_script(body)), [])
        opened = await run_episode(
            make_task("open", toml='[environment]\nnetwork_mode = "public"\n', test_sh=reward_script(body)),
            [],
        )
    finally:
        server.close()
    assert (closed.reward, opened.reward) == (0.0, 1.0)


async def test_a_broken_sandbox_is_a_failed_grade_not_a_crash(make_task, tmp_path):
    task = load_task(make_task())

    class Broken:
        spec = SandboxSpec()

        async def exec(self, command, **kwargs):
            from platoon.sandbox import ExecResult

            return ExecResult("", "", 0)

        async def upload(self, local, remote):
            from platoon.sandbox import SandboxError

            raise SandboxError("disk full")

    got = await grade(Broken(), task)
    assert got == Grade({}, None, "sandbox failed during grading: disk full")


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("reward.txt", " 0.75\n", Grade({"reward": 0.75}, 0.75)),
        ("reward.txt", "", Grade({}, None, "reward.txt is empty")),
        ("reward.json", "[1]", Grade({}, None, "reward.json must be a non-empty flat object of numbers")),
        ("reward.json", "{}", Grade({}, None, "reward.json must be a non-empty flat object of numbers")),
        ("reward.json", '{"reward": true}', Grade({}, None, "reward.json: 'reward' is not a number")),
        ("reward.json", '{"reward": {"x": 1}}', Grade({}, None, "reward.json: 'reward' is not a number")),
        (
            "reward.json",
            '{"a": 1, "b": 2}',
            Grade({"a": 1.0, "b": 2.0}, None, "reward.json has several values and no 'reward' key"),
        ),
        (
            "reward.json",
            '{"reward": -Infinity}',
            Grade({}, None, "reward.json: 'reward' is not finite (-inf)"),
        ),
    ],
)
def test_parse_rewards(name, text, expected):
    assert parse_rewards(name, text) == expected
    assert all(math.isfinite(v) for v in expected.rewards.values())


@pytest.mark.slow
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize(("answer", "reward"), [("42", 1.0), ("7", 0.0)])
async def test_the_same_through_the_docker_provider(make_task, podman_url, image, answer, reward):
    task = make_task(toml="[environment]\ncpus = 1\nmemory_mb = 256\n")
    got = await run_episode(
        task,
        [f"echo {answer} > answer.txt"],
        provider="docker",
        url=podman_url,
        ulimits={"nofile": 20000, "nproc": 1000},
        spec={"image": image},
    )
    assert got == Grade({"reward": reward}, reward)

"""Every refusal: found before anything starts, with the reason."""

import os

import pytest

from platoon.envs.harbor import HarborError, load_dataset, load_task

COMPOSE_MAIN = "services:\n  main:\n    build: .\n"


def test_a_well_formed_task_loads(make_task):
    task = load_task(
        make_task(
            files={
                "environment/docker-compose.yaml": COMPOSE_MAIN
                + "    volumes:\n      - ./data:/data\n      - cache:/cache\n    cap_add: [NET_RAW]\n"
                "  helper:\n    image: redis\n    env_file: .env\nvolumes:\n  cache: {}\n",
                "environment/data/x": "x",
                "environment/.env": "A=1\n",
            }
        )
    )
    assert task.compose_file.endswith("docker-compose.yaml")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"toml": "schema_version = [\n"}, "task.toml is not valid TOML"),
        ({"instruction": None}, "instruction.md is missing"),
        ({"test_sh": None}, "tests/test.sh is missing"),
        ({"dockerfile": None}, r"needs environment/ or \[environment\].docker_image"),
        (
            {"dockerfile": "FROM x\nCOPY ../secret /s\n"},
            r"Dockerfile:2: COPY source '../secret' leaves the build context",
        ),
        ({"dockerfile": "FROM x\nADD a \\\n  ../../b /b\n"}, r"ADD source '../../b' leaves"),
        ({"dockerfile": "FROM x\nRUN --security=insecure make\n"}, r"RUN --security=insecure is refused"),
    ],
)
def test_missing_or_bad_parts(make_task, kwargs, message):
    with pytest.raises(HarborError, match=message):
        load_task(make_task(**kwargs))


def test_missing_task_toml_and_non_directories(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(HarborError, match=r"task\.toml is missing"):
        load_task(tmp_path / "empty")
    with pytest.raises(HarborError, match="not a task directory"):
        load_task(tmp_path / "nowhere")


def test_non_utf8_instruction(make_task):
    task = make_task()
    (task / "instruction.md").write_bytes(b"\xff\xfe bad")
    with pytest.raises(HarborError, match=r"instruction\.md is not UTF-8"):
        load_task(task)


def test_environment_dir_without_build_files(make_task):
    task = make_task()
    (task / "environment" / "Dockerfile").unlink()
    with pytest.raises(HarborError, match="neither a Dockerfile nor a compose file"):
        load_task(task)


def test_prebuilt_image_needs_no_environment_dir(make_task):
    task = load_task(make_task(dockerfile=None, toml='[environment]\ndocker_image = "python:3.12"\n'))
    assert task.environment_dir is None


@pytest.mark.parametrize(
    ("link", "target"),
    [
        ("tests/passwd", "/etc/passwd"),
        ("tests/up", "../../.."),
        ("solution/x", "../../outside.txt"),
        ("environment/ctx", "/"),
    ],
)
def test_links_escaping_the_task_dir(make_task, link, target):
    task = make_task()
    (task.parent / "outside.txt").write_text("secret")
    (task / link).parent.mkdir(exist_ok=True)
    os.symlink(target, task / link)
    with pytest.raises(HarborError, match=rf"{link} links to .*outside the task directory"):
        load_task(task)


def test_links_inside_the_task_dir_are_fine(make_task):
    task = make_task()
    os.symlink("../tests/test.sh", task / "environment" / "copy.sh")
    os.symlink("tests", task / "tests-link")
    assert load_task(task).name == "task"


def test_special_files(make_task):
    task = make_task()
    os.mkfifo(task / "tests" / "pipe")
    with pytest.raises(HarborError, match="tests/pipe is a special file"):
        load_task(task)


@pytest.mark.parametrize(
    ("service", "message"),
    [
        ("    privileged: true\n", "service 'main' is privileged"),
        ("    network_mode: host\n", "uses the host's network namespace"),
        ("    pid: host\n", "uses the host's pid namespace"),
        ("    ipc: host\n", "uses the host's ipc namespace"),
        ("    devices: ['/dev/kvm:/dev/kvm']\n", "maps host devices"),
        ("    cap_add: [SYS_ADMIN]\n", "adds capabilities SYS_ADMIN"),
        ("    cap_add: [cap_sys_ptrace]\n", "adds capabilities SYS_PTRACE"),
        ("    cap_add: [ALL]\n", "adds capabilities ALL"),
        ("    security_opt: ['seccomp:unconfined']\n", "disables confinement"),
        ("    security_opt: ['apparmor=unconfined']\n", "disables confinement"),
        (
            "    volumes: ['/var/run/docker.sock:/var/run/docker.sock']\n",
            "mounts host path '/var/run/docker.sock'",
        ),
        ("    volumes: ['~/.ssh:/root/.ssh']\n", "mounts host path '~/.ssh'"),
        ("    volumes: ['../../secret:/s']\n", "mounts host path '../../secret'"),
        ("    volumes: [{type: bind, source: /etc, target: /etc}]\n", "mounts host path '/etc'"),
        ("    env_file: ../../.env\n", "reads env_file '../../.env'"),
        ("    env_file: [{path: /etc/environment}]\n", "reads env_file '/etc/environment'"),
    ],
)
def test_compose_services_reaching_into_the_host(make_task, service, message):
    task = make_task(files={"environment/docker-compose.yaml": COMPOSE_MAIN + service})
    with pytest.raises(HarborError, match=message):
        load_task(task)


@pytest.mark.parametrize(
    ("compose", "message"),
    [
        ("services:\n  main:\n    build: ../..\n", "builds from '../..'"),
        ("services:\n  main:\n    build: {context: ., dockerfile: ../../Dockerfile}\n", "Dockerfile outside"),
        ("services:\n  other:\n    image: x\n", "no service named 'main'"),
        ("services: [\n", "not valid YAML"),
        ("version: '3'\n", "no services mapping"),
        (
            COMPOSE_MAIN + "volumes:\n  data:\n    driver_opts: {type: none, o: bind, device: /home}\n",
            "binds host",
        ),
    ],
)
def test_compose_files_themselves(make_task, compose, message):
    task = make_task(files={"environment/compose.yaml": compose})
    with pytest.raises(HarborError, match=message):
        load_task(task)


def test_one_refused_task_refuses_the_dataset(tmp_path, make_task):
    make_task("good")
    bad = make_task("bad")
    os.symlink("/etc/shadow", bad / "tests" / "shadow")
    with pytest.raises(HarborError, match="task bad: tests/shadow links to '/etc/shadow'"):
        load_dataset(tmp_path / "tasks")

"""The docker provider against a real Docker Engine API: podman's service, started here."""

import time

import anyio
import pytest

from platoon.sandbox import SandboxError, SandboxSpec, create_sandbox
from platoon.sandbox.docker import DockerSandbox

pytestmark = pytest.mark.anyio

# podman here needs rlimits within the host's hard limits (see reference/machine.md).
PODMAN_ULIMITS = {"nofile": 20000, "nproc": 1000}


@pytest.fixture
def anyio_backend():
    return "asyncio"  # aiodocker is asyncio only


def box(url: str, **spec) -> DockerSandbox:
    return create_sandbox(SandboxSpec(**spec), provider="docker", url=url, ulimits=PODMAN_ULIMITS)


@pytest.mark.slow
async def test_exec_env_cwd_user_and_persistence(podman_url, image):
    async with box(podman_url, image=image, env={"A": "spec"}) as sandbox:
        result = await sandbox.exec('echo "$A $B"; pwd; echo err >&2; exit 4', env={"B": "call"})
        assert (result.stdout, result.stderr, result.return_code) == ("spec call\n/app\n", "err\n", 4)
        assert (await sandbox.exec("echo 42 > answer && pwd", cwd="/tmp")).stdout == "/tmp\n"
        assert (await sandbox.exec("cat /tmp/answer")).stdout == "42\n"
        assert (await sandbox.exec("id -u", user="nobody")).stdout == "65534\n"


@pytest.mark.slow
async def test_timeout_ends_the_command_and_its_children(podman_url, image):
    async with box(podman_url, image=image) as sandbox:
        began = time.monotonic()
        result = await sandbox.exec("sleep 60 & sleep 60; echo never", timeout=0.5)
        assert result.timed_out and "never" not in result.stdout
        assert time.monotonic() - began < 8
        with anyio.fail_after(10):  # killed at once; gone once the kernel has reaped them
            while "sleep 60" in (await sandbox.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '")).stdout:  # noqa: ASYNC110
                await anyio.sleep(0.05)
        assert (await sandbox.exec("exit 124", timeout=5)).timed_out is False


@pytest.mark.slow
async def test_upload_and_download(podman_url, image, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "test.sh").write_text("#!/bin/bash\necho ok\n")
    (src / "test.sh").chmod(0o755)
    (tmp_path / "f.txt").write_text("file")
    async with box(podman_url, image=image) as sandbox:
        await sandbox.upload(src, "/tests")
        await sandbox.upload(tmp_path / "f.txt", "/app/x/f.txt")
        assert (await sandbox.exec("/tests/test.sh; cat /app/x/f.txt")).stdout == "ok\nfile"
        await sandbox.exec("mkdir -p /out && echo r > /out/r && ln -s /etc/passwd /out/escape")
        await sandbox.download("/out", tmp_path / "out")
        assert (tmp_path / "out" / "r").read_text() == "r\n"
        assert not (tmp_path / "out" / "escape").exists()
        await sandbox.download("/app/x/f.txt", tmp_path / "back.txt")
        assert (tmp_path / "back.txt").read_text() == "file"
        with pytest.raises(SandboxError, match="download of /nope failed"):
            await sandbox.download("/nope", tmp_path / "nope")


@pytest.mark.slow
@pytest.mark.parametrize("network", [False, True])
async def test_network_mode(podman_url, image, network):
    async with box(podman_url, image=image, network=network) as sandbox:
        interfaces = (await sandbox.exec("grep -o '^ *[a-z0-9]*:' /proc/net/dev | tr -d ' :'")).stdout.split()
    if network:
        assert "lo" in interfaces and len(interfaces) > 1
    else:
        assert interfaces == ["lo"]


async def test_memory_and_cpus_are_applied(podman_url, image):
    async with box(podman_url, image=image, memory_mb=256, cpus=1) as sandbox:
        limit = await sandbox.exec(
            "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
        )
    assert limit.stdout.strip() == str(256 * 2**20)


@pytest.mark.slow
async def test_errors_are_sandbox_errors(podman_url, image):
    with pytest.raises(SandboxError, match=r"needs spec\.image"):
        box(podman_url, rootfs="/")
    with pytest.raises(SandboxError, match="not present and pull=False"):
        async with DockerSandbox(SandboxSpec(image="localhost/platoon-absent:1"), url=podman_url, pull=False):
            pass
    with pytest.raises(SandboxError, match="could not be pulled"):
        async with DockerSandbox(SandboxSpec(image="localhost/platoon-absent:1"), url=podman_url):
            pass
    sandbox = box(podman_url, image=image)
    with pytest.raises(SandboxError, match="not started"):
        await sandbox.exec("true")


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_refuses_to_run_under_trio(image):
    with pytest.raises(SandboxError, match="asyncio only"):
        async with DockerSandbox(SandboxSpec(image=image)):
            pass

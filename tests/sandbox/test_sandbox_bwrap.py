import os
import secrets
import shutil
import socket
import threading
import time
from pathlib import Path

import anyio
import pytest

from platoon.sandbox import Mount, Sandbox, SandboxError, SandboxSpec, create_sandbox
from platoon.sandbox._netns import SandboxNetwork
from platoon.sandbox.bwrap import BwrapSandbox

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
]


async def test_exec_reports_output_status_and_runs_in_the_workdir():
    async with create_sandbox(SandboxSpec(), provider="bwrap") as box:
        assert isinstance(box, Sandbox)
        result = await box.exec("echo out; echo err >&2; pwd; exit 3")
        assert (result.stdout, result.stderr, result.return_code, result.timed_out) == (
            "out\n/app\n",
            "err\n",
            3,
            False,
        )
        assert not result.ok
        assert (await box.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"


async def test_env_is_clean_and_layered(monkeypatch):
    monkeypatch.setenv("PLATOON_HOST_SECRET", "leak")
    async with BwrapSandbox(SandboxSpec(env={"A": "spec", "B": "spec"})) as box:
        result = await box.exec('echo "$A $B ${PLATOON_HOST_SECRET:-none} $HOME"', env={"B": "call"})
        assert result.stdout == "spec call none /root\n"


async def test_files_persist_between_commands_and_the_host_base_is_read_only():
    async with BwrapSandbox(SandboxSpec()) as box:
        assert (await box.exec("echo 42 > answer.txt && mkdir -p /tmp/t && echo t > /tmp/t/f")).ok
        assert (await box.exec("cat /app/answer.txt /tmp/t/f")).stdout == "42\nt\n"
        denied = await box.exec("touch /usr/platoon-should-not-exist")
        assert denied.return_code != 0
        assert not await anyio.Path("/usr/platoon-should-not-exist").exists()
        assert (await box.exec("test -e /work || test -e /home/platoon; echo $?")).stdout == "1\n"


def _sleepers(tag: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if cmdline == f"sleep\0{tag}\0".encode():
            found.append(int(pid))
    return found


async def test_timeout_kills_the_whole_process_group():
    tag = f"61.{secrets.randbelow(10**9):09d}"  # this test's sleepers, not another worker's
    async with BwrapSandbox(SandboxSpec()) as box:
        began = time.monotonic()
        result = await box.exec(f"sleep {tag} & sleep {tag}; echo never", timeout=0.5)
        assert result.timed_out and result.return_code == 137 and "never" not in result.stdout
        assert time.monotonic() - began < 5
        with anyio.fail_after(10):  # killed at once; gone once the kernel has reaped them
            while _sleepers(tag):  # noqa: ASYNC110 - another process's state
                await anyio.sleep(0.05)


async def test_upload_and_download_files_and_directories(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "data.txt").write_text("data")
    (src / "run.sh").write_text("#!/bin/bash\necho ran\n")
    (src / "run.sh").chmod(0o755)
    (tmp_path / "one.txt").write_text("one")
    async with BwrapSandbox(SandboxSpec()) as box:
        await box.upload(src, "/tests")
        await box.upload(tmp_path / "one.txt", "/app/deep/one.txt")
        result = await box.exec("/tests/run.sh && cat /tests/sub/data.txt /app/deep/one.txt")
        assert result.stdout == "ran\ndataone"
        await box.exec(
            "mkdir -p /app/out/d && echo r > /app/out/d/r.txt && ln -s /etc/passwd /app/out/escape"
        )
        await box.download("/app/out", tmp_path / "out")
        assert (tmp_path / "out" / "d" / "r.txt").read_text() == "r\n"
        assert not (tmp_path / "out" / "escape").exists()  # links out of the tree stay behind
        await box.download("/app/deep/one.txt", tmp_path / "copy.txt")
        assert (tmp_path / "copy.txt").read_text() == "one"
        with pytest.raises(SandboxError, match="download of /app/missing failed"):
            await box.download("/app/missing", tmp_path / "missing")
        with pytest.raises(SandboxError, match="does not exist"):
            await box.upload(tmp_path / "nope", "/app/nope")
        with pytest.raises(SandboxError, match="absolute"):
            await box.upload(tmp_path / "one.txt", "../escape")


async def test_user_maps_names_and_ids():
    async with BwrapSandbox(SandboxSpec()) as box:
        assert (await box.exec("id -u", user="nobody")).stdout == "65534\n"
        assert (await box.exec("id -u; id -g", user="1234:99")).stdout == "1234\n99\n"
        with pytest.raises(SandboxError, match="not in the sandbox's /etc/passwd"):
            await box.exec("true", user="no-such-user-here")


class _Listener:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_server((host, 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


@pytest.mark.parametrize("network", [False, True])
async def test_the_host_loopback_is_out_of_reach_with_or_without_network(network):
    if network and SandboxNetwork.unavailable():
        pytest.skip(SandboxNetwork.unavailable())
    listener = _Listener()
    try:
        async with BwrapSandbox(SandboxSpec(network=network)) as box:
            direct = await box.exec(f"echo hi > /dev/tcp/127.0.0.1/{listener.port}")
            # slirp4netns's gateway address is where the host's loopback would show through.
            via_gateway = await box.exec(f"echo hi > /dev/tcp/10.0.2.2/{listener.port}")
            routes = await box.exec("cat /proc/net/route")
        assert not direct.ok and not via_gateway.ok
        assert listener.accepted == 0
        # With network on the sandbox has a way out: a default route on its own interface.
        has_default = any(line.split()[1] == "00000000" for line in routes.stdout.splitlines()[1:])
        assert has_default is network
    finally:
        listener.sock.close()


def _host_addresses() -> list[str]:
    """This machine's own IPv4 addresses beyond loopback, as its interfaces list them."""
    import json
    import subprocess

    shown = subprocess.run(["ip", "-4", "-j", "addr", "show"], capture_output=True, text=True, check=True)
    return [
        a["local"]
        for link in json.loads(shown.stdout)
        for a in link.get("addr_info", [])
        if not a["local"].startswith("127.")
    ]


async def test_a_sandbox_with_network_cannot_reach_the_host_through_its_own_addresses():
    """A service bound to 0.0.0.0 (a bare `nats-server -js`) listens on the host's own addresses
    too, and slirp4netns would carry a connection to one of them back to the host."""
    if SandboxNetwork.unavailable():
        pytest.skip(SandboxNetwork.unavailable())
    if shutil.which("ip") is None or not _host_addresses():
        pytest.skip("no `ip` command, or no address beyond loopback to try")
    listener = _Listener("0.0.0.0")  # nosec B104 # the service the sandbox must not reach
    try:
        async with BwrapSandbox(SandboxSpec(network=True)) as box:
            # root inside is root of a user namespace only: it cannot lift the block
            await box.exec("ip route flush table main; ip route flush table local")
            tried = {
                address: await box.exec(f"timeout 5 bash -c 'echo hi > /dev/tcp/{address}/{listener.port}'")
                for address in _host_addresses()
            }
            routes = await box.exec("cat /proc/net/route")
        assert listener.accepted == 0
        assert not any(result.ok for result in tried.values()), tried
        assert any(
            line.split()[1] == "00000000" for line in routes.stdout.splitlines()[1:]
        )  # still a way out
    finally:
        listener.sock.close()


async def test_resources_become_cgroup_caps_and_cpu_affinity():
    async with BwrapSandbox(SandboxSpec(cpus=1, memory_mb=300)) as box:
        assert (await box.exec("nproc")).stdout == "1\n"
        small = await box.exec("python3 -c 'x = bytearray(100 * 2**20)'")
        big = await box.exec("python3 -c 'x = bytearray(600 * 2**20)'")
        assert small.ok and not big.ok


async def test_rootfs_copy_is_private_and_writable(rootfs):
    async with (
        BwrapSandbox(SandboxSpec(rootfs=str(rootfs))) as a,
        BwrapSandbox(SandboxSpec(rootfs=str(rootfs))) as b,
    ):
        assert (await a.exec("echo mine > /usr/bin/marker && cat /usr/bin/marker")).stdout == "mine\n"
        assert (await b.exec("test -e /usr/bin/marker; echo $?")).stdout == "1\n"
    assert not (rootfs / "usr/bin/marker").exists()


async def test_rootfs_read_only_base_keeps_image_content_in_writable_dirs(rootfs, tmp_path):
    mount_src = tmp_path / "data"
    mount_src.mkdir()
    (mount_src / "x").write_text("mounted")
    spec = SandboxSpec(rootfs=str(rootfs), mounts=(Mount(source=str(mount_src), target="/data"),))
    async with BwrapSandbox(spec, copy_rootfs=False, state_dir=tmp_path / "state") as box:
        assert (await box.exec("touch /usr/bin/x")).return_code != 0
        assert (await box.exec("cat /data/x && echo ok > /app/f && cat /app/f")).stdout == "mountedok\n"
        assert (await box.exec("echo no > /data/y")).return_code != 0
        assert len(list((tmp_path / "state").iterdir())) == 1
    assert list((tmp_path / "state").iterdir()) == []  # stop removes the sandbox's state


async def test_output_is_capped():
    async with BwrapSandbox(SandboxSpec(), output_limit=1000) as box:
        result = await box.exec("head -c 5000 /dev/zero | tr '\\0' a")
        assert result.stdout.startswith("a" * 1000)
        assert "4000 more bytes of output dropped" in result.stdout


async def test_misuse_is_a_sandbox_error(tmp_path):
    box = BwrapSandbox(SandboxSpec())
    with pytest.raises(SandboxError, match="not started"):
        await box.exec("true")
    with pytest.raises(SandboxError, match="absolute"):
        SandboxSpec(workdir="app")
    with pytest.raises(SandboxError, match="positive"):
        SandboxSpec(cpus=0)
    with pytest.raises(SandboxError, match="does not look like a root filesystem"):
        async with BwrapSandbox(SandboxSpec(rootfs=str(tmp_path))):
            pass
    with pytest.raises(SandboxError, match="not installed"):
        async with BwrapSandbox(SandboxSpec(), bwrap="no-such-bwrap"):
            pass
    async with BwrapSandbox(SandboxSpec()) as box:
        with pytest.raises(SandboxError, match="timeout must be positive"):
            await box.exec("true", timeout=0)
    with pytest.raises(SandboxError, match="not started"):
        await box.exec("true")


async def test_eight_sandboxes_run_concurrently():
    results = []

    async def one(i: int) -> None:
        async with BwrapSandbox(SandboxSpec()) as box:
            await box.exec(f"echo {i} > n")
            results.append((await box.exec("cat n")).stdout)

    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(one, i)
    assert sorted(results) == sorted(f"{i}\n" for i in range(8))


async def test_one_command_can_run_without_the_sandboxs_network():
    if SandboxNetwork.unavailable():
        pytest.skip(SandboxNetwork.unavailable())
    route = "awk 'NR > 1 && $2 == \"00000000\"' /proc/net/route | grep -c ."
    async with BwrapSandbox(SandboxSpec(network=True)) as box:
        online = await box.exec(route)
        offline = await box.exec(route, offline=True)
        await box.exec("echo kept > /tmp/f", offline=True)
        after = await box.exec("cat /tmp/f; " + route)
    assert (online.stdout, offline.stdout) == ("1\n", "0\n")
    assert after.stdout == "kept\n1\n"  # the same files; the network back for the next command

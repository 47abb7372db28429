"""What task code inside a bubblewrap sandbox tries, and must not get (issue: trust boundaries)."""

import shutil

import pytest

from platoon.sandbox import Mount, SandboxSpec
from platoon.sandbox._limits import make_cgroup
from platoon.sandbox.bwrap import BwrapSandbox

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed"),
]

SECRET = "tinker-secret-do-not-leak"


async def test_no_process_in_the_sandbox_holds_the_hosts_environment(monkeypatch):
    monkeypatch.setenv("TINKER_API_KEY", SECRET)
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    async with BwrapSandbox(SandboxSpec()) as box:
        environ = await box.exec("cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline | tr '\\0' '\\n'")
        everything = await box.exec("env; cat /proc/1/environ")
    assert environ.ok
    assert SECRET not in environ.stdout + everything.stdout
    assert "PLATOON_CGROUPS" not in environ.stdout


async def test_host_secrets_and_private_places_are_not_there():
    async with BwrapSandbox(SandboxSpec()) as box:
        for path in (
            "/etc/shadow",
            "/etc/gshadow",
            "/etc/sudoers",
            "/etc/ssh",
            "/etc/pip.conf",
            "/etc/npmrc",
        ):
            assert (await box.exec(f"test -e {path}")).return_code == 1, path
        for path in ("/opt", "/var/lib", "/var/log", "/home", "/root/.pyenv", "/work"):
            assert (await box.exec(f"test -e {path}")).return_code == 1, path
        # What programs need is still there.
        assert (await box.exec("python3 -c 'print(1)' && id -un && test -d /etc/ssl")).stdout == "1\nroot\n"


async def test_the_sandbox_sees_only_its_own_processes():
    async with BwrapSandbox(SandboxSpec()) as box:
        result = await box.exec("ls -d /proc/[0-9]* | wc -l")
    assert int(result.stdout) < 10


async def test_root_inside_is_root_of_a_user_namespace_only():
    async with BwrapSandbox(SandboxSpec()) as box:
        uid_map = (await box.exec("cat /proc/self/uid_map")).stdout.split()
        # A host-wide knob that needs CAP_SYS_ADMIN over the host, not over a namespace.
        module = await box.exec("echo 1 > /proc/sys/vm/drop_caches")
    assert uid_map[:2] == ["0", "0"] and uid_map[2] != "4294967295"  # a one-id map, not the host's
    assert not module.ok


BOMB = """
import subprocess
started = []
try:
    for _ in range(100):
        started.append(subprocess.Popen(["sleep", "30"]))
except OSError as exc:
    print("capped", len(started), exc.errno)
"""


async def test_a_fork_bomb_hits_the_pids_cap(tmp_path):
    probe = make_cgroup(8, None)
    if probe is None:
        pytest.skip("no cgroup can be made here; the pids cap falls back to RLIMIT_NPROC")
    probe.remove()
    (tmp_path / "bomb.py").write_text(BOMB)
    spec = SandboxSpec(pids=32, mounts=(Mount(source=str(tmp_path), target="/bomb"),))
    async with BwrapSandbox(spec) as box:
        assert box._cgroup is not None
        cgroups = list(box._cgroup.dirs)  # this sandbox's (other tests' sandboxes run beside it)
        assert all(path.exists() for path in cgroups)
        result = await box.exec("python3 /bomb/bomb.py", timeout=60)
        after_bomb = await box.exec("echo still here")
    count = int(result.stdout.split()[1])
    assert result.stdout.startswith("capped") and count < 32
    assert after_bomb.stdout == "still here\n"
    assert not any(path.exists() for path in cgroups)  # the cgroup goes with the sandbox

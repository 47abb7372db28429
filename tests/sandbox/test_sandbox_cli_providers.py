"""apptainer/singularity and enroot cannot be installed here: a fake binary on PATH
records the exact argv and runs the in-container command locally."""

import json
import os
import sys
import textwrap

import anyio
import pytest

from platoon.sandbox import Mount, SandboxError, SandboxSpec, create_sandbox

pytestmark = pytest.mark.anyio

FAKE = textwrap.dedent(
    """\
    #!{python}
    import json, os, subprocess, sys
    argv = sys.argv[:]
    argv[0] = os.path.basename(argv[0])
    with open(os.environ["FAKE_LOG"], "a") as log:
        log.write(json.dumps(argv) + "\\n")
    args = argv[1:]
    if args[0] == "exec":  # apptainer exec [opts] instance://NAME bash -c CMD
        at = next(i for i, a in enumerate(args) if a.startswith("instance://"))
        opts, command = args[1:at], args[at + 1:]
        cwd = opts[opts.index("--pwd") + 1]
    elif args[0] == "start":  # enroot start [opts] NAME bash -c CMD
        at = args.index("bash")
        opts, command, cwd = args[1:at - 1], args[at:], None
    else:
        sys.exit(int(os.environ.get("FAKE_FAIL", "0")))
    env = dict(os.environ)
    env.update(o.split("=", 1) for o, flag in zip(opts[1:], opts) if flag == "--env")
    sys.exit(subprocess.run(command, cwd=cwd if cwd and os.path.isdir(cwd) else None, env=env).returncode)
    """
)


@pytest.fixture
def fake_bin(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("apptainer", "singularity", "enroot"):
        path = bindir / name
        path.write_text(FAKE.format(python=sys.executable))
        path.chmod(0o755)
    log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(log))

    def calls() -> list[list[str]]:
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return calls


async def test_apptainer_argv_and_local_round_trip(fake_bin, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    spec = SandboxSpec(
        image="ubuntu:24.04",
        workdir=str(work),
        cpus=2,
        memory_mb=1024,
        env={"A": "1"},
        mounts=(
            Mount(source="/data", target="/data"),
            Mount(source="/scratch", target="/s", read_only=False),
        ),
    )
    box = create_sandbox(spec, provider="apptainer", fakeroot=True)
    async with box:
        result = await box.exec('echo "$A $B"; pwd', env={"B": "2"})
        assert result.stdout == f"1 2\n{work}\n"
        (tmp_path / "in.txt").write_text("payload")
        await box.upload(tmp_path / "in.txt", str(work / "sub" / "in.txt"))
        await box.download(str(work / "sub"), tmp_path / "back")
        assert (tmp_path / "back" / "in.txt").read_text() == "payload"
        with pytest.raises(SandboxError, match="cannot run commands as user 'alice'"):
            await box.exec("true", user="alice")
    calls = fake_bin()
    assert calls[0] == [
        "apptainer", "instance", "start", "--containall", "--writable-tmpfs", "--fakeroot",
        "--net", "--network", "none", "--cpus", "2", "--memory", "1024M",
        "-B", "/data:/data:ro", "-B", "/scratch:/s",
        "docker://ubuntu:24.04", box.name,
    ]  # fmt: skip
    assert calls[2] == [
        "apptainer", "exec", "--cleanenv", "--pwd", str(work), "--env", "A=1", "--env", "B=2",
        f"instance://{box.name}", "bash", "-c", 'echo "$A $B"; pwd',
    ]  # fmt: skip
    assert calls[-1] == ["apptainer", "instance", "stop", box.name]


async def test_singularity_uses_its_own_binary_and_keeps_network_when_asked(fake_bin, tmp_path):
    box = create_sandbox(
        SandboxSpec(image=str(tmp_path / "x.sif"), network=True, workdir=str(tmp_path)), "singularity"
    )
    async with box:
        assert (await box.exec("echo hi")).stdout == "hi\n"
    start = fake_bin()[0]
    assert start[:5] == ["singularity", "instance", "start", "--containall", "--writable-tmpfs"]
    assert "--network" not in start and start[-2] == str(tmp_path / "x.sif")


async def test_apptainer_start_failure_is_a_sandbox_error(fake_bin, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "1")
    with pytest.raises(SandboxError, match="instance start failed"):
        async with create_sandbox(SandboxSpec(image="docker://x"), "apptainer"):
            pass


async def test_enroot_imports_creates_starts_and_removes(fake_bin, tmp_path):
    spec = SandboxSpec(
        image="ubuntu:24.04",
        network=True,
        workdir=str(tmp_path),
        env={"A": "1"},
        mounts=(Mount(source="/d", target="/d"),),
    )
    box = create_sandbox(spec, provider="enroot", state_dir=tmp_path)
    async with box:
        result = await box.exec('echo "$A"; pwd')
        assert result.stdout == f"1\n{tmp_path}\n"
        with pytest.raises(SandboxError, match="cannot run commands as user 'bob'"):
            await box.exec("true", user="bob")
    calls = fake_bin()
    squashfs = calls[0][3]
    assert calls[0] == ["enroot", "import", "-o", squashfs, "docker://ubuntu:24.04"]
    assert calls[1] == ["enroot", "create", "--name", box.name, squashfs]
    assert calls[3] == [
        "enroot", "start", "--root", "--rw", "--mount", "/d /d none x-create=auto,rbind,ro", "--env", "A=1",
        box.name, "bash", "-c", f"cd -- {tmp_path} || exit 1\necho \"$A\"; pwd",
    ]  # fmt: skip
    assert calls[-1] == ["enroot", "remove", "--force", box.name]
    assert not await anyio.Path(squashfs).parent.exists()


async def test_enroot_uses_a_squashfs_directly(fake_bin, tmp_path):
    async with create_sandbox(
        SandboxSpec(image="/img/u.sqsh", network=True, workdir=str(tmp_path)), "enroot"
    ) as box:
        pass
    assert fake_bin()[0] == ["enroot", "create", "--name", box.name, "/img/u.sqsh"]


async def test_enroot_refuses_a_sandbox_without_network(fake_bin):
    with pytest.raises(SandboxError, match="shares the host network"):
        async with create_sandbox(SandboxSpec(image="ubuntu"), "enroot"):
            pass
    assert fake_bin() == []


async def test_missing_binary_is_a_sandbox_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SandboxError, match="apptainer is not installed"):
        async with create_sandbox(SandboxSpec(image="x"), "apptainer"):
            pass

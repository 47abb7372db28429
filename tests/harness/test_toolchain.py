"""Toolchains that name a Python version: the interpreter is found (the site's first), a missing
one is one clear line, and a venv on an interpreter outside the sandbox's base runs in a sandbox
that is shown that interpreter's installation, read-only."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from platoon.cli import main
from platoon.harness import toolchain
from platoon.harness.toolchain import Toolchain, build_toolchain, find_python, toolchain_interpreter
from platoon.sandbox import SandboxSpec, create_sandbox
from platoon.sandbox.agent import run_agent

HERE = f"{sys.version_info.major}.{sys.version_info.minor}"


def test_the_interpreter_of_a_version_is_found_and_the_sites_comes_first(tmp_path):
    found = find_python(HERE)
    assert found is not None
    interpreter, prefix = found
    assert Path(interpreter).exists() and Path(prefix).is_dir()
    # A named interpreter of another version is passed over; one of the version comes first.
    other = shutil.which("python3") or sys.executable
    link = tmp_path / f"python{HERE}"
    link.symlink_to(sys.executable)
    assert find_python(HERE, [str(tmp_path / "missing"), str(link)]) == (str(link), sys.base_prefix)
    assert find_python("3.99", [other]) is None
    assert Toolchain(python="3.12").version == "3.12" and Toolchain().version is None


def _install_fails(tmp_path, monkeypatch, capsys, name: str, extra: str = "") -> str:
    """`platoon harness install` of a pip toolchain named `name` (with `extra` lines under
    [toolchain]), in a site cache of its own: it fails, and says one line, returned."""
    (tmp_path / "site.yaml").write_text(f"cache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    spec = tmp_path / f"{name}.toml"
    spec.write_text(f'name = "{name}"\ncommand = ["x"]\n[toolchain]\npip = ["six==1.16.0"]\n{extra}')
    assert main(["harness", "install", str(spec)]) == 1
    [err] = capsys.readouterr().err.splitlines()
    return err


def test_a_toolchain_needing_a_python_there_is_not_is_one_clear_line(tmp_path, monkeypatch, capsys):
    err = _install_fails(tmp_path, monkeypatch, capsys, "future", 'python = "3.99"\n')
    assert err == (
        "platoon: error: harness 'future': its toolchain did not build: it needs Python 3.99 and there is "
        "none: name one in the site profile (pythons: [/path/to/python3.99]) or install one (pyenv, uv, apt)"
    )


def test_a_toolchain_without_bubblewrap_is_one_clear_line_and_nothing_is_written(
    tmp_path, monkeypatch, capsys
):
    """Without bwrap the installers would write into the host's mount point, shared by every
    toolchain (a machine without it once built five agents into one folder there)."""
    which = shutil.which
    monkeypatch.setattr(
        toolchain.shutil, "which", lambda name, *a, **k: None if name == "bwrap" else which(name, *a, **k)
    )
    err = _install_fails(tmp_path, monkeypatch, capsys, "plain")
    assert err == (
        "platoon: error: harness 'plain': its toolchain did not build: building it needs bubblewrap, which "
        f"shows the toolchain at {toolchain.MOUNT_POINT} while it is installed: install it (apt-get install "
        "bubblewrap)"
    )
    assert not [p for p in (tmp_path / "cache" / "toolchains").iterdir() if not p.name.endswith(".lock")]


OTHER = next((v for v in ("3.12", "3.13") if v != HERE and find_python(v) is not None), None)


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")
@pytest.mark.skipif(OTHER is None, reason="no Python 3.12 or 3.13 besides this one")
async def test_a_venv_on_another_python_runs_in_the_sandbox(tmp_path):
    assert OTHER is not None
    toolchain = Toolchain(pip=["six==1.16.0"], python=OTHER)
    folder = await build_toolchain(toolchain, tmp_path / "cache")
    interpreter = toolchain_interpreter(folder)
    marker = json.loads((folder / ".platoon-toolchain.json").read_text())
    assert marker["python"] == OTHER and Path(marker["interpreter"]).name == f"python{OTHER}"
    probe = "import json, sys, six; print(json.dumps([sys.version_info[:2], six.__version__]))"
    async with create_sandbox(SandboxSpec(workdir="/work"), "bwrap") as box:
        done = await run_agent(
            box,
            ["/opt/platoon/toolchain/bin/python", "-c", probe],
            env={"PATH": "/usr/bin:/bin"},
            toolchain=folder,
            interpreter=interpreter,
        )
        # Without the interpreter's folder the venv's python points nowhere (unless it is the host's /usr).
        blind = await run_agent(
            box, ["/opt/platoon/toolchain/bin/python", "-c", probe], env={}, toolchain=folder
        )
    assert done.return_code == 0, done.stderr
    assert json.loads(done.stdout) == [[int(p) for p in OTHER.split(".")], "1.16.0"]
    if interpreter is not None:
        assert blind.return_code != 0

"""The verifiers worker's venv: which verifiers version it takes (named, or what the packages
require), refused in one line outside what the worker speaks, built before any request's clock
runs, and a build that fails says pip's conclusion in one line and where its whole log is. pip
runs for real, offline, on small wheels written here."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from platoon.bus import Bus, running
from platoon.bus.events import TasksListed, TasksRequested
from platoon.envs import EnvService
from platoon.envs.verifiers import VerifiersBackend
from platoon.envs.verifiers.venv import ToolchainError, resolve_version
from platoon.harness.toolchain import find_python


def wheel(folder: Path, name: str, version: str, requires: list[str] = ()) -> None:
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(folder / f"{dist}-{version}-py3-none-any.whl", "w") as archive:
        archive.writestr(f"{dist}/__init__.py", "")
        archive.writestr(f"{info}/METADATA", metadata)
        archive.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{info}/RECORD", "")


@pytest.fixture
def index(tmp_path, monkeypatch) -> Path:
    """A package index of a few wheels, and pip pointed at it alone."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    for version in ("0.1.5", "0.2.0", "0.2.1", "0.4.0"):
        wheel(folder, "verifiers", version)
    wheel(folder, "uv", "0.13.9")
    wheel(folder, "platoon-test-old", "1.0", ["verifiers<0.2"])
    wheel(folder, "platoon-test-mid", "1.0", ["verifiers>=0.1.9,<0.3", "verifiers>=0.2; extra == 'new'"])
    wheel(folder, "platoon-test-ancient", "1.0", ["verifiers<0.1.6"])
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


needs_python = pytest.mark.skipif(find_python("3.12") is None, reason="no Python 3.12 here")
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


@pytest.mark.anyio
async def test_a_named_version_outside_the_supported_range_is_refused_in_one_line(tmp_path):
    with pytest.raises(ToolchainError) as caught:
        await resolve_version([], tmp_path, named="0.1.3")
    assert str(caught.value) == (
        "verifiers 0.1.3 (named in service_kwargs.verifiers) is not supported: "
        "platoon speaks verifiers 0.1.8 to 0.4.x (<0.5,>=0.1.8)"
    )


@pytest.mark.anyio
async def test_the_version_an_environment_being_written_requires_is_read_from_its_pyproject(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "e"\ndependencies = ["verifiers>=0.1.9,<0.2"]\n'
    )
    assert await resolve_version([], tmp_path / "cache", paths=[tmp_path]) == "0.1.14"
    assert await resolve_version([], tmp_path / "cache") == "0.4.0"  # none required: the newest


@pytest.mark.slow
@needs_python
@pytest.mark.anyio
async def test_the_version_is_the_newest_the_packages_metadata_allows_and_unsupported_ones_are_refused(
    index, tmp_path
):
    cache = tmp_path / "cache"
    assert await resolve_version(["platoon-test-old==1.0"], cache) == "0.1.14"
    assert await resolve_version(["platoon-test-mid[new]==1.0"], cache) == "0.2.1"
    with pytest.raises(ToolchainError) as caught:
        await resolve_version(["platoon-test-ancient==1.0"], cache)
    assert str(caught.value) == (
        "platoon-test-ancient==1.0 requires verifiers<0.1.6; platoon speaks verifiers 0.1.8 to 0.4.x (<0.5,>=0.1.8)"
    )


@pytest.mark.slow
@needs_python
@needs_bwrap
@pytest.mark.anyio
async def test_a_venv_that_does_not_build_says_pips_conclusion_in_one_line_before_any_request(
    index, tmp_path
):
    cache = tmp_path / "cache"
    backend = VerifiersBackend(
        "old-env", packages=["platoon-test-old==1.0"], verifiers="0.4.0", cache=cache, pythons=[]
    )
    with capture_logs() as logs:
        async with Bus() as bus, running(bus, [EnvService("old", backend)]):
            # the build ran (and failed) before the service answered: the reply is at once
            reply = await bus.request(TasksRequested(env="old", split="train"), timeout=5)
    assert isinstance(reply, TasksListed)
    [log] = cache.glob("toolchains/*.log")
    assert reply.error == (
        "verifiers environment old-env: the venv could not be built: pip: Cannot install "
        "platoon-test-old==1.0 and verifiers==0.4.0: conflicting dependencies (The user requested "
        f"verifiers==0.4.0; platoon-test-old 1.0 depends on verifiers<0.2); the full log: {log}"
    )
    assert "The conflict is caused by:" in log.read_text()  # pip's whole output is kept there
    said = [e for e in logs if e["event"].startswith("building the verifiers venv before listing the tasks")]
    assert said and said[0]["pins"] == "verifiers==0.4.0, uv==0.13.9, platoon-test-old==1.0"


@pytest.mark.slow
@needs_python
@needs_bwrap
def test_prepare_builds_the_venv_of_the_version_the_packages_need_with_a_line_before_and_its_time_after(
    index, tmp_path, monkeypatch, capsys
):
    from platoon.cli import main

    (tmp_path / "site.yaml").write_text(f"runs: {tmp_path}/runs\ncache: {tmp_path}/cache\n")
    monkeypatch.setenv("PLATOON_SITE", str(tmp_path / "site.yaml"))
    config = tmp_path / "c.yaml"
    config.write_text(
        "environments:\n  - {name: mid, service: 'verifiers://mid-env', harness: verifiers, "
        "service_kwargs: {packages: ['platoon-test-mid==1.0']}}\n"
    )
    assert main(["prepare", str(config)]) == 0
    out = capsys.readouterr().out
    pins = "verifiers==0.2.1, uv==0.13.9, platoon-test-mid==1.0"  # the newest 0.2 the package allows
    assert f"mid: building the verifiers venv ({pins}); a few minutes the first time\n" in out
    assert "mid: verifiers venv ready in " in out and f"({pins})" in out
    assert main(["prepare", str(config)]) == 0
    again = capsys.readouterr().out
    assert "building" not in again and "mid: verifiers venv ready in" in again  # built once

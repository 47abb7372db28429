"""Session fixtures for sandbox tests: a tiny rootfs from host binaries and podman's API service.

The root conftest imports them, so the sandbox and Harbor tests share one of each."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from platoon.sandbox import SandboxError
from platoon.sandbox.fixtures import minimal_rootfs, podman_image, podman_service

CACHE = Path(f"/tmp/platoon-test-cache-{os.getuid()}")


@pytest.fixture(scope="session")
def rootfs() -> Path:
    return minimal_rootfs(CACHE / "rootfs")


@pytest.fixture(scope="session")
def podman_url():
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed")
    try:
        with podman_service(CACHE / "podman") as url:
            yield url
    except SandboxError as exc:
        pytest.skip(f"podman's API service cannot run here: {exc}")


@pytest.fixture(scope="session")
def image(podman_url, rootfs) -> str:
    return podman_image(CACHE / "podman", rootfs)

"""platoon's servers as a user starts them: real `platoon` processes, watched from outside.

An attacker here is another local user, or task code that reaches the host's loopback: it holds
no key, or it holds one and sends the worst it can. These fixtures start the real command, read
the address (and key) it prints, and measure the process's memory from /proc.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from served import Served


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from platoon.testing.models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture
def serve() -> Iterator:
    """`serve(argv, ready=REGEX, env=...)` starts a `platoon` command; all are stopped after."""
    started: list[Served] = []

    def start(argv: list[str], *, ready: str, env: dict[str, str] | None = None) -> Served:
        started.append(Served(argv, ready=ready, env=env))
        return started[-1]

    yield start
    for served in started:
        served.close()

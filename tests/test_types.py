"""The typed modules type-check: mypy over what `[tool.mypy]` in pyproject.toml names (the public
API and the components typed so far), with its settings. A module joins that list once it checks
clean, and stays clean from then on."""

from __future__ import annotations

from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api", reason="mypy is in the dev extra")

ROOT = Path(__file__).resolve().parents[1]

# A cold cache takes mypy 40-60 s on two cores; a warm one, two.
pytestmark = pytest.mark.slow


def test_the_typed_modules_type_check(monkeypatch):
    # From the project's root, so pyproject's `files` and `mypy_path` resolve; mypy's cache
    # (.mypy_cache, ignored by git) makes a rerun take seconds.
    monkeypatch.chdir(ROOT)
    stdout, stderr, status = mypy_api.run(["--config-file", str(ROOT / "pyproject.toml")])
    assert status == 0, f"mypy found problems:\n{stdout}{stderr}"

"""The package type-checks: mypy over what `[tool.mypy]` in pyproject.toml names (all of
`src/platoon`), with its settings, so a module is checked from its first line."""

from __future__ import annotations

from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api", reason="mypy is in the dev extra")

ROOT = Path(__file__).resolve().parents[1]

# A cold cache takes mypy about 15 s (torch, transformers and peft are read as untyped); a warm one, two.
pytestmark = pytest.mark.slow


def test_the_typed_modules_type_check(monkeypatch):
    # From the project's root, so pyproject's `files` and `mypy_path` resolve; mypy's cache
    # (.mypy_cache, ignored by git) makes a rerun take seconds.
    monkeypatch.chdir(ROOT)
    stdout, stderr, status = mypy_api.run(["--config-file", str(ROOT / "pyproject.toml")])
    assert status == 0, f"mypy found problems:\n{stdout}{stderr}"

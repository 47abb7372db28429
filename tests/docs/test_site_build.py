"""The documentation site builds with `mkdocs build --strict`: no broken link, no missing page,
no reference page that fails to generate from the code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_mkdocs_build_strict_passes(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "PLATOON_SITE": str(tmp_path / "none.yaml"), "COLUMNS": "100"}
    (tmp_path / "none.yaml").write_text("{}\n")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]
    for page in (
        "reference/cli",
        "reference/config",
        "reference/events",
        "reference/harness-spec",
        "reference/site",
        "reference/api",
        "extending/harnesses",
        "rfcs/0000-template",
    ):
        assert (site / page / "index.html").exists(), page
    for html in site.rglob("*.html"):  # every `--8<--` include was resolved, none left as text
        text = html.read_text()
        assert "--8&lt;--" not in text and "8 &lt; --" not in text, html
    assert "list_tasks" in (site / "tutorials" / "quickstart" / "index.html").read_text()  # guess.py
    api = (site / "reference" / "api" / "index.html").read_text()
    assert "AgentContext" in api and "load_config" in api  # mkdocstrings rendered the public API

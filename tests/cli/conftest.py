"""The command tests' site: runs and a cache of their own, in the quickstart's folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"


@pytest.fixture
def site(tmp_path, monkeypatch):
    profile = tmp_path / "site.yaml"
    profile.write_text(yaml.safe_dump({"runs": str(tmp_path / "runs"), "cache": str(tmp_path / "cache")}))
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    monkeypatch.syspath_prepend(str(QUICKSTART))
    monkeypatch.chdir(QUICKSTART)
    return tmp_path

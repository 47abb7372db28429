import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site profile of the test's own: runs and cache under tmp_path."""
    profile = tmp_path / "site.yaml"
    profile.write_text(f"runs: {tmp_path / 'runs'}\ncache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    monkeypatch.syspath_prepend(str(HERE))
    yield tmp_path
    sys.modules.pop("learnable", None)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    from platoon.testing.models import save_tiny_model

    return str(
        save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", hidden_size=64, num_layers=2, seed=0)
    )

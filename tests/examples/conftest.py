"""What the examples' training tests share: an example's config trained as written, in process,
with a site profile (runs and the built-in model's cache) of the test's own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def train_example(tmp_path, monkeypatch) -> Callable[..., tuple[Any, Path, list[Any]]]:
    """`train_example(config_path, overrides=())` trains the config (its example's packages
    imported from its folder) into `tmp_path/run`; returns the config, the run directory and
    the run's events."""
    import anyio

    from platoon.api import train
    from platoon.assembly import import_packages
    from platoon.bus.eventlog import read_events
    from platoon.config import load_config

    pytest.importorskip("peft")
    site = tmp_path / "site.yaml"
    site.write_text(f"runs: {tmp_path / 'runs'}\ncache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))

    def run(path: Path, overrides: Sequence[str] = ()) -> tuple[Any, Path, list[Any]]:
        config = load_config(path, list(overrides))
        import_packages(config, path.parent)
        run_dir = tmp_path / "run"
        anyio.run(lambda: train(config, run_dir=run_dir, console=False))
        return config, run_dir, list(read_events(run_dir))

    return run

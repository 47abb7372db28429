"""What the verifiers worker says when an environment fails to load: the innermost error and the
package it came from, not verifiers' "not found" around it (`explain` in `worker.py`, which
imports verifiers only when it loads an environment: imported here as it runs, a script whose
folder is first on the import path)."""

from __future__ import annotations

import importlib
import sys

import pytest

from platoon.envs.verifiers.process import WORKER


@pytest.fixture
def worker_errors(monkeypatch):
    """The worker module, imported as it runs: a script whose folder is first on the path."""
    monkeypatch.syspath_prepend(str(WORKER.parent))
    return importlib.import_module("worker")


def test_a_failed_import_inside_an_environment_is_reported_with_its_package(
    worker_errors, tmp_path, monkeypatch
):
    package = tmp_path / "old_env"
    package.mkdir()
    (package / "__init__.py").write_text("from .tasks import TASKS\n")
    (package / "tasks.py").write_text("import verifiers_utils_gone_in_this_version\nTASKS = []\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def load(env_id: str) -> None:  # as verifiers' loader does: "not found", from the real error
        try:
            importlib.import_module(env_id)
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(f"taskset {env_id!r} not found (tried to import {env_id!r})") from exc

    with pytest.raises(ModuleNotFoundError) as caught:
        load("old_env")
    sys.modules.pop("old_env", None)
    message = worker_errors.explain(caught.value)
    assert "\n" not in message
    assert message.startswith(
        "ModuleNotFoundError: No module named 'verifiers_utils_gone_in_this_version' "
        "(raised in old_env/tasks.py:1), under: ModuleNotFoundError: taskset 'old_env' not found"
    )


def test_a_refusal_is_said_as_it_is(worker_errors):
    assert (
        worker_errors.explain(worker_errors.Refused("the taskset is\n infinite")) == "the taskset is infinite"
    )

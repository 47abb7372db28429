"""`platoon.run`: what a config describes, from inside someone else's async application."""

from pathlib import Path

import pytest

import platoon

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"


@pytest.mark.anyio
async def test_run_evaluates_a_config_without_train(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(QUICKSTART))
    config = tmp_path / "eval.yaml"
    config.write_text(
        "environments:\n"
        "  - {name: guess, service: 'python://guess:GuessTheNumber', harness: example-guesser, package: guesser}\n"
        "eval: {group_size: 1, concurrency: 4, max_tasks: 5}\n"
    )
    report = await platoon.run(
        config, run_dir_path=tmp_path / "run", policy="scripted:scripted:binary_search"
    )
    assert report.episodes == 5
    assert report.pass_at_k["1"] == 1.0
    assert (tmp_path / "run" / "eval.json").exists()


@pytest.mark.anyio
async def test_a_scripted_policy_with_a_training_config_is_refused(tmp_path, monkeypatch):
    """A policy= that would be silently ignored (training samples its own policy) is an error."""
    monkeypatch.syspath_prepend(str(QUICKSTART))
    with pytest.raises(ValueError, match="training samples the policy it trains"):
        await platoon.run(
            QUICKSTART / "train.yaml", run_dir_path=tmp_path / "run", policy="scripted:scripted:binary_search"
        )
    assert not (tmp_path / "run").exists()

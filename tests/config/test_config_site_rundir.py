"""The site profile and the run directory's record."""

import json
import os
import platform
from datetime import UTC, datetime

import pytest

from platoon.config import (
    Config,
    ConfigError,
    Site,
    load_config,
    load_site,
    run_dir,
    site_path,
    write_run_files,
)
from platoon.config.rundir import KEY_DEPENDENCIES


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A home folder of our own, so the user's real profile is never read."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PLATOON_SITE", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "home"


def test_defaults_without_a_profile(home):
    assert site_path() == home / ".config/platoon/site.yaml"
    assert load_site() == Site(
        runs=str(home / "platoon-runs"), cache=str(home / ".cache/platoon"), provider="auto"
    )


def test_profile_named_by_platoon_site(home, tmp_path, monkeypatch):
    profile = tmp_path / "cluster/site.yaml"
    profile.parent.mkdir()
    profile.write_text("runs: /shared/runs\ncache: ./cache\nprovider: singularity\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    assert load_site() == Site(
        runs="/shared/runs", cache=str(tmp_path / "cluster/cache"), provider="singularity"
    )


def test_default_profile_location_and_xdg(home, tmp_path, monkeypatch):
    (home / ".config/platoon").mkdir(parents=True)
    (home / ".config/platoon/site.yaml").write_text("provider: docker\n")
    assert load_site().provider == "docker"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert site_path() == tmp_path / "xdg/platoon/site.yaml"
    assert load_site().provider == "auto"


def test_profile_is_strict(home, tmp_path, monkeypatch):
    profile = tmp_path / "site.yaml"
    profile.write_text("runz: /x\nprovider: [docker]\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    with pytest.raises(ConfigError) as caught:
        load_site()
    assert caught.value.problems == [
        f"{profile}: runz: unknown key (did you mean runs?)",
        f"{profile}: provider: expected str, got list",
    ]


def test_the_profile_keeps_the_provider_as_written_for_the_sandbox_registry_to_check(
    home, tmp_path, monkeypatch
):
    """The contracts know no components: a typo is named where a service resolves the provider."""
    profile = tmp_path / "site.yaml"
    profile.write_text("provider: dockr\n")
    monkeypatch.setenv("PLATOON_SITE", str(profile))
    assert load_site().provider == "dockr"


def test_a_named_profile_must_exist(home, monkeypatch):
    monkeypatch.setenv("PLATOON_SITE", "missing-site.yaml")
    with pytest.raises(ConfigError) as caught:
        load_site()
    assert caught.value.problems == ["missing-site.yaml: file not found"]


def test_run_dir_from_site_or_log_path(home, tmp_path):
    (tmp_path / "c.yaml").write_text("stats: {experiment_name: exp, trial_name: t1}\n")
    site = load_site()
    config = load_config("c.yaml")
    assert run_dir(config, site) == home / "platoon-runs/exp/t1"
    config = load_config("c.yaml", ["log_path=./runs"])
    assert run_dir(config, site) == tmp_path / "runs/exp/t1"
    unnamed = load_config("c.yaml", ["stats.trial_name=null"])
    when = datetime(2026, 11, 1, 12, 30, 5, tzinfo=UTC)
    assert run_dir(unnamed, site, now=when) == home / "platoon-runs/exp/20261101-123005"


def test_an_eval_or_a_rollout_of_a_training_config_writes_beside_its_training_run(home, tmp_path):
    (tmp_path / "c.yaml").write_text(
        "environments: [{env: platoon-number-search@1, harness: platoon-react}]\n"
        "train: {model_name: m, renderer_name: qwen3_instruct}\n"
        "stats: {experiment_name: exp, trial_name: t1}\n"
    )
    site = load_site()
    trains = load_config("c.yaml")
    assert run_dir(trains, site) == home / "platoon-runs/exp/t1"
    assert run_dir(trains, site, purpose="eval") == home / "platoon-runs/exp/t1-eval"
    assert run_dir(trains, site, purpose="rollout") == home / "platoon-runs/exp/t1-rollout"
    named = load_config("c.yaml", ["stats.trial_name=guess-eval"])  # an eval's folder already
    assert run_dir(named, site, purpose="eval") == home / "platoon-runs/exp/guess-eval"
    evaluates = load_config("c.yaml", ["train=null"])  # no training run to keep apart from
    assert run_dir(evaluates, site, purpose="eval") == home / "platoon-runs/exp/t1"


def test_run_files_are_written_and_reload(home, tmp_path):
    (tmp_path / "base.yaml").write_text(
        "environments: [{name: e, service: harbor, service_kwargs: {dataset: ./data}}]\n"
        "train: {model_name: m, renderer_name: qwen3_instruct}\n"
    )
    (tmp_path / "c.yaml").write_text("extends: base.yaml\nstats: {experiment_name: exp, trial_name: t}\n")
    config = load_config("c.yaml", ["train.batch_size=4", "log_path=./runs"])
    directory = run_dir(config, load_site())
    write_run_files(directory, config, {"argv": ["platoon", "train", "c.yaml"], "tool_call_parser": "hermes"})

    assert sorted(os.listdir(directory)) == ["config.yaml", "lock.json"]
    # Reloaded from elsewhere, the run's config is the same config: its paths were made absolute.
    os.chdir(home.parent.parent)
    assert load_config(directory / "config.yaml") == config

    lock = json.loads((directory / "lock.json").read_text())
    assert lock["python"] == platform.python_version()
    assert set(lock["packages"]) == set(KEY_DEPENDENCIES)
    assert lock["packages"]["msgspec"] == __import__("msgspec").__version__
    assert lock["config"]["train"]["batch_size"] == 4
    assert lock["config"]["train"]["optimizer"]["beta2"] == 0.95  # defaults are written out
    assert lock["config"]["environments"][0]["service_kwargs"]["dataset"] == str(tmp_path / "data")
    assert lock["argv"] == ["platoon", "train", "c.yaml"] and lock["tool_call_parser"] == "hermes"
    assert "platoon" in lock


def test_run_files_replace_old_ones_whole(home, tmp_path):
    directory = tmp_path / "run"
    write_run_files(directory, Config(log_path="/a"))
    write_run_files(directory, Config(log_path="/b"))
    assert load_config(directory / "config.yaml").log_path == "/b"
    assert [name for name in os.listdir(directory) if name.startswith(".")] == []

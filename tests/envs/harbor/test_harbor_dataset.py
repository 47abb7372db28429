import os
import shutil

import pytest

from platoon.envs.harbor import HarborError, Holdout, dataset_digest, holdout_groups, load_dataset

TOPICS = {"a1": "algebra", "a2": "algebra", "a3": "algebra", "g1": "geometry", "g2": "geometry", "s1": "strings", "s2": "strings"}  # fmt: skip


@pytest.fixture
def dataset_dir(make_task, tmp_path):
    for name, topic in TOPICS.items():
        make_task(
            name, toml=f'[task]\nname = "acme/{name}"\n[metadata]\ntopic = "{topic}"\nlevel = {len(name)}\n'
        )
    (tmp_path / "tasks" / "notes").mkdir()  # not a task: ignored
    return tmp_path / "tasks"


def test_index_records_metadata(dataset_dir):
    ds = load_dataset(dataset_dir, index=[{"metadata": ["topic", "missing"]}, {"task": ["name"]}])
    assert list(ds.tasks) == sorted(TOPICS)
    assert ds.records["g1"] == {"topic": "geometry", "missing": None, "name": "acme/g1"}
    assert ds.train == sorted(TOPICS) and ds.eval == []
    assert [t.name for t in ds.split("train")] == sorted(TOPICS)
    with pytest.raises(HarborError, match="unknown split"):
        ds.split("test")


def test_holdout_keeps_whole_groups_out_and_is_pinned(dataset_dir):
    ds = load_dataset(
        dataset_dir, index=[{"metadata": ["topic"]}], holdout={"fraction": 0.3, "group_by": "topic"}
    )
    # Pinned: sha256 of the group names orders algebra first, on every machine.
    assert ds.eval == ["a1", "a2", "a3"]
    assert ds.train == ["g1", "g2", "s1", "s2"]
    other = load_dataset(dataset_dir, holdout=Holdout(fraction=0.3, group_by="topic", seed="a"))
    assert other.eval == ["g1", "g2", "s1", "s2"]


def test_holdout_is_independent_of_location_and_creation_order(dataset_dir, tmp_path):
    copy = tmp_path / "elsewhere" / "copy"
    names = list(TOPICS)[::-1]
    copy.mkdir(parents=True)
    for name in names:  # created in another order
        shutil.copytree(dataset_dir / name, copy / name)
    spec = {"fraction": 0.5, "group_by": "topic"}
    first, second = load_dataset(dataset_dir, holdout=spec), load_dataset(copy, holdout=spec)
    assert first.eval == second.eval == ["a1", "a2", "a3", "g1", "g2"]
    assert first.digest == second.digest


def test_holdout_rules():
    groups = {"algebra": ["a1", "a2", "a3"], "geometry": ["g1", "g2"], "strings": ["s1", "s2"]}
    assert holdout_groups(groups, 0.0) == []
    assert holdout_groups(groups, 0.9) == ["algebra", "geometry"]  # one group always trains
    assert holdout_groups({"only": ["x"]}, 0.5) == []
    singles = {f"t{i}": [f"t{i}"] for i in range(10)}
    assert holdout_groups(singles, 0.2) == ["t6", "t7"]


def test_holdout_without_group_by_holds_out_single_tasks(dataset_dir):
    ds = load_dataset(dataset_dir, holdout={"fraction": 0.2})
    assert len(ds.eval) == 2 and set(ds.eval) | set(ds.train) == set(TOPICS)


def test_holdout_and_index_errors(dataset_dir):
    with pytest.raises(HarborError, match="task a1 has no 'nope' to group by"):
        load_dataset(dataset_dir, holdout={"fraction": 0.5, "group_by": "nope"})
    with pytest.raises(HarborError, match=r"fraction must be in \[0, 1\)"):
        load_dataset(dataset_dir, holdout={"fraction": 1.0})
    with pytest.raises(HarborError, match="holdout: Expected `float`, got `str`"):
        load_dataset(dataset_dir, holdout={"fraction": "half"})
    with pytest.raises(HarborError, match="unknown source 'verifier'"):
        load_dataset(dataset_dir, index=[{"verifier": ["timeout_sec"]}])
    with pytest.raises(HarborError, match="must list keys"):
        load_dataset(dataset_dir, index=[{"metadata": "topic"}])


def test_single_task_and_empty_dirs(make_task, tmp_path):
    one = load_dataset(make_task("solo"))
    assert list(one.tasks) == ["solo"]
    (tmp_path / "void").mkdir()
    with pytest.raises(HarborError, match="holds no task directories"):
        load_dataset(tmp_path / "void")
    with pytest.raises(HarborError, match="is not a directory"):
        load_dataset(tmp_path / "absent")


def test_digest_is_over_paths_and_bytes_only(tmp_path):
    root = tmp_path / "d"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("alpha")
    (root / "sub" / "b.sh").write_text("echo b\n")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ignored")
    for path in (root / "a.txt", root / "sub" / "b.sh"):
        path.chmod(0o644)
    digest = dataset_digest(root)
    # Pinned: the same bytes under the same relative paths give this on every machine.
    assert digest == "sha256:069d3bdea7c4956b09569826d0830b6e3da9d986b32f009b873b8e121f10b05f"
    os.utime(root / "a.txt", (0, 0))
    (root / ".git" / "HEAD").write_text("still ignored")
    assert dataset_digest(root) == digest  # mtimes and .git do not count
    (root / "sub" / "b.sh").chmod(0o755)
    assert dataset_digest(root) != digest
    (root / "sub" / "b.sh").chmod(0o644)
    (root / "a.txt").write_text("alphA")
    assert dataset_digest(root) != digest
    (root / "a.txt").write_text("alpha")
    (root / "a.txt").rename(root / "c.txt")
    assert dataset_digest(root) != digest

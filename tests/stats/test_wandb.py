"""The W&B sink with the real `wandb` package in offline mode: a short quickstart run with evals
logs every metric against `platoon/step` and each eval's episodes as a table, read back from the
files wandb writes."""

import json
import random
import struct
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from platoon.bus import read_events
from platoon.bus.events import EpisodeFinished, EpisodeGraded, EpisodeRequested, ModelCallFinished

pytestmark = pytest.mark.torch
wandb = pytest.importorskip("wandb", reason="needs wandb (pip install 'platoon[wandb]')")

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"


def _records(path: Path):
    """The protobuf records of a `.wandb` file: a 7-byte header, then a log in 32 KiB blocks of
    chunks (crc32 4, length 2, type 1: full, first, middle, last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    at, block, pending = 7, 32 * 1024, b""
    while at + 7 <= len(data):
        left = block - at % block
        if left < 7:
            at += left  # a block's tail too short for a chunk header is padding
            continue
        _, length, kind = struct.unpack_from("<IHB", data, at)
        if kind == 0:
            at += left
            continue
        pending += data[at + 7 : at + 7 + length]
        at += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _history(run_dir: Path) -> list[dict]:
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    rows = []
    for record in _records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


@pytest.mark.slow
def test_offline_wandb_gets_every_metric_and_each_evals_episodes(tmp_path, monkeypatch):
    import anyio

    from platoon.api import train
    from platoon.assembly import import_packages
    from platoon.config import load_config
    from platoon.models.loading import load_tokenizer
    from platoon.testing.models import save_tiny_model
    from platoon.testing.policies import ScriptedSamplerFactory

    monkeypatch.syspath_prepend(str(QUICKSTART))
    monkeypatch.setenv("WANDB_SILENT", "true")
    from scripted import binary_search

    random.seed(3)
    model = save_tiny_model(tmp_path / "model", hidden_size=64, num_layers=2, seed=0)
    config = load_config(
        QUICKSTART / "train-local.yaml",
        [
            f"train.model_name={model}",
            "train.max_training_steps=4",
            "train.save_every=0",
            "eval.every=2",
            "eval.group_size=2",
            "eval.max_tasks=3",
            "stats.wandb.mode=offline",
            "stats.wandb.project=platoon-test",
        ],
    )
    import_packages(config, QUICKSTART)
    factory = ScriptedSamplerFactory(load_tokenizer(str(model)), binary_search)
    run_dir = tmp_path / "run"
    try:
        anyio.run(lambda: train(config, run_dir=run_dir, console=False, sampler_factory=factory))
    finally:
        sys.modules.pop("scripted", None)
    # `run.finish()` returns once wandb's service process acknowledged the run's end, but that
    # process writes the offline `.wandb` file (held in a 32 KiB block buffer) only when it closes
    # the run, which `finish()` asks for without waiting: on a busy machine the file still held
    # just its header when read here. Tearing wandb down waits for the service process to exit,
    # which it does after closing every run (a `platoon` process does the same when it exits).
    wandb.teardown()

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    history = _history(run_dir)
    # Every metrics.jsonl row is a history row, at its own platoon/step.
    logged = [{k: v for k, v in row.items() if not k.startswith(("_", "eval/table/"))} for row in history]
    expected = [
        {"platoon/step": m["step"], **{k: v for k, v in m.items() if k not in ("step", "time")}}
        for m in metrics
    ]

    def order(row):
        return row["platoon/step"], sorted(row)

    assert sorted(logged, key=order) == sorted(expected, key=order)
    assert {m["step"] for m in metrics if "eval/pass@1" in m} == {2, 4}

    # Each eval's table holds its episodes as the event log has them.
    events = list(read_events(run_dir))
    eval_ids = {
        e.episode_id: e.step for e in events if isinstance(e, EpisodeRequested) and e.purpose == "eval"
    }
    rewards = {
        e.episode_id: e.reward for e in events if isinstance(e, EpisodeGraded) and e.episode_id in eval_ids
    }
    status = {
        e.episode_id: e.status for e in events if isinstance(e, EpisodeFinished) and e.episode_id in eval_ids
    }
    calls = defaultdict(int)
    for e in events:
        if isinstance(e, ModelCallFinished) and e.episode_id in eval_ids:
            calls[e.episode_id] += 1
    tables = [row for row in history if "eval/table/path" in row]  # a table: its file's keys
    assert [row["platoon/step"] for row in tables] == [2, 4]
    for row in tables:
        (path,) = run_dir.glob(f"wandb/offline-run-*/files/{row['eval/table/path']}")
        table = json.loads(path.read_text())
        columns = table["columns"]
        shown = [dict(zip(columns, values, strict=True)) for values in table["data"]]
        step = row["platoon/step"]
        assert {r["episode_id"] for r in shown} == {i for i, s in eval_ids.items() if s == step}
        assert len(shown) == 6
        for r in shown:
            assert r["reward"] == rewards[r["episode_id"]]
            assert r["status"] == status[r["episode_id"]]
            assert r["model_calls"] == calls[r["episode_id"]]

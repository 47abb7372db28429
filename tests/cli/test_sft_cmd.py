"""`platoon sft`: trains in `<trial>-sft` beside the config's RL run, ends with a summary that
names the state `platoon train` starts from, and says in one line why it cannot start."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from platoon.cli import main

pytestmark = pytest.mark.torch

TRAIN_TESTS = Path(__file__).resolve().parents[1] / "train"


@pytest.fixture
def recorded(site, monkeypatch):
    """The scripted expert's episodes of number search (and a babbler's, all reward 0)."""
    monkeypatch.syspath_prepend(str(TRAIN_TESTS))
    from recordings import record

    yield record(site / "expert", "bisect", tasks=6), record(site / "babbler", "babble", tasks=2)
    sys.modules.pop("recordings", None)


def write_config(site: Path) -> Path:
    sys.path.insert(0, str(TRAIN_TESTS))
    from recordings import number_search

    path = site / "sft.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "environments": [number_search()],
                "train": {
                    "backend": "local",
                    "model_name": "platoon-tiny-qwen3",
                    "renderer_name": "qwen3_instruct",
                    "lora_rank": 4,
                    "optimizer": {"learning_rate": 0.005},
                },
                "sft": {"epochs": 2, "batch_size": 4},
                "stats": {"experiment_name": "search", "trial_name": "bisect"},
            }
        )
    )
    return path


def test_sft_trains_beside_the_rl_run_and_names_the_state_to_start_from(site, recorded, capsys):
    expert, babbler = recorded
    config = write_config(site)
    code = main(["sft", str(config), "--from", str(expert), "--from", str(babbler), "--where", "reward>=1"])
    out, err = capsys.readouterr()
    assert code == 0, err
    run_dir = site / "runs" / "search" / "bisect-sft"
    checkpoints = [json.loads(line) for line in (run_dir / "checkpoints.jsonl").read_text().splitlines()]
    assert [c["step"] for c in checkpoints] == [2, 4]  # 6 datums, 4 a step: 2 steps an epoch
    assert "trained 4 steps" in out and "per token" in out
    assert f"state   {checkpoints[-1]['state_path']}" in out
    assert f"then    platoon train CONFIG checkpoint.load_path={run_dir}" in out
    assert "step 4/4" in err and "per token" in err and "epoch 2" in err
    lock = json.loads((run_dir / "lock.json").read_text())
    assert lock["config"]["sft"]["epochs"] == 2 and lock["tokenizer"]["fingerprint"].startswith("sha256:")


def test_sft_says_in_one_line_what_it_cannot_learn_from(site, recorded, capsys):
    expert, babbler = recorded
    config = write_config(site)
    assert main(["sft", str(config), "--from", str(babbler), "--where", "reward>=1"]) == 1
    err = capsys.readouterr().err
    assert "no recorded episode passes --where reward>=1 (of 2 read from" in err and "rewards 0 x2" in err
    assert "Traceback" not in err
    assert main(["sft", str(config), "--from", str(site / "nowhere")]) == 1
    assert "--from " + str(site / "nowhere") + ": no such run directory" in capsys.readouterr().err
    (site / "empty").mkdir()
    assert main(["sft", str(config), "--from", str(site / "empty")]) == 1
    assert "no event log (events.msgpack) there" in capsys.readouterr().err
    assert main(["sft", str(config), "--from", str(expert), "--where", "reward~1"]) == 1
    assert "is not a filter this understands" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):
        main(["sft", str(config)])
    assert "the following arguments are required: --from" in capsys.readouterr().err

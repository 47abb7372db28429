from importlib.metadata import entry_points
from pathlib import Path

import pytest
from platoon_textcraft.env import TextCraft, TextCraftSynth

CONFIGS = Path(__file__).parent.parent / "configs"


def test_entry_points_name_the_environments():
    found = {ep.name: ep for ep in entry_points(group="platoon.environments")}
    assert found["platoon-textcraft"].load() is TextCraft
    assert found["textcraft-synth"].load() is TextCraftSynth


@pytest.mark.parametrize("name", ["train.yaml", "eval.yaml"])
def test_configs_pass_platoons_strict_schema(name):
    config = pytest.importorskip("platoon.config")
    loaded = config.load_config(CONFIGS / name)
    assert loaded.environments
    for entry in loaded.environments:
        assert entry.env in ("platoon-textcraft", "textcraft-synth")
        names = [s.name for s in TextCraft.list_splits()]
        assert entry.splits.train in names and entry.splits.eval in names

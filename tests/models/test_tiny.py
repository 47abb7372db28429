"""The tiny model's directory loads wherever a Tinker server might load it."""

import json

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def test_tiny_model_tokenizer_files_name_a_class_transformers_4_has(tmp_path):
    """transformers 5 saves a tokenizer as `TokenizersBackend`, which transformers 4 (pinned by
    skyrl-tx's server) cannot load; both the toy tokenizer and a copied one say the generic
    fast class that both versions have, and nothing about where they were loaded from.
    (Checked by hand with transformers 4.57.6: both load and encode as 5.x does.)"""
    from transformers import AutoTokenizer

    from platoon.testing.models import save_tiny_model

    toy = save_tiny_model(tmp_path / "toy", hidden_size=16, num_layers=1)
    copied = save_tiny_model(tmp_path / "copied", tokenizer_dir=toy, hidden_size=16, num_layers=1)
    for directory in (toy, copied):
        config = json.loads((directory / "tokenizer_config.json").read_text())
        assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
        assert "is_local" not in config and "local_files_only" not in config
    text = "Hello <|im_end|> \\boxed{2}"
    assert AutoTokenizer.from_pretrained(copied).encode(text) == AutoTokenizer.from_pretrained(toy).encode(
        text
    )

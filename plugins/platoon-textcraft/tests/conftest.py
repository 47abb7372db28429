import os

import pytest

# The openreward SDK checks PyPI for updates on import; tests stay offline.
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")


@pytest.fixture
def anyio_backend():
    # ORS tool dispatch uses asyncio locks, so sessions run under asyncio.
    return "asyncio"

import os
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("tinker")

os.environ.setdefault("TINKER_TELEMETRY", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from platoon.testing.models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def base_url(tiny_model: Path, checkpoint_dir: Path):
    """One server per test module, running in a background event loop, on the CPU in float32
    whatever the machine has, so results compare exactly with plain transformers."""
    from anyio.from_thread import start_blocking_portal

    from platoon.backends.local import running_server

    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(
            running_server(str(tiny_model), checkpoint_dir=checkpoint_dir, device="cpu")
        ) as url,
    ):
        yield url


@pytest.fixture
def service(base_url: str):
    """A fresh Tinker session per test; finished afterwards so the server frees its models."""
    import tinker

    client = tinker.ServiceClient(base_url=base_url, api_key="tml-test")
    yield client
    client.close("success").result()

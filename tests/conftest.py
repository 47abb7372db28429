import os

import pytest

os.environ.setdefault("TINKER_TELEMETRY", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OPENREWARD_DISABLE_UPDATE_CHECK", "1")


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request):
    return request.param


from tokenizer_fixtures import llama3_tokenizer, qwen3_tokenizer, toy_tokenizer  # noqa: E402, F401

"""`TinkerSampler` streams where its server streams samples (the embedded one), and stays the
SDK's one-piece sampler where it does not (hosted Tinker), asking that server once."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from platoon.policy.base import SampleParams
from platoon.policy.tinker import StreamingTinkerSampler, TinkerSamplerFactory, closing, stream_url
from platoon.serving import serve_asgi

# On asyncio, as tests/gateway/test_conformance.py runs the tinker SDK.
pytestmark = [pytest.mark.torch, pytest.mark.anyio, pytest.mark.parametrize("anyio_backend", ["asyncio"])]

KEY = "tml-policy-key"
PROMPT = [21, 22, 23, 24]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("tinker")
    from platoon.models.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


async def test_the_stream_joins_into_what_sample_returns(tiny_model):
    import tinker

    from platoon.backends.local import running_server_in_thread

    async with (
        running_server_in_thread(str(tiny_model), device="cpu", api_key=KEY) as url,
        closing(tinker.ServiceClient(base_url=url, api_key=KEY)) as service,
    ):
        sampler = await TinkerSamplerFactory(service, base_model=str(tiny_model)).initial()
        assert isinstance(sampler, StreamingTinkerSampler)
        params = SampleParams(max_tokens=24, seed=3, stop=[], top_logprobs=2)
        chunks = [chunk async for chunk in sampler.sample_stream(PROMPT, params)]
        whole = await sampler.sample(PROMPT, params)
    assert len(chunks) == 24 and [c.stop_reason for c in chunks] == [None] * 23 + ["length"]
    assert [t for c in chunks for t in c.tokens] == whole.tokens
    assert [lp for c in chunks for lp in c.logprobs] == whole.logprobs
    assert [at for c in chunks for at in c.top_logprobs or []] == whole.top_logprobs


async def test_a_refusal_is_the_servers_reason(tiny_model):
    import tinker

    from platoon.backends.local import running_server_in_thread
    from platoon.policy.tinker import SamplingFailed

    async with (
        running_server_in_thread(str(tiny_model), device="cpu") as url,
        closing(tinker.ServiceClient(base_url=url, api_key=KEY)) as service,
    ):
        sampler = await TinkerSamplerFactory(service, base_model=str(tiny_model)).initial()
        assert isinstance(sampler, StreamingTinkerSampler)
        with pytest.raises(SamplingFailed, match="outside the vocabulary"):
            async for _ in sampler.sample_stream([10**9], SampleParams(max_tokens=4)):
                pass


async def test_a_server_that_names_no_stream_is_asked_once():
    """Hosted Tinker's capabilities name no stream route: no streaming sampler, and one
    question per base URL, not per sampler or call."""
    import anyio

    asked: list[str | None] = []

    async def capabilities(request: Request) -> JSONResponse:
        asked.append(request.headers.get("x-api-key"))
        return JSONResponse({"supported_models": [{"model_name": "hosted"}]})

    app = Starlette(routes=[Route("/api/v1/get_server_capabilities", capabilities)])
    async with anyio.create_task_group() as tg:
        url = await tg.start(serve_asgi, app)
        assert await stream_url(url, KEY) is None
        assert await stream_url(url + "/", KEY) is None
        tg.cancel_scope.cancel()
    assert asked == [KEY]

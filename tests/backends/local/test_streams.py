"""platoon's sample_stream route, with a raw HTTP client: tokens as they are drawn, the same
sequence as asample's, and a reader that leaves frees its row."""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import httpx
import pytest
import tinker
from anyio.from_thread import BlockingPortal, start_blocking_portal

from platoon.backends.local.engine import Engine
from platoon.backends.local.server import create_app
from platoon.backends.local.service import TinkerService
from platoon.backends.local.streams import SAMPLE_STREAM
from platoon.serving import serve_asgi

pytestmark = pytest.mark.torch

KEY = "tml-stream-key"
PROMPT = [21, 22, 23, 24]


@contextlib.asynccontextmanager
async def serving(model: str, checkpoint_dir: Path) -> AsyncIterator[tuple[str, TinkerService]]:
    engine = await anyio.to_thread.run_sync(
        lambda: Engine(model, checkpoint_dir=checkpoint_dir, device="cpu")
    )
    service = TinkerService(engine, model_name=model, api_key=KEY)
    async with anyio.create_task_group() as tg:
        url = await tg.start(serve_asgi, create_app(service))
        yield url, service
        tg.cancel_scope.cancel()


@pytest.fixture(scope="module")
def served(tiny_model: Path, checkpoint_dir: Path) -> Iterator[tuple[str, TinkerService, BlockingPortal]]:
    """The server on the portal's event loop; `portal.call` reads its sampler there."""
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(serving(str(tiny_model), checkpoint_dir)) as (url, service),
    ):
        yield url, service, portal


def body(model: Path, max_tokens: int, **extra: object) -> dict[str, object]:
    return {
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": PROMPT}]},
        "sampling_params": {"max_tokens": max_tokens, "seed": 7, "stop": [], "temperature": 1.0},
        "base_model": str(model),
        **extra,
    }


def test_the_route_wants_the_key_and_is_named_in_the_capabilities(served, tiny_model):
    url, _, _ = served
    with httpx.Client(base_url=url) as client:
        assert client.post(SAMPLE_STREAM, json=body(tiny_model, 4)).status_code == 401
        caps = client.get("/api/v1/get_server_capabilities", headers={"x-api-key": KEY}).json()
    assert caps["platoon"]["routes"]["sample_stream"] == SAMPLE_STREAM


def test_tokens_stream_as_drawn_and_join_into_what_asample_returns(served, tiny_model):
    url, service, portal = served
    lines = []
    with (
        httpx.Client(base_url=url, headers={"x-api-key": KEY}) as client,
        client.stream("POST", SAMPLE_STREAM, json=body(tiny_model, 64)) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/x-ndjson"
        for line in response.iter_lines():
            if not lines:  # the first tokens, while the rest of the sequence is still being drawn
                assert portal.call(lambda: service.sampler.rows) == 1
            lines.append(json.loads(line))
    assert len(lines) == 64 and all(len(line["tokens"]) == 1 for line in lines)  # a line per token
    assert [line.get("stop_reason") for line in lines] == [None] * 63 + ["length"]

    sequence = asample(url, tiny_model, 64)
    assert [t for line in lines for t in line["tokens"]] == sequence.tokens
    assert [lp for line in lines for lp in line["logprobs"]] == sequence.logprobs
    assert sequence.stop_reason == "length"


def asample(url: str, model: Path, max_tokens: int, **options: object) -> tinker.SampledSequence:
    """The same sample, whole, through the real SDK."""
    sdk = tinker.ServiceClient(base_url=url, api_key=KEY)
    try:
        sampler = sdk.create_sampling_client(base_model=str(model)).result()
        params = tinker.SamplingParams(max_tokens=max_tokens, seed=7, stop=[], temperature=1.0)
        return sampler.sample(tinker.ModelInput.from_ints(PROMPT), 1, params, **options).result().sequences[0]
    finally:
        sdk.close("success").result()


def test_top_logprobs_and_prompt_logprobs_come_along(served, tiny_model):
    url, _, _ = served
    asked = body(tiny_model, 3, topk_sample_logprobs=2, prompt_logprobs=True)
    with httpx.Client(base_url=url, headers={"x-api-key": KEY}) as client:
        lines = [json.loads(line) for line in client.post(SAMPLE_STREAM, json=asked).text.splitlines()]
    top = [[tuple(pair) for pair in at] for line in lines for at in line["top_logprobs"]]
    whole = asample(url, tiny_model, 3, topk_sample_logprobs=2)
    assert top == whole.topk_logprobs and len(top) == 3 and all(len(at) == 2 for at in top)
    assert len(lines[-1]["prompt_logprobs"]) == len(PROMPT) and lines[-1]["prompt_logprobs"][0] is None


def test_a_reader_that_leaves_frees_its_row(served, tiny_model):
    url, service, portal = served
    with (
        httpx.Client(base_url=url, headers={"x-api-key": KEY}) as client,
        client.stream("POST", SAMPLE_STREAM, json=body(tiny_model, 5000)) as response,
    ):
        lines = response.iter_lines()
        first = json.loads(next(lines))
        assert len(first.get("tokens", ())) == 1 and "stop_reason" not in first, first  # not an error line
        rows = portal.call(lambda: service.sampler.rows)
        assert rows == 1, (first, list(itertools.islice(lines, 3)))  # what ended the row, if it ended
    # The connection is closed: the server drops the row at its next step.

    async def freed() -> None:
        with anyio.fail_after(30):
            while service.sampler.rows:  # noqa: ASYNC110 - the worker thread drops it; no event says so
                await anyio.sleep(0.01)

    portal.call(freed)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"num_samples": 2}, "draws one sequence"),
        ({"record_stability_info": True}, "stability"),
        ({"prompt": {"chunks": [{"type": "encoded_text", "tokens": [10**9]}]}}, "outside the vocabulary"),
    ],
)
def test_a_refused_request_is_a_400_before_anything_streams(served, tiny_model, extra, message):
    url, _, _ = served
    with httpx.Client(base_url=url, headers={"x-api-key": KEY}) as client:
        response = client.post(SAMPLE_STREAM, json=body(tiny_model, 4, **extra))
    assert response.status_code == 400 and message in response.json()["error"]

"""Samplers over the Tinker API: hosted Tinker, any Tinker-API server, or the embedded one.

The `tinker` SDK runs its own event loop in a thread and hands back concurrent futures;
`wait_future` turns one into something any anyio backend (asyncio or trio) can await.

The Tinker API has no streaming. platoon's embedded server adds a route that streams one
sequence as it is sampled and names it in its capabilities; on such a server the factory makes a
`StreamingTinkerSampler`, whose `sample_stream` reads that route (the server is asked once per
base URL, not per call). Elsewhere (hosted Tinker) the sampler has no `sample_stream`, and the
gateway sends a streamed reply in one piece when it is sampled.

Where the server's stream route also takes a decoding constraint (its capabilities list
`constraint` in `platoon.sample_stream_takes`), the sampler `constrains`: the gateway's
constraint (a forced tool call, a JSON `response_format`) goes with the streamed request. The
Tinker API's own requests are never changed.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import functools
import json
import os
import re
import ssl
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import httpx
import msgspec
import sniffio
import structlog

from platoon.bus.events import PolicyUpdated
from platoon.config import AssemblyError
from platoon.policy.base import SampledChunk, SampledCompletion, SampleParams
from platoon.serving import published_key_for

__all__ = [
    "StreamingTinkerSampler",
    "TinkerSampler",
    "TinkerSamplerFactory",
    "closing",
    "sampling_client",
    "sdk_call",
    "stream_url",
    "tinker_endpoint",
    "tinker_sampler",
    "tinker_service_client",
    "wait_future",
]

if TYPE_CHECKING:
    import tinker

log = structlog.get_logger("platoon.policy")

T = TypeVar("T")


class _HasFuture(Protocol[T]):
    """A tinker `APIFuture`: it hands out the concurrent future it completes."""

    def future(self) -> concurrent.futures.Future[T]: ...


async def wait_future(future: _HasFuture[T] | concurrent.futures.Future[T]) -> T:
    """Await a tinker `APIFuture` (or a `concurrent.futures.Future`) under any anyio backend."""
    # A tinker APIFuture hands out its concurrent future; some are concurrent futures themselves
    # too, through a deprecated wrapper that warns on use, so `future()` goes first.
    cf = (
        future.future()
        if not isinstance(future, concurrent.futures.Future) or hasattr(future, "future")
        else future
    )
    if cf.done():
        return cf.result()
    if sniffio.current_async_library() == "asyncio":
        return await asyncio.wrap_future(cf)
    done = anyio.Event()
    token = anyio.lowlevel.current_token()
    loop_thread = threading.get_ident()

    def wake(_: concurrent.futures.Future[T]) -> None:
        if threading.get_ident() == loop_thread:  # it finished while we were adding the callback
            done.set()
            return
        try:
            anyio.from_thread.run_sync(done.set, token=token)
        except RuntimeError:  # the loop has closed; nobody is waiting any more
            pass

    cf.add_done_callback(wake)
    await done.wait()
    return cf.result()


class SamplingFailed(RuntimeError):
    """The Tinker service refused or failed a sample; the message is the service's reason."""


# The SDK wraps a failed request's reason in its own internals (the request id, the expected
# response class): an agent is shown the reason alone.
_SDK_WRAPPED = re.compile(
    r"^(?:Request failed: |Error retrieving result: )?(?P<reason>.*?)"
    r"(?: with status \d+)?(?: \(status \d+\))? for self\.request_id=.*$",
    re.S,
)


def _server_reason(message: str) -> str | None:
    found = _SDK_WRAPPED.match(message)
    return found["reason"] if found else None


class TinkerSampler:
    """A `Sampler` over one `tinker.SamplingClient` (one set of weights: one version)."""

    max_top_logprobs = 20  # the Tinker API returns the top alternatives at each sampled token

    def __init__(self, client: tinker.SamplingClient, version: int = 0) -> None:
        self.client = client
        self.version = version

    async def sample(
        self,
        prompt_tokens: Sequence[int],
        params: SampleParams,
        *,
        messages: list[dict[str, Any]] | None = None,
    ) -> SampledCompletion:
        import tinker

        future = self.client.sample(
            prompt=tinker.ModelInput.from_ints(list(prompt_tokens)),
            num_samples=1,
            sampling_params=tinker.SamplingParams(
                max_tokens=params.max_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,
                stop=params.stop,
                seed=params.seed,
            ),
            topk_sample_logprobs=params.top_logprobs,
        )
        try:
            result = await wait_future(future)
        except Exception as exc:
            reason = _server_reason(str(exc))
            if reason is None:
                raise
            raise SamplingFailed(reason) from exc
        sequence = result.sequences[0]
        logprobs = sequence.logprobs
        if logprobs is None:
            raise RuntimeError("the Tinker service returned no logprobs; they are needed for training")
        top = None
        if params.top_logprobs:
            if sequence.topk_logprobs is None:
                raise RuntimeError("the Tinker service returned no top logprobs, which the call asked for")
            top = [[(int(t), float(lp)) for t, lp in at or []] for at in sequence.topk_logprobs]
        return SampledCompletion(
            tokens=list(sequence.tokens),
            logprobs=[float(x) for x in logprobs],
            stop_reason="length" if sequence.stop_reason == "length" else "stop",
            top_logprobs=top,
        )


class StreamingTinkerSampler(TinkerSampler):
    """A `TinkerSampler` on a server that streams samples (platoon's embedded one, through the
    route its capabilities name): `sample_stream` hands out the tokens as they are drawn, and
    they join into exactly what `sample` returns for the same seed."""

    def __init__(
        self, client: tinker.SamplingClient, version: int, stream_url: str, *, constrains: bool = False
    ) -> None:
        super().__init__(client, version)
        self._url = stream_url
        self.constrains = constrains
        config = client.holder.shadow_config
        self._key = config.api_key
        handle = json.loads(base64.urlsafe_b64decode(client.get_sampler_handle()))
        self._session: str = handle["sampling_session_id"]

    async def sample_stream(
        self,
        prompt_tokens: Sequence[int],
        params: SampleParams,
        *,
        messages: list[dict[str, object]] | None = None,
    ) -> AsyncIterator[SampledChunk]:
        body = {
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": list(prompt_tokens)}]},
            "sampling_params": {
                "max_tokens": params.max_tokens,
                "seed": params.seed,
                "stop": params.stop,
                "temperature": params.temperature,
                "top_k": params.top_k,
                "top_p": params.top_p,
            },
            "sampling_session_id": self._session,
            "topk_sample_logprobs": params.top_logprobs,
        }
        if params.constraint is not None and self.constrains:
            body["constraint"] = params.constraint
        async with (
            _http(self._key, read=None) as http,
            http.stream("POST", self._url, content=msgspec.json.encode(body)) as response,
        ):
            if response.status_code != 200:
                await response.aread()
                raise SamplingFailed(_error_of(response.content, response.status_code))
            async for line in response.aiter_lines():
                if not line:
                    continue
                piece = msgspec.json.decode(line, type=_StreamedLine)
                if piece.error is not None:
                    raise SamplingFailed(piece.error)
                yield SampledChunk(
                    tokens=piece.tokens,
                    logprobs=piece.logprobs,
                    stop_reason=piece.stop_reason,
                    top_logprobs=piece.top_logprobs if params.top_logprobs else None,
                )
                if piece.stop_reason is not None:
                    return
        raise SamplingFailed("the server's sample stream ended before the sequence did")


class _StreamedLine(msgspec.Struct):
    """A line of the embedded server's sample stream (`platoon.backends.local.streams`)."""

    tokens: list[int] = []
    logprobs: list[float] = []
    top_logprobs: list[list[tuple[int, float]]] = []
    stop_reason: Literal["stop", "length"] | None = None
    error: str | None = None


def _error_of(body: bytes, status: int) -> str:
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    return error if isinstance(error, str) else f"the server answered {status}"


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for the process (building one loads the CA bundle: milliseconds)."""
    return httpx.create_ssl_context()


def _http(api_key: str | None, *, read: float | None) -> httpx.AsyncClient:
    headers = {"Content-Type": "application/json"} | ({"X-API-Key": api_key} if api_key else {})
    return httpx.AsyncClient(verify=_tls(), headers=headers, timeout=httpx.Timeout(30.0, read=read))


# base URL -> its sample stream route (None: not offered), and whether the route takes a constraint
_STREAM_URLS: dict[str, tuple[str | None, bool]] = {}


async def _stream_route(base_url: str, api_key: str | None) -> tuple[str | None, bool]:
    base_url = base_url.rstrip("/")
    if base_url not in _STREAM_URLS:
        path = None
        takes: object = []
        try:
            async with _http(api_key, read=30.0) as http:
                response = await http.get(f"{base_url}/api/v1/get_server_capabilities")
                response.raise_for_status()
                platoon = response.json().get("platoon", {})
                path = platoon.get("routes", {}).get("sample_stream")
                takes = platoon.get("sample_stream_takes", [])
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            log.debug("the Tinker server's capabilities are unknown; samples come whole", error=str(exc))
        # Only a path on the same server: the key goes nowhere else.
        ok = isinstance(path, str) and path.startswith("/") and not path.startswith("//")
        constrains = ok and isinstance(takes, list) and "constraint" in takes
        _STREAM_URLS[base_url] = (f"{base_url}{path}" if ok else None, constrains)
    return _STREAM_URLS[base_url]


async def stream_url(base_url: str, api_key: str | None) -> str | None:
    """The URL of the sample stream route of the Tinker server at `base_url`, when it offers
    one; asked once per base URL (hosted Tinker is asked once, and offers none)."""
    return (await _stream_route(base_url, api_key))[0]


async def tinker_sampler(client: tinker.SamplingClient, version: int = 0) -> TinkerSampler:
    """A sampler over `client`: a streaming one when its server streams samples (and one that
    constrains its decoding when the stream route takes a constraint)."""
    config = client.holder.shadow_config
    url, constrains = await _stream_route(config.base_url, config.api_key)
    if url is None:
        return TinkerSampler(client, version)
    return StreamingTinkerSampler(client, version, url, constrains=constrains)


class TinkerSamplerFactory:
    """Makes a `TinkerSampler` for the base model, then one per `PolicyUpdated`."""

    def __init__(
        self,
        service_client: tinker.ServiceClient,
        base_model: str,
        *,
        model_path: str | None = None,
        version: int = 0,
    ):
        self.service_client = service_client
        self.base_model = base_model
        self.model_path = model_path
        self.version = version

    async def initial(self) -> TinkerSampler:
        if self.model_path:
            client = await sampling_client(self.service_client, model_path=self.model_path)
        else:
            client = await sampling_client(self.service_client, base_model=self.base_model)
        return await tinker_sampler(client, self.version)

    async def updated(self, event: PolicyUpdated) -> TinkerSampler:
        return await tinker_sampler(
            await sampling_client(self.service_client, model_path=event.sampler_path), event.version
        )


async def sampling_client(
    service_client: tinker.ServiceClient, *, model_path: str | None = None, base_model: str | None = None
) -> tinker.SamplingClient:
    """`create_sampling_client` in a worker thread: the SDK may block while it sets up."""

    def create() -> tinker.SamplingClient:
        return service_client.create_sampling_client(model_path=model_path, base_model=base_model).result()

    return await sdk_call(create)


async def sdk_call(call: Callable[[], T]) -> T:
    """A blocking Tinker SDK call in a worker thread; a server this SDK cannot talk to is said
    in one line (`AssemblyError`) instead of the SDK's traceback."""
    try:
        return await anyio.to_thread.run_sync(call)
    except Exception as exc:
        unsupported = _unsupported_server(exc)
        if unsupported is None:
            raise
        raise unsupported from None


@contextlib.asynccontextmanager
async def closing(service_client: tinker.ServiceClient) -> AsyncIterator[tinker.ServiceClient]:
    """Finish the client's Tinker session on the way out (success, or errored on an error),
    which also stops its heartbeats: a session left open keeps pinging a server that is gone."""
    status: Literal["success", "errored"] = "errored"
    try:
        yield service_client
        status = "success"
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            try:
                await anyio.to_thread.run_sync(lambda: service_client.close(status).result(timeout=10))
            except Exception as exc:  # the server may already be gone; nothing is lost
                log.debug("closing the Tinker session failed", error=str(exc))


_NO_SERVICE = (
    "no training service: set TINKER_API_KEY for hosted Tinker, TINKER_BASE_URL or "
    "tinker_base_url for a self-hosted one, or train.backend=local for the embedded one "
    "(rollout and eval also take --policy scripted:MODULE:ATTR)"
)


def tinker_service_client(base_url: str | None) -> tinker.ServiceClient:
    """A `tinker.ServiceClient` for `base_url`, else `$TINKER_BASE_URL`, else hosted Tinker."""
    try:
        import tinker
    except ImportError:
        raise AssemblyError(
            "sampling a Tinker policy needs the tinker extra: pip install 'platoon[tinker]'"
        ) from None
    base_url, api_key = tinker_endpoint(base_url)
    return tinker.ServiceClient(base_url=base_url, api_key=api_key or "tml-local")


_OLD_WIRE = (
    "it speaks the Tinker API of SDKs before 0.25 (as skyrl-tx 0.3 does), which the tinker 0.38 that "
    "platoon uses cannot read; train on platoon's embedded server (train.backend=local) or hosted "
    "Tinker (docs/how-to/self-hosted-tinker.md has the servers tried)"
)


def _unsupported_server(exc: BaseException) -> AssemblyError | None:
    """A Tinker server this SDK cannot talk to, said in one line (None: another failure).

    Such a server lacks `client/config` (the SDK's first call) or answers results as JSON where
    the SDK reads only protobuf."""
    response = getattr(exc, "response", None)
    if getattr(exc, "status_code", None) == 404 and response is not None:
        url = response.request.url
        if url.path.endswith("/client/config"):
            where = f"{url.scheme}://{url.host}" + (f":{url.port}" if url.port else "")
            return AssemblyError(f"the Tinker server at {where} has no {url.path}: {_OLD_WIRE}")
    if isinstance(exc, ValueError) and "Server returned a JSON payload" in str(exc):
        return AssemblyError(f"the Tinker server answered in JSON where this SDK reads protobuf: {_OLD_WIRE}")
    return None


def service_key(client: tinker.ServiceClient) -> str | None:
    """The key a service client sends (the run's own embedded server's, for its judges)."""
    key = client.holder.shadow_config.api_key
    return key if isinstance(key, str) else None


def tinker_endpoint(configured: str | None) -> tuple[str | None, str | None]:
    """(base URL, API key) of the Tinker service; raises when none is named. The key is the one
    this user's `platoon serve tinker` published when the URL is such a server on loopback, else
    `$TINKER_API_KEY`."""
    base_url = configured or os.environ.get("TINKER_BASE_URL")
    api_key = published_key_for(base_url) or os.environ.get("TINKER_API_KEY")
    if base_url is None and not api_key:
        raise AssemblyError(_NO_SERVICE)
    return base_url, api_key

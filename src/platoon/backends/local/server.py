"""The Tinker HTTP API (as the `tinker` 0.38 SDK speaks it): the app over a `TinkerService`.

JSON everywhere except forward/backward requests and the forward/backward and sample results,
which are protobuf. Here: the routes, the key and body-size guard, and how a refused training
request still uses up its seq_id. The handlers are the service's (`service`), the REST half's
(`rest`).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Awaitable, Callable

import anyio
import anyio.to_thread
import msgspec
import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from platoon.backends.local.proto import ProtoError, peek_seq
from platoon.backends.local.rest import rest_routes
from platoon.backends.local.service import Answer, TinkerService, UserError, error_response
from platoon.backends.local.specs import EngineError
from platoon.backends.local.streams import SAMPLE_STREAM, sample_stream
from platoon.backends.local.unoffered import unoffered_routes
from platoon.serving import BodyTooLarge, Guard, Scope, read_body_limited

__all__ = ["TinkerService", "create_app"]

MAX_BODY = 256 * 2**20  # a request as sent (a large training batch, zstd-compressed or not)
# What a request may decode to. A training batch or a prompt can be large; every other request
# is a few ids and numbers. A compressed body is refused as soon as it decodes past its route's cap.
SMALL_DECODED = 4 * 2**20
PROMPT_DECODED = 32 * 2**20
INLINE_BYTES = 2**20  # a body past this (or any compressed one) is decoded on a worker thread


log = structlog.get_logger(__name__)


class _SeqIds(msgspec.Struct):
    model_id: str | None = None
    seq_id: int | None = None


def _seq_of(exc: Exception, body: bytes) -> tuple[str, int] | None:
    """The (model_id, seq_id) a rejected training request named, if it named them."""
    if isinstance(exc, ProtoError) and exc.seq is not None:
        return exc.seq
    if isinstance(exc, BodyTooLarge):
        return peek_seq(exc.prefix)
    if body[:1] != b"{":
        return peek_seq(body)
    try:
        ids = msgspec.json.decode(body, type=_SeqIds)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    return (ids.model_id, ids.seq_id) if ids.model_id is not None and ids.seq_id is not None else None


_REFUSED = (UserError, EngineError, ProtoError, msgspec.DecodeError, ValueError, TypeError, KeyError)


def _route(
    service: TinkerService,
    handler: Callable[[bytes], Awaitable[Answer]],
    max_decoded: int,
    *,
    big_bodies: anyio.Lock,
    ordered: bool = False,
) -> Callable[[Request], Awaitable[Response]]:
    """An endpoint. An `ordered` one (a model's training requests) that rejects a request, for
    whatever reason, still uses up its seq_id with a failure, so the client's later requests
    do not wait for it forever."""

    async def endpoint(request: Request) -> Response:
        raw, encoding = await request.body(), request.headers.get("content-encoding")
        if len(raw) <= INLINE_BYTES and encoding in (None, "", "identity"):
            return await answer(request, raw, encoding, inline=True)
        # A large or compressed body decodes off the event loop, so the server answers others (and
        # signals) meanwhile; and one at a time, decoded and handled, so that a few small bombs
        # cannot add up in memory.
        async with big_bodies:
            return await answer(request, raw, encoding, inline=False)

    async def answer(request: Request, raw: bytes, encoding: str | None, *, inline: bool) -> Response:
        body = b""
        try:
            if inline:
                body = read_body_limited(raw, encoding, max_decoded)
            else:
                body = await anyio.to_thread.run_sync(read_body_limited, raw, encoding, max_decoded)
            result = await handler(body)
        except Exception as exc:
            if isinstance(exc, BodyTooLarge):
                message, status = str(exc), 413
            elif isinstance(exc, msgspec.DecodeError):
                message, status = f"bad request body: {exc}", 400
            elif isinstance(exc, _REFUSED):
                message, status = str(exc), 400
            else:
                log.exception("request refused", path=request.url.path)
                message, status = f"internal error: {exc!r}", 500
            seq = _seq_of(exc, body) if ordered else None
            if seq is not None:
                service.skip(*seq, message)
            # An error raised on a worker thread sits in a cycle (anyio's future holds it, its
            # traceback holds the future's frame), and its traceback holds every frame it passed,
            # with the decoded body: cut, or each refused body waits for the cyclic collector.
            exc.__traceback__ = None
            return error_response(message, status, "server" if status == 500 else "user")
        if isinstance(result, Response):
            return result
        return Response(msgspec.json.encode(result), media_type="application/json")

    return endpoint


def _path_routes(service: TinkerService) -> list[Route]:
    """The routes that read their path (a session's finish, a sampler) or no body at all."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def capabilities(request: Request) -> Response:
        return JSONResponse(service.capabilities())

    async def get_sampler(request: Request) -> Response:
        result = await service.get_sampler(request.path_params["sampler_id"])
        return result if isinstance(result, Response) else JSONResponse(result)

    async def finish(request: Request) -> Response:
        result = await service.finish_session(request.path_params["session_id"], await request.body())
        return result if isinstance(result, Response) else JSONResponse(result)

    return [
        Route("/api/v1/sessions/{session_id}/finish", finish, methods=["POST"]),
        Route("/api/v1/samplers/{sampler_id:path}", get_sampler, methods=["GET"]),
        Route("/api/v1/healthz", healthz, methods=["GET"]),
        Route("/api/v1/get_server_capabilities", capabilities, methods=["GET"]),
    ]


def create_app(service: TinkerService, *, max_body: int = MAX_BODY) -> Guard:
    """The app serving `service` under /api/v1, behind the key and body-size guard.

    `service.api_key`, when set, is required on every route (the SDK sends it on each).
    """

    ordered_paths: set[str] = set()
    big_bodies = anyio.Lock()  # one for the app: large bodies are decoded and handled one at a time

    def post(
        path: str,
        handler: Callable[[bytes], Awaitable[Answer]],
        *,
        ordered: bool = False,
        decoded: int = SMALL_DECODED,
    ) -> Route:
        endpoint = _route(service, handler, min(decoded, max_body), big_bodies=big_bodies, ordered=ordered)
        if ordered:
            ordered_paths.add(f"/api/v1{path}")
        return Route(f"/api/v1{path}", endpoint, methods=["POST"])

    async def ok(body: bytes) -> Answer:
        return {"status": "accepted"}

    routes = [
        post("/client/config", service.client_config),
        post("/client/dynamic_config", service.dynamic_config),
        post("/create_session", service.create_session),
        post("/session_heartbeat", service.heartbeat),
        post("/telemetry", ok),
        post("/create_model", service.create_model),
        post("/get_info", service.get_info),
        post("/forward_backward", service.forward_backward, ordered=True, decoded=max_body),
        post("/optim_step", service.optim_step, ordered=True),
        post("/save_weights", service.save_weights, ordered=True),
        post("/save_weights_for_sampler", service.save_weights_for_sampler, ordered=True),
        post("/load_weights", service.load_weights, ordered=True),
        post("/save_weights_external", service.save_weights_external, ordered=True),
        post("/copy_weights", service.copy_weights),
        post("/unload_model", service.unload_model),
        post("/create_sampling_session", service.create_sampling_session),
        post("/asample", service.asample, decoded=PROMPT_DECODED),
        post("/retrieve_future", service.retrieve_future),
        post("/retrieve_futures", service.retrieve_futures),
        post("/cancel_future", service.cancel_future),
        post("/join_sampling_session", service.join_sampling_session),
        *_path_routes(service),
        Route(
            SAMPLE_STREAM,
            _route(
                service,
                sample_stream(service.sampler, service.sample_request),
                min(PROMPT_DECODED, max_body),
                big_bodies=big_bodies,
            ),
            methods=["POST"],
        ),
        *unoffered_routes(),
        *rest_routes(service),
    ]
    app = Starlette(routes=routes, lifespan=service.lifespan)

    def oversized(scope: Scope, head: bytes) -> None:
        """A training request refused for its size still gives up its seq_id, when its first
        bytes name it."""
        if scope.get("path") not in ordered_paths:
            return
        encoding = dict(scope.get("headers") or []).get(b"content-encoding", b"").decode("latin-1")
        seq = _seq_in_head(_decoded_head(head, encoding))
        if seq is not None:
            service.skip(*seq, f"request body over {max_body} bytes")

    return Guard(app, api_key=service.api_key, max_body=max_body, on_oversized=oversized)


_JSON_IDS = re.compile(rb'"model_id"\s*:\s*"([^"\\]{1,200})"|"seq_id"\s*:\s*(\d{1,18})')


def _decoded_head(head: bytes, encoding: str) -> bytes:
    """As much of a compressed body's start as its first bytes decode to (never more than 64 KiB)."""
    try:
        if encoding == "zstd":
            import zstandard

            return zstandard.ZstdDecompressor().decompressobj().decompress(head)[: 1 << 16]
        if encoding == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 1 << 16)
    except Exception:
        return b""
    return head


def _seq_in_head(head: bytes) -> tuple[str, int] | None:
    """(model_id, seq_id) from the start of a training request: protobuf or JSON."""
    if not head.lstrip().startswith(b"{"):
        return peek_seq(head)
    model_id = seq_id = None
    for match in _JSON_IDS.finditer(head):
        if match.group(1) is not None and model_id is None:
            model_id = match.group(1).decode("utf-8", "replace")
        elif match.group(2) is not None and seq_id is None:
            seq_id = int(match.group(2))
    return (model_id, seq_id) if model_id is not None and seq_id is not None else None

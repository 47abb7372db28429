"""The gateway over HTTP: OpenAI- and Anthropic-compatible endpoints for harnesses that bring
their own model client.

Each request authenticates with its agent's key (`Authorization: Bearer <key>` or
`x-api-key`), so an agent can only add calls to its own record. The header
`X-Platoon-Call-Kind: policy|aux|judge` marks what a call is: policy calls train and count
against the budget, aux calls train for free, judge calls are recorded and never trained.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from platoon.gateway import dialects
from platoon.gateway.core import AgentSession, Completion, GatewayError
from platoon.serving import Guard, presented_key

if TYPE_CHECKING:
    from platoon.gateway.core import Gateway

__all__ = ["build_app", "serve_gateway"]

_STATUS = {
    "bad_request": 400,
    "context_length": 400,
    "budget": 400,
    "auth": 401,
    "sampler": 502,
    "overloaded": 429,
}
_OPENAI_TYPE = {
    "bad_request": "invalid_request_error",
    "context_length": "invalid_request_error",
    "budget": "insufficient_quota",
    "auth": "authentication_error",
    "sampler": "server_error",
    "overloaded": "rate_limit_error",
}
_OPENAI_CODE = {
    "context_length": "context_length_exceeded",
    "budget": "budget_exhausted",
    "auth": "invalid_api_key",
    "overloaded": "rate_limit_exceeded",
}
_ANTHROPIC_TYPE = {
    "bad_request": "invalid_request_error",
    "context_length": "invalid_request_error",
    "budget": "invalid_request_error",
    "auth": "authentication_error",
    "sampler": "api_error",
    "overloaded": "rate_limit_error",
}


def _openai_error(kind: str, message: str, param: str | None = None) -> JSONResponse:
    body = {
        "error": {
            "message": message,
            "type": _OPENAI_TYPE.get(kind, "invalid_request_error"),
            "param": param,
            "code": _OPENAI_CODE.get(kind),
        }
    }
    headers = {"retry-after": "1"} if kind == "overloaded" else None
    return JSONResponse(body, status_code=_STATUS.get(kind, 400), headers=headers)


def _anthropic_error(kind: str, message: str) -> JSONResponse:
    if kind == "context_length":
        message = f"prompt is too long: {message}"
    body = {
        "type": "error",
        "error": {"type": _ANTHROPIC_TYPE.get(kind, "invalid_request_error"), "message": message},
    }
    return JSONResponse(body, status_code=_STATUS.get(kind, 400))


def _key(request: Request) -> str | None:
    return presented_key(request.scope)


def _kind(request: Request) -> str:
    kind = request.headers.get("x-platoon-call-kind", "policy").lower()
    if kind not in ("policy", "aux", "judge"):
        raise GatewayError("bad_request", "X-Platoon-Call-Kind must be policy, aux or judge")
    return kind


_INLINE_BODY = 1 << 20  # larger bodies are parsed on a worker thread
# A JSON escape of a UTF-16 surrogate: only such bodies need the lone-surrogate check.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range for a number")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _parse(body: bytes) -> Any:
    value = json.loads(body, parse_float=_finite, parse_constant=_no_constant)
    if _SURROGATE_ESCAPE.search(body):
        json.dumps(value, ensure_ascii=False).encode()  # raises on a lone surrogate
    return value


async def _json(request: Request) -> Any:
    body = await request.body()
    try:
        return await anyio.to_thread.run_sync(_parse, body) if len(body) > _INLINE_BODY else _parse(body)
    except RecursionError:
        raise dialects.DialectError("the body is nested too deeply") from None
    except UnicodeError:
        raise dialects.DialectError("the body holds a string that is not valid Unicode") from None
    except ValueError as exc:  # JSONDecodeError included
        raise dialects.DialectError(f"the body is not valid JSON: {exc}") from None


def _sse(events: Iterable[str | tuple[str, str]]) -> StreamingResponse:
    def lines():
        for item in events:
            if isinstance(item, tuple):
                yield f"event: {item[0]}\ndata: {item[1]}\n\n"
            else:
                yield f"data: {item}\n\n"

    return StreamingResponse(lines(), media_type="text/event-stream", headers={"cache-control": "no-cache"})


def build_app(gateway: Gateway) -> Guard:
    """The ASGI app of a gateway."""

    def token_texts(tokens: list[int]) -> list[str]:
        return [gateway.renderer.tokenizer.decode([t]) for t in tokens]

    async def answer(
        request: Request, call: Callable[[AgentSession, Any], Any], error: Callable[..., JSONResponse]
    ) -> Response:
        try:
            session = gateway.authenticate(_key(request))
            if session.in_flight >= gateway.max_calls_per_agent:
                raise GatewayError(
                    "overloaded", f"at most {gateway.max_calls_per_agent} calls of one agent at a time"
                )
            session.in_flight += 1
            try:
                body = await _json(request)
                return await call(session, body)
            finally:
                session.in_flight -= 1
        except dialects.DialectError as exc:
            return (
                error("bad_request", str(exc), exc.param)
                if error is _openai_error
                else error("bad_request", str(exc))
            )
        except GatewayError as exc:
            return (
                error(exc.kind, str(exc), exc.param) if error is _openai_error else error(exc.kind, str(exc))
            )

    async def chat_completions(request: Request) -> Response:
        async def call(session: AgentSession, body: Any) -> Response:
            messages, tools, params, n, stream = dialects.chat_request(body)
            kind = _kind(request)
            done: list[Completion] = []
            for _ in range(n):
                done.append(await gateway.complete(session, messages, tools, params, kind, wait=False))
            want_logprobs = bool(body.get("logprobs"))
            choices = [
                (c.message, c.finish_reason, (token_texts(c.tokens), c.logprobs) if want_logprobs else None)
                for c in done
            ]
            usage = (done[0].prompt_tokens, sum(c.completion_tokens for c in done))
            response = dialects.chat_response(
                body.get("model") or gateway.model_name, choices, usage, done[0].call_id
            )
            if stream:
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return _sse(dialects.chat_stream(response, include_usage))
            return JSONResponse(response)

        return await answer(request, call, _openai_error)

    def one_completion(
        parse: Callable[..., Any], shape: Callable[..., Any], stream_events: Callable[..., Any]
    ):
        """An endpoint of a dialect that answers with one completion (Responses, Messages)."""

        async def call(request: Request, session: AgentSession, body: Any) -> Response:
            messages, tools, params, stream = parse(body)
            c = await gateway.complete(session, messages, tools, params, _kind(request), wait=False)
            usage = (c.prompt_tokens, c.completion_tokens)
            response = shape(
                body.get("model") or gateway.model_name, c.message, c.finish_reason, usage, c.call_id
            )
            return _sse(stream_events(response)) if stream else JSONResponse(response)

        return call

    responses_call = one_completion(
        dialects.responses_request, dialects.responses_response, dialects.responses_stream
    )
    messages_call = one_completion(
        dialects.anthropic_request, dialects.anthropic_response, dialects.anthropic_stream
    )

    async def responses(request: Request) -> Response:
        return await answer(request, lambda s, b: responses_call(request, s, b), _openai_error)

    async def messages_endpoint(request: Request) -> Response:
        return await answer(request, lambda s, b: messages_call(request, s, b), _anthropic_error)

    async def count_tokens(request: Request) -> Response:
        async def call(session: AgentSession, body: Any) -> Response:
            body = dict(body) if isinstance(body, dict) else body
            if isinstance(body, dict):
                body.setdefault("max_tokens", 1)
            messages, tools, _, _ = dialects.anthropic_request(body)
            try:
                tokens = gateway.renderer.render(messages, tools)
            except ValueError as exc:
                raise dialects.DialectError(str(exc), "messages") from None
            return JSONResponse({"input_tokens": len(tokens)})

        return await answer(request, call, _anthropic_error)

    async def models(request: Request) -> Response:
        try:
            gateway.authenticate(_key(request))
        except GatewayError as exc:
            return _openai_error(exc.kind, str(exc))
        model = {"id": gateway.model_name, "object": "model", "created": 0, "owned_by": "platoon"}
        return JSONResponse({"object": "list", "data": [model]})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def not_found(request: Request, exc: Exception) -> Response:
        message = f"no route {request.method} {request.url.path}"
        body = {
            "error": {"message": message, "type": "invalid_request_error", "param": None, "code": "not_found"}
        }
        return JSONResponse(body, status_code=404)

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        body = {
            "error": {
                "message": f"{request.method} is not allowed on {request.url.path}",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
        return JSONResponse(body, status_code=405)

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
            Route("/v1/messages", messages_endpoint, methods=["POST"]),
            Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        exception_handlers={404: not_found, 405: method_not_allowed},
    )
    # Agents' keys are checked per route (each agent has its own); the guard caps bodies.
    return Guard(app, max_body=gateway.max_body, max_in_flight=4096)


async def serve_gateway(
    gateway: Gateway,
    host: str,
    port: int,
    *,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the gateway's HTTP app; `task_status` gets its `/v1` base URL."""
    from platoon.serving import serve_asgi

    async with anyio.create_task_group() as tg:
        url = await tg.start(serve_asgi, build_app(gateway), host, port)
        task_status.started(f"{url}/v1")

"""The gateway over HTTP: OpenAI- and Anthropic-compatible endpoints for harnesses that bring
their own model client.

Each request authenticates with its agent's key (`Authorization: Bearer <key>` or
`x-api-key`), so an agent can only add calls to its own record. The header
`X-Platoon-Call-Kind: policy|aux|judge` marks what a call is: policy calls train and count
against the budget, aux calls train for free, judge calls are recorded and never trained.
"""

from __future__ import annotations

import functools
import json
import math
import re
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
)
from typing import Literal, NoReturn, Protocol, TypedDict, TypeVar

import anyio
import anyio.abc
import anyio.to_thread
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from platoon.bus.events import CallKind, new_id
from platoon.gateway import bodies, dialects
from platoon.gateway.core import Gateway
from platoon.gateway.errors import GatewayError
from platoon.gateway.sessions import AgentSession, Completion
from platoon.gateway.shapes import (
    AnthropicReply,
    ChatCompletion,
    JsonObject,
    Messages,
    ResponsesReply,
)
from platoon.serving import BodyApp, Guard, Receive, Scope, Send, header, presented_key, serve_asgi

__all__ = ["build_app", "serve_gateway"]

_STATUS = {
    "not_found": 404,
    "bad_request": 400,
    "context_length": 400,
    "budget": 400,
    "auth": 401,
    "sampler": 502,
    "overloaded": 429,
}
_OPENAI_TYPE = {
    "not_found": "invalid_request_error",
    "bad_request": "invalid_request_error",
    "context_length": "invalid_request_error",
    "budget": "insufficient_quota",
    "auth": "authentication_error",
    "sampler": "server_error",
    "overloaded": "rate_limit_error",
}
_OPENAI_CODE = {
    "not_found": "model_not_found",
    "context_length": "context_length_exceeded",
    "budget": "budget_exhausted",
    "auth": "invalid_api_key",
    "overloaded": "rate_limit_exceeded",
}
_ANTHROPIC_TYPE = {
    "not_found": "not_found_error",
    "bad_request": "invalid_request_error",
    "context_length": "invalid_request_error",
    "budget": "invalid_request_error",
    "auth": "authentication_error",
    "sampler": "api_error",
    "overloaded": "rate_limit_error",
}


Event = str | tuple[str, str]  # an SSE `data:` payload, or an (event, data) pair
Body = Mapping[str, object]  # a request's parsed JSON object


_Reply = TypeVar("_Reply")  # a dialect's finished response
_Reply_contra = TypeVar("_Reply_contra", contravariant=True)


class _Format(Protocol[_Reply_contra]):
    """A dialect's stream (`dialects.ChatStream`, `ResponsesStream`, `MessagesStream`)."""

    def start(self) -> Iterator[Event]: ...

    def delta(self, text: str) -> Iterator[Event]: ...

    def end(self, response: _Reply_contra) -> Iterator[Event]: ...

    def error(self, kind: str, message: str) -> Iterator[Event]: ...


class _JSON:
    """A 200 JSON response encoded by msgspec (several times faster than `json.dumps`), sent as
    starlette's `JSONResponse` sends it, without building one."""

    __slots__ = ("body",)

    def __init__(self, content: object) -> None:
        self.body = msgspec.json.encode(content)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        length = str(len(self.body)).encode("latin-1")
        headers = [(b"content-length", length), (b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})


_Answer = Response | _JSON  # what an endpoint answers: an ASGI response


def _openai_error(kind: str, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    body = {
        "error": {
            "message": message,
            "type": _OPENAI_TYPE.get(kind, "invalid_request_error"),
            "param": param,
            "code": code or _OPENAI_CODE.get(kind),
        }
    }
    headers = {"retry-after": "1"} if kind == "overloaded" else None
    return JSONResponse(body, status_code=_STATUS.get(kind, 400), headers=headers)


def _anthropic_error(
    kind: str, message: str, param: str | None = None, code: str | None = None
) -> JSONResponse:
    """Anthropic's error body: a type and a message (no param, no code)."""
    if kind == "context_length":
        message = f"prompt is too long: {message}"
    body = {
        "type": "error",
        "error": {"type": _ANTHROPIC_TYPE.get(kind, "invalid_request_error"), "message": message},
    }
    return JSONResponse(body, status_code=_STATUS.get(kind, 400))


class _ErrorResponse(Protocol):
    """A dialect's error response (`_openai_error`, `_anthropic_error`)."""

    def __call__(
        self, kind: str, message: str, param: str | None = None, code: str | None = None
    ) -> JSONResponse: ...


_Api = Literal["chat", "responses", "messages"]


def _no_model(api: _Api) -> GatewayError:
    """A body without a model, as each API answers it."""
    if api == "chat":
        return GatewayError("bad_request", "you must provide a model parameter")
    if api == "responses":
        return GatewayError(
            "bad_request",
            "Missing required parameter: 'model'.",
            param="model",
            code="missing_required_parameter",
        )
    return GatewayError("bad_request", "model: Field required", param="model")


_CALL_KINDS: dict[str, CallKind] = {"policy": "policy", "aux": "aux", "judge": "judge"}


def _kind(scope: Scope) -> CallKind:
    kind = _CALL_KINDS.get((header(scope, b"x-platoon-call-kind") or "policy").lower())
    if kind is None:
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


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _parse(body: bytes) -> object:
    try:
        return _DECODER.decode(body)  # refuses NaN, infinities, lone surrogates; not UTF-16
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    # Read again by the standard library, which accepts any JSON encoding and says what is wrong.
    value = json.loads(body, parse_float=_finite, parse_constant=_no_constant)
    if _SURROGATE_ESCAPE.search(body):
        json.dumps(value, ensure_ascii=False).encode()  # raises on a lone surrogate
    return value


_DECODER = msgspec.json.Decoder()


async def _json(body: bytes) -> Body:
    try:
        value = await anyio.to_thread.run_sync(_parse, body) if len(body) > _INLINE_BODY else _parse(body)
    except RecursionError:
        raise dialects.DialectError("the body is nested too deeply") from None
    except UnicodeError:
        raise dialects.DialectError("the body holds a string that is not valid Unicode") from None
    except ValueError as exc:  # JSONDecodeError included
        raise dialects.DialectError(f"the body is not valid JSON: {exc}") from None
    if not isinstance(value, Mapping):
        raise dialects.DialectError("the body must be a JSON object")
    return value


def _sse(events: AsyncIterator[Event]) -> StreamingResponse:
    async def lines() -> AsyncIterator[str]:
        async for item in events:
            if isinstance(item, tuple):
                yield f"event: {item[0]}\ndata: {item[1]}\n\n"
            else:
                yield f"data: {item}\n\n"

    return StreamingResponse(lines(), media_type="text/event-stream", headers={"cache-control": "no-cache"})


async def _streamed(
    replies: AsyncGenerator[str | Completion, None],
    format: _Format[_Reply],
    finish: Callable[[Completion], _Reply],
) -> Response:
    """An SSE response that sends each content delta of `replies` as it is sampled.

    The first item is awaited here, so a call that fails before sampling (a bad request, the
    context, the budget) is still answered with its HTTP status; a failure mid-stream becomes
    the dialect's error event.
    """
    first = await anext(replies)

    async def events() -> AsyncIterator[Event]:
        try:
            for event in format.start():
                yield event
            item = first
            while not isinstance(item, Completion):
                for event in format.delta(item):
                    yield event
                item = await anext(replies)
            for event in format.end(finish(item)):
                yield event
        except GatewayError as exc:
            for event in format.error(_OPENAI_TYPE.get(exc.kind, "server_error"), str(exc)):
                yield event
        finally:
            await replies.aclose()

    return _sse(events())


def _whole(events: Iterable[Event]) -> AsyncIterator[Event]:
    async def each() -> AsyncIterator[Event]:
        for event in events:
            yield event

    return each()


_KEPT_RESPONSES = 64  # per agent, for previous_response_id


def build_app(gateway: Gateway) -> Guard:
    """The ASGI app of a gateway: the endpoints below, which find the gateway in `app.state`."""
    app = Starlette(
        routes=[
            *(Route(path, _routed(endpoint), methods=["POST"]) for path, endpoint in _MODEL_CALLS.items()),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{model:path}", model, methods=["GET"]),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        exception_handlers={404: not_found, 405: method_not_allowed},
    )
    app.state.gateway = gateway
    # The model calls are answered straight from the guard, with the body it read; any other
    # request (another method, path or root path) goes through starlette's routing.
    served = {path: _served(app, endpoint) for path, endpoint in _MODEL_CALLS.items()}
    # Agents' keys are checked per route (each agent has its own); the guard caps bodies.
    return Guard(
        app,
        max_body=gateway.settings.max_body,
        max_in_flight=4096,
        bodied=functools.partial(_bodied, served),
    )


# --- the model calls -------------------------------------------------------------------------

_Endpoint = Callable[[Request, bytes], Awaitable[_Answer]]  # a model call's route: request and body
# A model call once its agent is known: the gateway, the agent, the request and its body.
_AgentCall = Callable[[Gateway, AgentSession, Request, bytes], Awaitable[_Answer]]


def _agent_call(error: _ErrorResponse) -> Callable[[_AgentCall], _Endpoint]:
    """A model call's endpoint: its agent known by its key and held to its calls in flight, a
    refusal answered as its dialect answers one (`error`)."""

    def endpoint(call: _AgentCall) -> _Endpoint:
        @functools.wraps(call)
        async def answer(request: Request, raw: bytes) -> _Answer:
            gateway: Gateway = request.app.state.gateway
            try:
                session = gateway.authenticate(presented_key(request.scope))
                most = gateway.settings.max_calls_per_agent
                if session.in_flight >= most:
                    raise GatewayError("overloaded", f"at most {most} calls of one agent at a time")
                session.in_flight += 1
                try:
                    return await call(gateway, session, request, raw)
                finally:
                    session.in_flight -= 1
            except dialects.DialectError as exc:
                return error("bad_request", str(exc), exc.param, exc.code)
            except GatewayError as exc:
                return error(exc.kind, str(exc), exc.param, exc.code)

        return answer

    return endpoint


@_agent_call(_openai_error)
async def chat_completions(gateway: Gateway, session: AgentSession, request: Request, raw: bytes) -> _Answer:
    """POST /v1/chat/completions: OpenAI's Chat Completions, `n` choices, streamed or whole."""
    body = await _json(raw)
    messages, tools, params, n, stream = dialects.chat_request(body)
    model = _model_of(gateway, body.get("model"), "chat")
    limit = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    _check_max_tokens(gateway, params.get("max_tokens"), limit, "chat", model)
    kind = _kind(request.scope)
    logprobs = bool(body.get("logprobs"))
    options = body.get("stream_options")  # an object or null: `chat_request` checked it
    include_usage = isinstance(options, Mapping) and bool(options.get("include_usage"))
    shape = functools.partial(_chat_completion, gateway, session, model, logprobs)
    if stream and n == 1:
        rid = new_id()
        replies = gateway.complete_stream(session, messages, tools, params, kind, **_OVER_HTTP)
        format = dialects.ChatStream(f"chatcmpl-{rid}", model, int(time.time()), include_usage)
        return await _streamed(replies, format, lambda c: shape([c], rid))
    done: list[Completion] = []
    for _ in range(n):
        done.append(await gateway.complete(session, messages, tools, params, kind, **_OVER_HTTP))
    response = shape(done, done[0].call_id)
    if stream:
        return _sse(_whole(dialects.chat_stream(response, include_usage)))
    return _JSON(response)


def _chat_completion(
    gateway: Gateway, session: AgentSession, model: str, logprobs: bool, done: list[Completion], rid: str
) -> ChatCompletion:
    """A chat completion of the choices `done` (with their tokens' logprobs, where asked)."""
    choices = [
        (c.message, c.finish_reason, _logprobs_of(gateway, session, c) if logprobs else None) for c in done
    ]
    usage = (done[0].prompt_tokens, sum(c.completion_tokens for c in done))
    return dialects.chat_response(model, choices, usage, rid)


@_agent_call(_openai_error)
async def responses(gateway: Gateway, session: AgentSession, request: Request, raw: bytes) -> _Answer:
    """POST /v1/responses: OpenAI's Responses, a stored response's conversation continued
    (`previous_response_id`), streamed or whole."""
    body = await _json(raw)
    messages, tools, params, stream = dialects.responses_request(body)
    model = _model_of(gateway, body.get("model"), "responses")
    _check_max_tokens(gateway, params.get("max_tokens"), "max_output_tokens", "responses", model)
    previous = body.get("previous_response_id")  # a string or null: `responses_request` checked it
    instructions = 1 if body.get("instructions") else 0
    if isinstance(previous, str) and previous:
        kept = session.responses.get(previous)
        if kept is None:
            raise GatewayError(
                "bad_request",
                f"Previous response with id '{previous}' not found. (Responses are kept for "
                "the episode's life when sent with store true, the default.)",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        # The earlier conversation, then this input; instructions are not carried over.
        messages = [*messages[:instructions], *kept[0], *messages[instructions:]]
    rid = new_id()
    include = body.get("include")  # a list of strings or null: `responses_request` checked it
    logprobs = isinstance(include, list) and dialects.RESPONSES_LOGPROBS in include

    def finish(c: Completion) -> ResponsesReply:
        usage = (c.prompt_tokens, c.completion_tokens)
        lp = _logprobs_of(gateway, session, c) if logprobs else None
        response = dialects.responses_response(model, c.message, c.finish_reason, usage, rid, lp)
        if body.get("store", True) is not False:
            session.responses[response["id"]] = ([*messages[instructions:], c.message], response)
            while len(session.responses) > _KEPT_RESPONSES:
                session.responses.popitem(last=False)
        return response

    asked, kind = Messages(messages), _kind(request.scope)
    if stream:
        format = dialects.ResponsesStream(f"resp_{rid}", model, int(time.time()))
        replies = gateway.complete_stream(session, asked, tools, params, kind, **_OVER_HTTP)
        return await _streamed(replies, format, finish)
    return _JSON(finish(await gateway.complete(session, asked, tools, params, kind, **_OVER_HTTP)))


@_agent_call(_anthropic_error)
async def anthropic_messages(
    gateway: Gateway, session: AgentSession, request: Request, raw: bytes
) -> _Answer:
    """POST /v1/messages: Anthropic's Messages, streamed or whole."""
    # Read straight into its struct; a body that is not a valid one is parsed to say why.
    read = bodies.decode(raw, bodies.MessagesRequest) or bodies.read(
        await _json(raw), bodies.MessagesRequest, "Messages", dialects.MESSAGES_WHOLE
    )
    conversation, tools, params, stream = dialects.anthropic_call(read)
    model = _model_of(gateway, read.model, "messages")
    _check_max_tokens(gateway, params.get("max_tokens"), "max_tokens", "messages", model)
    rid = new_id()

    def finish(c: Completion) -> AnthropicReply:
        usage = (c.prompt_tokens, c.completion_tokens)
        return dialects.anthropic_response(model, c.message, c.finish_reason, usage, rid, c.stop_sequence)

    asked, kind = Messages(conversation), _kind(request.scope)
    if stream:
        format = dialects.MessagesStream(f"msg_{rid}", model, 0)
        replies = gateway.complete_stream(session, asked, tools, params, kind, **_OVER_HTTP)
        return await _streamed(replies, format, finish)
    return _JSON(finish(await gateway.complete(session, asked, tools, params, kind, **_OVER_HTTP)))


@_agent_call(_anthropic_error)
async def count_tokens(gateway: Gateway, session: AgentSession, request: Request, raw: bytes) -> _Answer:
    """POST /v1/messages/count_tokens: the prompt's tokens, as the agent's own policy renders it."""
    body = await _json(raw)
    conversation, tools = dialects.count_tokens_request(body)
    _model_of(gateway, body.get("model"), "messages")
    try:
        tokens = gateway.policies[session.policy].renderer.render(conversation, tools)
    except ValueError as exc:
        raise dialects.DialectError(str(exc), "messages") from None
    return JSONResponse({"input_tokens": len(tokens)})


_MODEL_CALLS: dict[str, _Endpoint] = {
    "/v1/chat/completions": chat_completions,
    "/v1/responses": responses,
    "/v1/messages": anthropic_messages,
    "/v1/messages/count_tokens": count_tokens,
}


class _OverHttp(TypedDict):
    wait: bool
    record_messages: bool


# How `Gateway.complete` and `complete_stream` answer a call over HTTP: refused at once when the
# gateway is full (a client retries), and its messages recorded, since no `ChatRequested` holds them.
_OVER_HTTP: _OverHttp = {"wait": False, "record_messages": True}


def _logprobs_of(gateway: Gateway, session: AgentSession, c: Completion) -> dialects.Logprobs:
    """A reply's logprobs with each token's text, as the agent's own policy's tokenizer reads it."""
    decode = gateway.policies[session.policy].renderer.decode
    top = None if c.top_logprobs is None else [[(decode([t]), lp) for t, lp in at] for at in c.top_logprobs]
    return dialects.Logprobs([decode([t]) for t in c.tokens], c.logprobs, top)


def _model_of(gateway: Gateway, model: object, api: _Api) -> str:
    """The model a body asks for: one the gateway serves, or a 404; none is a 400, as each API
    answers it."""
    if model is None or model == "":
        raise _no_model(api)
    if not isinstance(model, str) or model not in gateway.model_names:
        raise GatewayError(
            "not_found",
            f"the model {model!r} does not exist here; this gateway serves {sorted(gateway.model_names)} "
            "(more names: gateway.model_aliases)",
            param="model",
        )
    return model


def _check_max_tokens(gateway: Gateway, value: object, name: str, api: _Api, model: str) -> None:
    """Refuse a max_tokens beyond the context window as each API refuses one beyond the
    model's output limit. One that fits the window but not beside the prompt is clamped to
    the room left (agents ask for their model's usual limit whatever the prompt)."""
    window = gateway.context_window
    if window is None or not isinstance(value, int) or value <= window:
        return
    if api == "messages":
        message = f"max_tokens: {value} > {window}, which is the maximum allowed number of output tokens for {model}"
    else:
        message = (
            f"{name} is too large: {value}. This model supports at most {window} completion tokens, "
            f"whereas you provided {value}."
        )
    raise GatewayError("bad_request", message, param=name)


# --- the other routes ------------------------------------------------------------------------


async def models(request: Request) -> Response:
    """GET /v1/models: the names the gateway serves (to an agent's key)."""
    gateway: Gateway = request.app.state.gateway
    try:
        gateway.authenticate(presented_key(request.scope))
    except GatewayError as exc:
        return _openai_error(exc.kind, str(exc))
    return JSONResponse({"object": "list", "data": [_model_object(n) for n in sorted(gateway.model_names)]})


async def model(request: Request) -> Response:
    """GET /v1/models/{model}: one name the gateway serves (to an agent's key)."""
    gateway: Gateway = request.app.state.gateway
    try:
        gateway.authenticate(presented_key(request.scope))
        name = _model_of(gateway, request.path_params["model"], "chat")
    except GatewayError as exc:
        return _openai_error(exc.kind, str(exc), exc.param)
    return JSONResponse(_model_object(name))


def _model_object(name: str) -> JsonObject:
    return {"id": name, "object": "model", "created": 0, "owned_by": "platoon"}


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


# --- serving -----------------------------------------------------------------------------------


def _bodied(served: Mapping[str, BodyApp], scope: Scope) -> BodyApp | None:
    """The model call the guard answers with the body it read (a POST without a root path)."""
    if scope["method"] != "POST" or scope.get("root_path"):
        return None
    return served.get(scope["path"])


def _served(app: Starlette, endpoint: _Endpoint) -> BodyApp:
    """`endpoint` as the guard calls it: an unexpected error is answered as starlette answers
    one (500, "Internal Server Error") and raised on to the server, which logs it."""

    async def serve(scope: Scope, body: bytes, receive: Receive, send: Send) -> None:
        scope["app"] = app  # as starlette sets it: the endpoint finds the gateway in `app.state`
        try:
            response = await endpoint(Request(scope, receive, send), body)
        except Exception:
            await PlainTextResponse("Internal Server Error", status_code=500)(scope, receive, send)
            raise
        await response(scope, receive, send)

    return serve


def _routed(endpoint: _Endpoint) -> Callable[[Request], Awaitable[_Answer]]:
    """`endpoint` as a starlette route."""

    async def route(request: Request) -> _Answer:
        return await endpoint(request, await request.body())

    return route


async def serve_gateway(
    gateway: Gateway,
    host: str,
    port: int,
    *,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the gateway's HTTP app; `task_status` gets its `/v1` base URL."""
    async with anyio.create_task_group() as tg:
        url = await tg.start(serve_asgi, build_app(gateway), host, port)
        task_status.started(f"{url}/v1")

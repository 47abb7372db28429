"""platoon's extension of the Tinker API: one sequence streamed as it is sampled.

The Tinker API answers a sample through a future, whole. `POST /platoon/v1/sample_stream` (outside
the Tinker API's `/api/v1`, so it can never collide with one of its routes; behind the same key)
takes an `asample` body for one sequence and answers newline-delimited JSON: a `StreamedTokens`
line for each stint of decoding that drew tokens, the last with the stop reason (and the prompt
logprobs when asked); the lines' tokens, joined, are what `asample` returns for the same seed.
A failure after the first line is a last line `{"error", "category"}`. A reader that goes away
frees its row in the batch. `get_server_capabilities` names the route
(`platoon.routes.sample_stream`), so a client knows without trying; platoon's `TinkerSampler`
streams through it.

The body may also hold a `constraint` (`platoon.policy.constraints.DecodingConstraint`): the
sequence is then decoded to it (one tool call, or one JSON value of a schema; see
`platoon.backends.local.constraints`). The capabilities say so (`platoon.sample_stream_takes`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable

import anyio
import msgspec
import structlog
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from platoon.backends.local.bodies import Asample
from platoon.backends.local.constraints import ConstraintError, compile_constraint, out_of_reach
from platoon.backends.local.sampler import Sampler, SampleRequest
from platoon.backends.local.specs import EngineError
from platoon.policy.constraints import DecodingConstraint

__all__ = ["SAMPLE_STREAM", "STREAM_TAKES", "StreamSample", "StreamedTokens", "sample_stream"]

SAMPLE_STREAM = "/platoon/v1/sample_stream"
STREAM_TAKES = ["constraint"]  # what the route's body takes beyond an `asample` body


class StreamSample(Asample):
    """The route's body: an `asample` body, and optionally the constraint to decode to."""

    constraint: DecodingConstraint | None = None


log = structlog.get_logger(__name__)


class StreamedTokens(msgspec.Struct, omit_defaults=True):
    """One line of the stream: the tokens drawn since the last line."""

    tokens: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per token, when asked
    stop_reason: str | None = None  # "stop" or "length", on the last line only
    prompt_logprobs: list[float | None] | None = None  # on the last line, when asked


def sample_stream(
    sampler: Sampler, read: Callable[[Asample], SampleRequest]
) -> Callable[[bytes], Awaitable[StreamingResponse]]:
    """The route's handler: `read` turns the body into the sampler's request (as for asample).
    A request the sampler refuses is a 400 before anything streams."""

    async def handler(body: bytes) -> StreamingResponse:
        req = msgspec.json.decode(body, type=StreamSample)
        if req.num_samples != 1:
            raise EngineError(f"sample_stream draws one sequence; num_samples is {req.num_samples}")
        if req.record_stability_info:
            raise EngineError("sample_stream does not record stability info; use asample for that")
        request = read(req)
        if req.constraint is not None:
            try:
                request.grammar = compile_constraint(req.constraint)
            except ConstraintError as exc:
                raise EngineError(str(exc)) from None
        limit = sampler.check(request)
        if req.constraint is not None and _first_look(req.constraint, limit):
            # off the event loop: the first reads the vocabulary's texts (a second or so); with a
            # grammar of its own, since the sampler's thread walks the request's meanwhile
            await anyio.to_thread.run_sync(_say_out_of_reach, req.constraint, limit, sampler)
        return _Lines(_lines(sampler, request))

    return handler


_said: set[tuple[str, int]] = set()
_seen: set[tuple[bytes, int]] = set()  # the constraints and limits already looked at


def _first_look(constraint: DecodingConstraint, limit: int) -> bool:
    """Whether this constraint and limit are new here (each is looked at once)."""
    key = (msgspec.json.encode(constraint), limit)
    if key in _seen or len(_seen) >= 10_000:
        return False
    _seen.add(key)
    return True


def _say_out_of_reach(constraint: DecodingConstraint, limit: int, sampler: Sampler) -> None:
    """Warn, once per tool and limit, of a tool a forced call cannot draw within `limit` tokens
    (`out_of_reach`): the model's choice would be taken from it without a word."""
    for name, chars in out_of_reach(constraint, limit - 1, sampler.vocabulary()):
        if (name, limit) not in _said:
            _said.add((name, limit))
            log.warning(
                f"a forced tool call of at most {limit} tokens never calls {name}: its shortest call "
                f"takes {chars} characters, and the sampler starts a call only where the call can "
                "end, counting a character a token. Raise max_tokens (the call's, or "
                "inference_params.max_completion_tokens) past it",
            )


async def _lines(sampler: Sampler, request: SampleRequest) -> AsyncGenerator[bytes]:
    encode = msgspec.json.Encoder().encode
    try:
        async with contextlib.aclosing(sampler.stream(request)) as drawn:
            async for piece in drawn:
                line = StreamedTokens(tokens=piece.tokens, logprobs=piece.logprobs)
                if request.topk_sample:
                    line.top_logprobs = [
                        list(zip(ids, values, strict=True))
                        for ids, values in zip(piece.topk_ids, piece.topk_logprobs, strict=True)
                    ]
                if piece.result is not None:
                    line.stop_reason = piece.result.sequences[0].stop_reason
                    line.prompt_logprobs = piece.result.prompt_logprobs
                yield encode(line) + b"\n"
    except Exception as exc:
        user = isinstance(exc, EngineError)
        if not user:
            log.exception("streamed sample failed")
        error = {
            "error": str(exc) if user else f"internal error: {exc!r}",
            "category": "user" if user else "server",
        }
        yield encode(error) + b"\n"


class _Lines(StreamingResponse):
    """NDJSON lines as they come; the line source is closed, whatever ends the response (a reader
    that disconnects included), so the sampler drops the row at once."""

    def __init__(self, lines: AsyncGenerator[bytes]) -> None:
        super().__init__(lines, media_type="application/x-ndjson")
        self.lines = lines

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with contextlib.aclosing(self.lines), anyio.create_task_group() as tg:

            async def gone() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(gone)
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for line in self.lines:
                await send({"type": "http.response.body", "body": line, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            tg.cancel_scope.cancel()

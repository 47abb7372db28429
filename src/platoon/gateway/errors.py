"""Why the gateway refuses or fails a call: `GatewayError`, whose `kind` picks the HTTP status
and the dialect's error type, and how a sampler's failure becomes one."""

from __future__ import annotations

from typing import Literal

__all__ = ["ErrorKind", "GatewayError", "sampler_error"]

ErrorKind = Literal["budget", "context_length", "bad_request", "auth", "sampler", "overloaded", "not_found"]


class GatewayError(Exception):
    """A call the gateway will not or cannot answer; `kind` picks the HTTP status and dialect,
    `code` the OpenAI error code where the API has a more precise one than the kind's."""

    def __init__(
        self, kind: ErrorKind, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.param = param
        self.code = code


_CONTEXT_WORDS = ("context length", "context window", "too long", "maximum context", "exceeds the context")


def sampler_error(exc: Exception) -> GatewayError:
    """A sampler's failure as the gateway answers it: a prompt the model cannot take is the
    client's error (400 context_length_exceeded, at once), anything else a 502."""
    message = f"{type(exc).__name__}: {exc}"
    if any(word in str(exc).lower() for word in _CONTEXT_WORDS):
        return GatewayError(
            "context_length",
            f"This model's maximum context length is exceeded: the model refused the prompt ({message})",
            param="messages",
        )
    return GatewayError("sampler", f"sampling failed: {message}")

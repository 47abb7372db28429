"""The gateway's settings: what a config says of it (`gateway:`, `train.context_window_length`),
resolved once by the assembly and handed to `Gateway` whole."""

from __future__ import annotations

import msgspec

__all__ = ["GatewaySettings"]


class GatewaySettings(msgspec.Struct, frozen=True, kw_only=True):
    """How the gateway serves its policies.

    `context_window` (tokens) makes a longer prompt a context-length error and clamps
    `max_tokens` to the room left; `max_concurrent_samples` bounds calls in flight (HTTP
    callers get 429 past it, in-process callers wait), `max_calls_per_agent` those of one agent
    over HTTP, and `max_body` the size of an HTTP request. `constraint_tries` is how many
    samples a reply that must be a tool call or JSON gets from a sampler that cannot constrain its
    decoding (the embedded one decodes to the constraint) before the call is refused.
    `version_timeout` is how long a call waits for the policy version its episode asked for.
    Agents may ask for `model_name`, `platoon-policy`, the `model_aliases` and any served
    policy's own model name."""

    context_window: int | None = None
    max_concurrent_samples: int = 256
    host: str = "127.0.0.1"
    port: int = 0
    serve_http: bool = True
    model_name: str = "platoon-policy"
    model_aliases: tuple[str, ...] = ()
    version_timeout: float = 600.0
    max_calls_per_agent: int = 16
    max_body: int = 64 * 2**20
    constraint_tries: int = 3

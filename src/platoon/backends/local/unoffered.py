"""What the tinker SDK can ask that this server does not offer, and how it says so.

Each route the SDK names is answered: served, or refused here the way a service refuses a
feature it does not have, with a 400 the SDK raises as its own `BadRequestError`, whose
message names the feature and what to do instead (the body carries it as `error`, which the SDK
shows, and `detail`, which its command line shows). `x-should-retry: false` keeps the SDK from
retrying a refusal. `tests/backends/local/test_sdk_routes.py` walks every route the pinned
SDK's code names, so a route added by a new SDK fails that test until it is decided here or
served.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from platoon.backends.local.specs import not_offered

__all__ = ["UNOFFERED", "refusal", "unoffered_routes"]

# (method, path under /api/v1) -> (the feature, what to do instead)
UNOFFERED: dict[tuple[str, str], tuple[str, str]] = {
    ("POST", "/create_custom_loss"): (
        "server-side custom losses (create_custom_loss)",
        "TrainingClient.forward_backward_custom runs the loss on the client, which this server supports",
    ),
    ("GET", "/training_runs/{run_id}/checkpoints/{checkpoint_id:path}/external_weights_urls"): (
        "external weights (signed download URLs)",
        "read the checkpoint's files under the server's --checkpoint-dir",
    ),
    ("GET", "/sessions/{session_id}/trace_export"): (
        "trace export",
        "the server logs every request; platoon runs record their own traces in the run directory",
    ),
    ("PUT", "/sessions/{session_id}/project"): (
        "projects",
        "this server has one owner and no projects; every session is the owner's",
    ),
    ("POST", "/auth/token"): (
        "JWT authentication",
        "send the server's key as X-API-Key (TINKER_API_KEY); its client config says pjwt_auth_enabled=false",
    ),
    ("GET", "/auth/apikey/me"): (
        "API key accounts (tinker auth login)",
        "set TINKER_API_KEY to the key the server was started with (--api-key)",
    ),
    ("DELETE", "/auth/apikey/me"): (
        "API key revocation (tinker auth logout)",
        "restart the server with another --api-key",
    ),
    ("GET", "/audit"): ("audit logs", "the server's own log lists every request"),
    ("GET", "/billing/usage/events"): ("billing", "this server does not bill"),
    ("GET", "/billing/usage/checkpoints/current"): (
        "billing (checkpoint storage usage)",
        "RestClient.list_user_checkpoints gives each checkpoint's size_bytes",
    ),
}


def refusal(feature: str, instead: str) -> Response:
    message = not_offered(feature, instead)
    return JSONResponse(
        {"error": message, "detail": message, "category": "user"},
        status_code=400,
        headers={"x-should-retry": "false"},
    )


def unoffered_routes() -> list[Route]:
    """One route per refused feature, under /api/v1 (placed before the served ones, whose
    patterns may be wider)."""

    def refuse(feature: str, instead: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            return refusal(feature, instead)

        return endpoint

    return [
        Route(f"/api/v1{path}", refuse(*why), methods=[method]) for (method, path), why in UNOFFERED.items()
    ]

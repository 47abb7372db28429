"""The tool plane: an episode's environment tools served over MCP (streamable HTTP).

A command-line harness brings its own agent, which reaches the policy through the gateway's
OpenAI-compatible HTTP and the environment's tools through this server. Each episode gets its
own server on loopback, under a secret path, so an agent can only call its own episode's tools;
every call goes through `AgentContext.call_tool`, so it is recorded like any other tool call.

A tool result's `_meta` carries `platoon/finished` (the environment considers the episode over)
and `platoon/reward`, so an agent knows when to stop.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import anyio
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.routing import Route

from platoon.harness.context import AgentContext
from platoon.serving import serve_asgi

__all__ = ["mcp_server", "serve_tools"]


def mcp_server(ctx: AgentContext, name: str = "platoon-env") -> Server[Any, Any]:
    """A low-level MCP server whose tools are the agent's environment tools."""
    server: Server[Any, Any] = Server(name)

    @server.list_tools()
    async def list_tools() -> list[types.Tool]:
        return [
            types.Tool(name=t.name, description=t.description, inputSchema=t.input_schema)
            for t in await ctx.list_tools()
        ]

    # The environment checks arguments itself and answers a bad call with an error the agent
    # sees; checking them here too would only give a second, differently worded error.
    @server.call_tool(validate_input=False)
    async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        result = await ctx.call_tool(name, arguments)
        meta: dict[str, Any] = {"platoon/finished": result.finished}
        if result.reward is not None:
            meta["platoon/reward"] = result.reward
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=result.as_text())],
            isError=result.error is not None,
            _meta=meta,
        )

    return server


class _Endpoint:
    """The session manager as an ASGI endpoint (Starlette routes a class instance as raw ASGI)."""

    def __init__(self, manager: StreamableHTTPSessionManager) -> None:
        self.manager = manager

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.manager.handle_request(scope, receive, send)


@contextlib.asynccontextmanager
async def serve_tools(ctx: AgentContext, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Serve the agent's tools over MCP while the block runs; yields the server's URL."""
    manager = StreamableHTTPSessionManager(mcp_server(ctx), stateless=True, json_response=True)
    path = f"/{secrets.token_urlsafe(16)}/mcp"
    app = Starlette(routes=[Route(path, _Endpoint(manager))])
    async with manager.run(), anyio.create_task_group() as tg:
        url = await tg.start(serve_asgi, app, host, port)
        try:
            yield f"{url}{path}"
        finally:
            tg.cancel_scope.cancel()

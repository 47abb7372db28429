"""The model gateway: renderers, tool-call parsers, the gateway component and its HTTP app.

The HTTP app (`http`) imports the component (`core`), never the reverse; here the two meet:
`Gateway` (with `GatewaySettings.serve_http`) serves `http.serve_gateway`.
"""

from platoon.gateway.core import AgentSession, Completion, Gateway, GatewayError, GatewayPolicy
from platoon.gateway.http import serve_gateway
from platoon.gateway.settings import GatewaySettings

Gateway.http_front = serve_gateway

__all__ = ["AgentSession", "Completion", "Gateway", "GatewayError", "GatewayPolicy", "GatewaySettings"]

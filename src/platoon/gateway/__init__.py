"""The model gateway: renderers, tool-call parsers, the gateway component and its HTTP app."""

from platoon.gateway.core import AgentSession, Completion, Gateway, GatewayError, GatewayPolicy

__all__ = ["AgentSession", "Completion", "Gateway", "GatewayError", "GatewayPolicy"]

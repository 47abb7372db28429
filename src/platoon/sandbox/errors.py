"""The one exception type of platoon.sandbox."""

__all__ = ["SandboxError"]


class SandboxError(Exception):
    """A sandbox could not be built, started or used as asked (the message says why)."""

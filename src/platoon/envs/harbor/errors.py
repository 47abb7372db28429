"""The one exception type of platoon.envs.harbor."""

__all__ = ["HarborError"]


class HarborError(Exception):
    """A Harbor task or dataset that platoon refuses to run, with the reason."""

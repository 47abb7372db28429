"""The exception types of platoon.envs.harbor."""

__all__ = ["HarborError", "TaskDefect"]


class HarborError(Exception):
    """A Harbor task or dataset that platoon refuses to run, with the reason."""


class TaskDefect(HarborError):
    """A task that is wrong in itself (a file its Dockerfile copies is not in it, a Dockerfile
    with no FROM): no provider or container engine can run it; its author must fix it."""

"""Errors out of task groups: the one place platoon unwraps an exception group.

A task group (anyio, trio) raises what failed inside it wrapped in a `BaseExceptionGroup`, even a
single error. Where a command or a run says or re-raises what failed, it says the error itself."""

from __future__ import annotations

__all__ = ["first_error", "sole_error"]


def sole_error(exc: BaseException) -> BaseException:
    """`exc` out of the groups that wrap it alone; a group of several errors stays as it is."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def first_error(exc: BaseException) -> BaseException:
    """The first error inside `exc`'s groups (`exc` itself, when it is no group)."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc

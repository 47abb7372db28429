"""Named hooks: places where extensions register functions that platoon calls.

    from platoon import hooks

    @hooks.register("episode_reward")
    def my_rule(episode): ...

Core code calls `hooks.call(name, ...)` (every function, in registration order) or
`hooks.first(name, ...)` (the first that returns something other than None). Core never
imports an extension: an extension registers itself when its module is imported, which
happens when a config names it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["call", "clear", "first", "register", "registered"]

F = TypeVar("F", bound=Callable[..., Any])

_hooks: defaultdict[str, list[Callable[..., Any]]] = defaultdict(list)


def register(name: str) -> Callable[[F], F]:
    def decorate(func: F) -> F:
        if func not in _hooks[name]:
            _hooks[name].append(func)
        return func

    return decorate


def registered(name: str) -> tuple[Callable[..., Any], ...]:
    return tuple(_hooks.get(name, ()))


def call(name: str, *args: Any, **kwargs: Any) -> list[Any]:
    return [func(*args, **kwargs) for func in _hooks.get(name, ())]


def first(name: str, *args: Any, **kwargs: Any) -> Any:
    for func in _hooks.get(name, ()):
        result = func(*args, **kwargs)
        if result is not None:
            return result
    return None


def clear(name: str | None = None) -> None:
    """Forget registrations (for tests)."""
    if name is None:
        _hooks.clear()
    else:
        _hooks.pop(name, None)

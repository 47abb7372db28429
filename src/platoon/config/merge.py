"""Deep merge, the one rule by which config layers combine."""

from __future__ import annotations

from typing import overload

__all__ = ["deep_merge"]


@overload
def deep_merge(base: dict[str, object] | None, top: dict[str, object]) -> dict[str, object]: ...
@overload
def deep_merge(base: object, top: object) -> object: ...
def deep_merge(base: object, top: object) -> object:
    """Lay ``top`` over ``base``: mappings merge key by key, anything else (lists too) replaces.

    Mappings in the result are new objects, so neither argument's mappings are changed.
    """
    if isinstance(base, dict) and isinstance(top, dict):
        merged = dict(base)
        for key, value in top.items():
            merged[key] = deep_merge(base.get(key), value)
        return merged
    if isinstance(top, dict):
        return deep_merge({}, top)
    return top

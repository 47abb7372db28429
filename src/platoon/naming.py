"""What a command says when a name is not one it knows: the closest names, then all of them."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["unknown_name"]


def unknown_name(kind: str, name: str, known: Iterable[str]) -> str:
    """`unknown harness 'x'; did you mean 'y'? (known: ...)` for a name that is not in `known`."""
    known = sorted(set(known))
    close = difflib.get_close_matches(name, known, n=2, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    listed = ", ".join(known) if known else "none"
    return f"unknown {kind} {name!r}{hint} (known: {listed})"

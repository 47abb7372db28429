"""What the verifiers worker says when it cannot load an environment: one line with the innermost
error (an import that failed deep inside an environment's package, not verifiers' "not found"
around it) and the package it came from. Standard library only: imported by `worker.py` in the
worker's venv, and by platoon's tests."""

from __future__ import annotations

import importlib.metadata
import os
import sys
import sysconfig
import traceback

CLOUD_RUNTIMES = ("prime", "modal", "e2b")


class Refused(Exception):
    """A setting the worker will not run; the message is one line that says why."""


def table(value: object) -> dict[str, object]:
    return dict(value) if isinstance(value, dict) else {}


def innermost(exc: BaseException) -> BaseException:
    """The exception at the bottom of `exc`'s chain: its cause, or the one it was raised while
    handling (even `from None`: that is what hid the real reason)."""
    seen = {id(exc)}
    while True:
        below = exc.__cause__ or exc.__context__
        if below is None or id(below) in seen:
            return exc
        seen.add(id(below))
        exc = below


def origin(exc: BaseException) -> str | None:
    """Where `exc` was raised, as `<distribution> <version> (<module file>:<line>)`: the deepest
    frame outside the standard library and verifiers itself (None when there is none)."""
    skipped = [sysconfig.get_paths()["stdlib"]]
    try:
        import verifiers

        skipped.append(os.path.dirname(verifiers.__file__ or ""))
    except ImportError:
        pass
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    frames = [f for f in frames if not any(f.filename.startswith(s + os.sep) for s in skipped if s)]
    if not frames:
        return None
    frame = frames[-1]
    relative = _on_path(frame.filename)
    if relative is None:
        return f"{frame.filename}:{frame.lineno}"
    top = relative.split(os.sep, 1)[0].removesuffix(".py")
    names = importlib.metadata.packages_distributions().get(top) or []
    where = f"{relative}:{frame.lineno}"
    for name in names:
        try:
            return f"{name} {importlib.metadata.version(name)} ({where})"
        except importlib.metadata.PackageNotFoundError:
            continue
    return where


def _on_path(filename: str) -> str | None:
    for entry in sorted((p for p in sys.path if p), key=len, reverse=True):
        root = os.path.abspath(entry) + os.sep
        if filename.startswith(root):
            return filename[len(root) :]
    return None


def explain(exc: BaseException) -> str:
    """One line saying why loading failed: a refusal as it is; otherwise the innermost error,
    where it was raised, and the verifiers version it met."""
    if isinstance(exc, Refused):
        return " ".join(str(exc).split())
    inner = innermost(exc)
    text = f"{type(inner).__name__}: {inner}"
    where = origin(inner)
    if where is not None:
        text += f" (raised in {where})"
    if inner is not exc:
        outer = " ".join(f"{type(exc).__name__}: {exc}".split())
        text += f", under: {outer[:200]}" + ("..." if len(outer) > 200 else "")
    try:
        text += f"; the venv has verifiers {importlib.metadata.version('verifiers')}"
    except importlib.metadata.PackageNotFoundError:
        text += "; the venv has no verifiers"
    return " ".join(text.split())[:1500]

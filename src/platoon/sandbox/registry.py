"""Choosing a sandbox provider by name: built-ins, `register_provider`, and the
`platoon.sandbox_providers` entry point group (imported only when named)."""

from __future__ import annotations

import importlib
import os
import socket
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from platoon.naming import unknown_name

from .base import Sandbox
from .errors import SandboxError
from .spec import SandboxSpec

__all__ = [
    "ENTRY_POINT_GROUP",
    "create_sandbox",
    "default_provider",
    "engine_answers",
    "engine_url",
    "get_provider",
    "provider_names",
    "register_provider",
    "resolve_provider",
]

ENTRY_POINT_GROUP = "platoon.sandbox_providers"
ProviderFactory = Callable[..., Sandbox]

_BUILTIN = {
    "bwrap": "platoon.sandbox.bwrap:BwrapSandbox",
    "docker": "platoon.sandbox.docker:DockerSandbox",
    "apptainer": "platoon.sandbox.apptainer:ApptainerSandbox",
    "singularity": "platoon.sandbox.apptainer:SingularitySandbox",
    "enroot": "platoon.sandbox.enroot:EnrootSandbox",
}
_registered: dict[str, ProviderFactory] = {}


def register_provider(name: str, factory: ProviderFactory) -> None:
    """Make `factory(spec, **options) -> Sandbox` available as provider `name`."""
    if not name or not callable(factory):
        raise SandboxError(f"cannot register provider {name!r}: need a name and a callable")
    _registered[name] = factory


def provider_names() -> list[str]:
    """Every provider name known now: registered, built-in, and from entry points."""
    names = set(_registered) | set(_BUILTIN)
    names |= {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted(names)


def get_provider(name: str) -> ProviderFactory:
    """The factory for provider `name`; raises SandboxError naming the known ones."""
    if name in _registered:
        return _registered[name]
    if name in _BUILTIN:
        module, _, attr = _BUILTIN[name].partition(":")
        return getattr(importlib.import_module(module), attr)
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        try:
            return ep.load()
        except Exception as exc:
            raise SandboxError(f"sandbox provider {name!r} ({ep.value}) failed to load: {exc}") from exc
    raise SandboxError(unknown_name("sandbox provider", name, provider_names()))


def create_sandbox(spec: SandboxSpec, provider: str | None = None, **options: Any) -> Sandbox:
    """A not-yet-started sandbox for `spec` (use `async with`); provider defaults to
    `default_provider()`."""
    factory = get_provider(provider or default_provider())
    return factory(spec, **options)


def resolve_provider(name: str) -> str:
    """The provider a configured name (the site profile's, a service's option) stands for: `auto`
    is `default_provider()`; an unknown name raises SandboxError before any sandbox starts."""
    if name == "auto":
        return default_provider()
    known = provider_names()
    if name not in known:
        raise SandboxError(unknown_name("sandbox provider", name, ["auto", *known]))
    return name


def default_provider() -> str:
    """`docker` when a Docker Engine API answers on the usual socket, else `bwrap`."""
    url = engine_url()
    return "docker" if url is not None and engine_answers(url) else "bwrap"


def engine_url() -> str | None:
    """Where a Docker engine would listen: DOCKER_HOST, else the first existing usual socket."""
    if host := os.environ.get("DOCKER_HOST"):
        return host
    candidates = [Path("/var/run/docker.sock"), Path.home() / ".docker/run/docker.sock"]
    if runtime := os.environ.get("XDG_RUNTIME_DIR"):
        candidates.append(Path(runtime) / "docker.sock")
    for path in candidates:
        if path.exists():
            return f"unix://{path}"
    return None


def engine_answers(url: str, timeout: float = 1.0) -> bool:
    """True when `GET /_ping` on the engine at `url` (unix:// or tcp://) answers 200."""
    parts = urlsplit(url)
    try:
        if parts.scheme == "unix":
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.settimeout(timeout)
                conn.connect(parts.path)
            except OSError:
                conn.close()
                raise
        elif parts.scheme in ("tcp", "http"):
            conn = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 2375), timeout)
        else:
            return False
        with conn:
            conn.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            reply = conn.recv(64)
    except OSError:
        return False
    return reply.startswith(b"HTTP/") and b" 200 " in reply.split(b"\r\n", 1)[0] + b" "

"""Environment services: in-process ORS classes, ORS servers, named environments, Harbor, verifiers.

`build_env_service` turns one `environments:` entry of a config into the bus component
that serves it (see `platoon.envs.service`).
"""

from collections.abc import Mapping
from typing import Any

from platoon.envs.service import (
    EnvBackend,
    EnvError,
    EnvService,
    EnvSession,
    Grade,
    TaskInfo,
    ToolError,
    ToolResult,
)
from platoon.plugins import PluginError, import_ref

__all__ = [
    "EnvBackend",
    "EnvError",
    "EnvService",
    "EnvSession",
    "Grade",
    "TaskInfo",
    "ToolError",
    "ToolResult",
    "build_backend",
    "build_env_service",
]

# Keyword arguments of a config's `service_kwargs` that belong to the service, not the backend.
_SERVICE_KEYS = ("secrets", "tool_errors", "tool_timeout")


def build_env_service(
    name: str,
    service: str | None = None,
    env: str | None = None,
    service_kwargs: Mapping[str, Any] | None = None,
    *,
    tool_timeout: float | None = 120.0,
    open_timeout: float | None = 600.0,
) -> EnvService:
    """The env service for one config entry: exactly one of `service` and `env` is given.

    `service`: `python://module:Class` (an ORS class in process), `http(s)://host:port[/Env]`
    (an ORS server), `harbor` (a Harbor dataset), `verifiers://ENV_ID` (a verifiers environment,
    played by `harness: verifiers`), or `module:Class` (an ORS class, or a class
    implementing `EnvBackend`, built with the service kwargs). `env`: a named environment,
    `NAME[@VERSION]`. `service_kwargs` go to the backend, except `secrets` (a mapping, or a
    list of environment variable names) which the service hands to every session, and
    `tool_errors` (`env`, the default: a tool that raises or times out is the environment's
    failure and its episode ends as an error; `agent`: such errors are the agent's doing, and
    the episode goes on to be graded) and `tool_timeout` (seconds a tool call may take, the same
    limit whether the environment runs in process or behind an ORS server; null: none).
    """
    kwargs = dict(service_kwargs or {})
    service_options = {key: kwargs.pop(key) for key in _SERVICE_KEYS if key in kwargs}
    tool_timeout = service_options.pop("tool_timeout", tool_timeout)
    if tool_timeout is not None and (
        isinstance(tool_timeout, bool) or not isinstance(tool_timeout, int | float) or not tool_timeout > 0
    ):
        raise EnvError(
            f"service_kwargs.tool_timeout must be a number of seconds > 0 or null, got {tool_timeout!r}"
        )
    backend = build_backend(service, env, kwargs)
    return EnvService(name, backend, tool_timeout=tool_timeout, open_timeout=open_timeout, **service_options)


def build_backend(service: str | None, env: str | None, kwargs: Mapping[str, Any]) -> EnvBackend:
    """The backend that `service` or `env` names (see `build_env_service`)."""
    if (service is None) == (env is None):
        raise EnvError("an environment entry needs exactly one of `service` and `env`")
    try:
        if env is not None:
            # the ors extra (the openreward SDK): only an ORS env loads it
            from platoon.envs.named import load_named_env
            from platoon.envs.ors import OrsBackend

            return _construct(OrsBackend, load_named_env(env), kwargs, what=f"env {env}")
        assert service is not None
        if service.startswith("python://"):
            # the ors extra (the openreward SDK): only an ORS env loads it
            from platoon.envs.ors import OrsBackend

            ref = service.removeprefix("python://")
            return _construct(OrsBackend.from_ref, ref, kwargs, what=service)
        if service.startswith(("http://", "https://")):
            from platoon.envs.remote import RemoteBackend  # each kind of service loads only its own backend

            return _construct(RemoteBackend, service, kwargs, what=service)
        if service.startswith("verifiers://"):
            # each kind of service loads only its own backend (verifiers: a worker process)
            from platoon.envs.verifiers import VerifiersBackend

            return _construct(VerifiersBackend, service.removeprefix("verifiers://"), kwargs, what=service)
        if service == "harbor":
            try:
                # each kind of service loads only its own backend (harbor: the sandboxes)
                from platoon.envs.harbor.service import HarborBackend
            except ImportError as exc:
                raise EnvError(f"the harbor service is not available: {exc}") from exc
            return _construct(HarborBackend, None, kwargs, what=service)
        if ":" in service and "://" not in service:
            return _from_ref(service, kwargs)
    except ImportError as exc:
        raise EnvError(
            f"{service or env} needs the openreward SDK: pip install 'platoon[ors]' ({exc})"
        ) from exc
    raise EnvError(
        f"unknown service {service!r}: use python://module:Class, http://host:port, harbor, "
        "verifiers://ENV_ID or module:Class"
    )


def _from_ref(ref: str, kwargs: Mapping[str, Any]) -> EnvBackend:

    try:
        obj = import_ref(ref)
    except PluginError as exc:
        raise EnvError(str(exc)) from exc
    if _is_ors_class(obj):
        # the ors extra (the openreward SDK): only an ORS env loads it
        from platoon.envs.ors import OrsBackend

        return _construct(OrsBackend, obj, kwargs, what=ref)
    backend = _construct(obj, None, kwargs, what=ref)
    if not isinstance(backend, EnvBackend):
        raise EnvError(f"{ref} is neither an ORS Environment class nor an env backend")
    return backend


def _is_ors_class(obj: Any) -> bool:
    try:
        # the ors extra: without the openreward SDK nothing is an ORS class
        from platoon.envs._sdk import is_environment_class
    except EnvError:  # no openreward SDK installed: then it cannot be an ORS class
        return False
    return is_environment_class(obj)


def _construct(factory: Any, first: Any, kwargs: Mapping[str, Any], *, what: str) -> Any:
    """Build a backend, turning bad `service_kwargs` into one clear error."""
    try:
        return factory(**kwargs) if first is None else factory(first, **kwargs)
    except TypeError as exc:
        raise EnvError(f"bad service_kwargs for {what}: {exc}") from exc

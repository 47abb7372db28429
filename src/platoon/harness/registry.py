"""The harness registry: `@pt.harness("name")`, entry points, mixtures and options.

A harness is anything with `name`, `options_type` and `async run(ctx) -> AgentResult`.
Function harnesses come from the decorator, command-line harnesses from TOML specs. Names are
resolved in this order: registered in this process, platoon's built-ins (functions, and the
shipped agent specs: `specs/<name>.toml`), then installed packages' `platoon.harnesses` entry
points (imported only when named).
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec
import msgspec.inspect

from platoon import plugins
from platoon.harness.context import AgentContext, AgentResult
from platoon.naming import unknown_name

__all__ = [
    "FunctionHarness",
    "Harness",
    "HarnessError",
    "choose_harness",
    "get_harness",
    "harness",
    "harness_names",
    "validate_options",
]

F = TypeVar("F", bound=Callable[..., Awaitable[AgentResult]])

BUILTINS = {
    "platoon-react": "platoon.harness.builtin.react:react",
    "platoon-codeact": "platoon.harness.builtin.codeact:codeact",
    "platoon-bash": "platoon.harness.builtin.bash:bash",
    "verifiers": "platoon.harness.builtin.verifiers:verifiers",
}

# Shipped command-line agents: one TOML spec per agent, named like the file.
SPECS_DIR = Path(__file__).parent / "specs"


def _shipped_specs() -> dict[str, Path]:
    return {path.stem: path for path in sorted(SPECS_DIR.glob("*.toml"))}


class HarnessError(LookupError):
    """An unknown harness, or options it does not take."""


class Harness(Protocol):
    name: str
    options_type: type | None
    description: str

    async def run(self, ctx: AgentContext) -> AgentResult: ...


class FunctionHarness:
    """A Python function that plays an episode through its `AgentContext`."""

    def __init__(
        self,
        name: str,
        func: Callable[[AgentContext], Awaitable[AgentResult]],
        options: type | None,
        install: Callable[[], Awaitable[None]] | None = None,
    ):
        if not inspect.iscoroutinefunction(func):
            raise TypeError(f"harness {name!r} must be an async function taking an AgentContext")
        self.name = name
        self.func = func
        self.options_type = options
        self.description = inspect.getdoc(func) or ""
        self.module = func.__module__
        self.install = install  # what `platoon harness install` builds ahead; None: nothing

    async def run(self, ctx: AgentContext) -> AgentResult:
        result = await self.func(ctx)
        if isinstance(result, str):
            return AgentResult("completed", final_message=result)
        if result is None:
            return AgentResult("completed")
        if not isinstance(result, AgentResult):
            raise TypeError(f"harness {self.name!r} returned {type(result).__name__}, not an AgentResult")
        return result

    def __repr__(self) -> str:
        return f"<harness {self.name} {self.module}:{self.func.__qualname__}>"


_registry: dict[str, Harness] = {}


def harness(
    name: str, *, options: type | None = None, install: Callable[[], Awaitable[None]] | None = None
) -> Callable[[F], F]:
    """Register an async function as the harness `name`.

    `options` is a msgspec Struct whose fields are the `harness_options` the harness takes;
    the episode's `ctx.options` is an instance of it, validated before anything runs.
    `install` builds what the harness needs beforehand (`platoon harness install NAME`).
    """

    def decorate(func: F) -> F:
        register(FunctionHarness(name, func, options, install))
        return func

    return decorate


def register(h: Harness) -> None:
    existing = _registry.get(h.name)
    if existing is not None and getattr(existing, "func", None) is not getattr(h, "func", object()):
        if getattr(existing, "module", None) != getattr(h, "module", None):
            raise HarnessError(f"harness {h.name!r} is already registered by {existing!r}")
    _registry[h.name] = h


def get_harness(name: str) -> Harness:
    """The harness called `name` (or a `module:attr` ref, or a TOML spec path)."""
    if name in _registry:
        return _registry[name]
    if name.endswith(".toml"):
        # a command-line harness's machinery loads only when a spec is named
        from platoon.harness.command import load_spec_harness

        h = load_spec_harness(name)
        _registry[name] = h
        return h
    shipped = _shipped_specs().get(name)
    if shipped is not None:
        # a command-line harness's machinery loads only when a spec is named
        from platoon.harness.command import load_spec_harness

        h = load_spec_harness(shipped)
        _registry[name] = h
        return h
    ref = BUILTINS.get(name)
    try:
        obj = plugins.import_ref(ref) if ref else plugins.load("harnesses", name)
    except plugins.PluginError as exc:
        if ":" in name or ref:  # a module:attr reference that did not import: say why
            raise HarnessError(f"harness {name!r}: {exc}") from None
        raise HarnessError(unknown_name("harness", name, harness_names())) from None
    if name in _registry:  # importing the module registered it through the decorator
        return _registry[name]
    if isinstance(obj, FunctionHarness) or hasattr(obj, "run"):
        _registry[name] = obj
        return obj
    if inspect.iscoroutinefunction(obj):
        made = FunctionHarness(name, obj, None)
        _registry[name] = made
        return made
    raise HarnessError(f"{name!r} resolved to {obj!r}, which is not a harness")


def harness_names() -> list[str]:
    return sorted({*_registry, *BUILTINS, *_shipped_specs(), *plugins.available("harnesses")})


def choose_harness(spec: str | Mapping[str, float], key: str, seed: int = 0) -> str:
    """The harness for one episode: `spec` itself, or a weighted draw from a mixture that
    depends only on `key` (the episode's sampling seed, or its id) and the seed, so reruns pick
    the same harnesses."""
    if isinstance(spec, str):
        return spec
    names = list(spec)
    weights = [float(spec[n]) for n in names]
    if not names or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise HarnessError(f"a harness mixture needs positive weights, got {dict(spec)!r}")
    return random.Random(f"{seed}:{key}").choices(names, weights=weights)[0]


def validate_options(h: Harness, options: Mapping[str, Any] | None, path: str = "harness_options") -> Any:
    """Convert `harness_options` to the harness's options type, naming the path of a bad one."""
    options = dict(options or {})
    if h.options_type is None:
        if options:
            keys = ", ".join(f"{path}.{k}" for k in options)
            raise HarnessError(f"{keys}: harness {h.name!r} takes no options")
        return None
    try:
        return msgspec.convert(options, h.options_type, strict=False)
    except msgspec.ValidationError as exc:
        raise HarnessError(_options_error(str(exc), path, h)) from None


def _options_error(message: str, path: str, h: Harness) -> str:
    # msgspec says "Expected `int`, got `str` - at `$.num_retries`"; say it with the config's path.
    text, _, where = message.partition(" - at `$")
    where = where.rstrip("`")
    if text.startswith("Object contains unknown field"):
        field = text.split("`")[1]
        return f"{path}.{field}: unknown option of harness {h.name!r}"
    if text.startswith("Invalid enum value") and h.options_type is not None:
        # Say which values the option takes, not just that this one is not among them.
        info = msgspec.inspect.type_info(h.options_type)
        fields: tuple[msgspec.inspect.Field, ...] = getattr(info, "fields", ())
        found = next((f for f in fields if f".{f.name}" == where), None)
        kind = found.type if found is not None else None
        kind = kind.type if isinstance(kind, msgspec.inspect.Metadata) else kind
        if isinstance(kind, msgspec.inspect.LiteralType):
            allowed = ", ".join(repr(v) for v in kind.values)
            return f"{path}{where}: expected one of {allowed}, got {text.removeprefix('Invalid enum value ')}"
    text = text.replace("`", "")
    return f"{path}{where}: {text[0].lower()}{text[1:]}"

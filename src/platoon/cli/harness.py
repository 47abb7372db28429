"""`platoon harness list` and `platoon harness show NAME`: what harnesses there are, what
options they take, and which installed distribution provides each."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, packages_distributions
from importlib.metadata import version as dist_version
from typing import Any

import msgspec
import msgspec.inspect as mi

from platoon import plugins
from platoon.cli import CommandError
from platoon.harness.registry import (
    BUILTINS,
    SPECS_DIR,
    FunctionHarness,
    Harness,
    HarnessError,
    get_harness,
    harness_names,
)

__all__ = ["HarnessInfo", "OptionInfo", "describe", "list_harnesses", "show_harness"]


@dataclass
class OptionInfo:
    name: str
    type: str
    default: str  # "required" when there is none
    description: str = ""


@dataclass
class HarnessInfo:
    name: str
    kind: str  # "function" or "spec"
    provider: str  # the distribution (with its version), or "-" for a local one
    source: str  # module:function, or the spec file
    description: str = ""
    options: list[OptionInfo] = field(default_factory=list)
    error: str | None = None  # why it could not be loaded
    runs: list[str] = field(default_factory=list)  # where a spec's program runs, what it installs


class _Providers:
    """Where installed harnesses come from, looked up once per command: each lookup scans every
    installed distribution, which took seconds a harness where many are installed."""

    @functools.cached_property
    def entries(self) -> dict[str, Any]:
        return plugins.available("harnesses")

    @functools.cached_property
    def packages(self) -> Mapping[str, list[str]]:
        return packages_distributions()


def list_harnesses(args: Any) -> int:
    providers = _Providers()
    infos = [describe(name, providers) for name in harness_names()]
    rows = [("NAME", "KIND", "PROVIDED BY", "DESCRIPTION")]
    for info in infos:
        summary = f"cannot load: {info.error}" if info.error else _first_line(info.description)
        rows.append((info.name, info.kind, info.provider, summary))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[3]]).rstrip())
    return 0


def show_harness(args: Any) -> int:
    info = describe(args.name)
    if info.error:
        raise CommandError(info.error)
    print(f"{info.name} ({info.kind} harness)")
    print(f"  provided by: {info.provider}")
    print(f"  defined in:  {info.source}")
    for line in info.runs:
        print(f"  {line}")
    if info.description:
        print()
        for line in info.description.splitlines():
            print(f"  {line}".rstrip())
    print()
    if not info.options:
        print("options: none")
        return 0
    print("options (harness_options):")
    rows = [
        (o.name, o.type, f"default {o.default}" if o.default != "required" else "required")
        for o in info.options
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row, option in zip(rows, info.options, strict=True):
        line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print(f"  {line}  {option.description}".rstrip())
    return 0


def install_harnesses(args: Any) -> int:
    """Build each named harness's toolchain (what `platoon prepare` does for a config's), so a
    machine can be made ready before any config names it: a CI image, an offline node.

    The builds run at once (each is mostly an installer waiting on downloads and disk), each
    line printed as its build ends; one that fails does not stop the others."""
    import time

    import anyio

    installs: list[tuple[str, Callable[[], Awaitable[None]]]] = []
    for name in args.names:
        try:
            harness = get_harness(name)
        except (HarnessError, plugins.PluginError, ValueError, OSError) as exc:
            raise CommandError(str(exc)) from None
        install = getattr(harness, "install", None)
        if install is None:
            print(f"{harness.name}: nothing to build (a function harness)")
        else:
            installs.append((harness.name, install))
    failures: list[str] = []

    async def build(name: str, install: Callable[[], Awaitable[None]]) -> None:
        started = time.monotonic()
        try:
            await install()
        except (HarnessError, ValueError) as exc:  # a spec's toolchain that did not build
            failures.append(str(exc))
        else:
            print(f"{name}: ready ({time.monotonic() - started:.1f} s)", flush=True)

    async def build_all() -> None:
        async with anyio.create_task_group() as tg:
            for name, install in installs:
                tg.start_soon(build, name, install)

    anyio.run(build_all)
    if failures:
        raise CommandError("\n".join(failures))
    return 0


def describe(name: str, providers: _Providers | None = None) -> HarnessInfo:
    """What `platoon harness show` prints about `name` (a name, `module:attr` or spec path)."""
    providers = providers or _Providers()
    try:
        harness = get_harness(name)
    except (HarnessError, plugins.PluginError, ValueError, OSError) as exc:
        return HarnessInfo(name, "?", _provider(name, None, providers), "?", error=str(exc))
    kind = "function" if isinstance(harness, FunctionHarness) else "spec"
    return HarnessInfo(
        name=harness.name,
        kind=kind,
        provider=_provider(name, harness, providers),
        source=_source(harness),
        description=harness.description,
        options=_options(harness.options_type),
        runs=_runs(harness),
    )


def _runs(harness: Harness) -> list[str]:
    spec = getattr(harness, "spec", None)
    if spec is None:
        return []
    lines = [
        f"runs in:     {spec.runs_in}" + (" (the episode's sandbox)" if spec.runs_in == "sandbox" else "")
    ]
    packages = [*spec.toolchain.pip, *spec.toolchain.npm]
    if packages:
        lines.append(f"toolchain:   {', '.join(packages)} (built by `platoon prepare`)")
    return lines


def _provider(name: str, harness: Harness | None, providers: _Providers) -> str:
    path = getattr(harness, "path", None)
    if name in BUILTINS or (path is not None and path.parent == SPECS_DIR.resolve()):
        return _with_version("platoon")
    entry = providers.entries.get(name)
    if entry is not None and entry.dist is not None:
        return f"{entry.dist.name} {entry.dist.version}"
    module = getattr(harness, "module", None)
    if module:
        top = module.split(".")[0]
        if top == "platoon":
            return _with_version("platoon")
        dists = providers.packages.get(top)
        if dists:
            return _with_version(dists[0])
    return "-"


def _with_version(dist: str) -> str:
    try:
        return f"{dist} {dist_version(dist)}"
    except PackageNotFoundError:
        return dist


def _source(harness: Harness) -> str:
    if isinstance(harness, FunctionHarness):
        return f"{harness.module}:{harness.func.__qualname__}"
    path = getattr(harness, "path", None)
    return str(path) if path is not None else repr(harness)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _options(options_type: type | None) -> list[OptionInfo]:
    if options_type is None:
        return []
    info = mi.type_info(options_type)
    found = []
    for f in getattr(info, "fields", ()):
        kind, description = f.type, ""
        if isinstance(kind, mi.Metadata):
            description = str((kind.extra_json_schema or {}).get("description", ""))
            kind = kind.type
        if f.default is not msgspec.NODEFAULT:
            default = _value(f.default)
        elif f.default_factory is not msgspec.NODEFAULT:
            default = _value(f.default_factory())
        else:
            default = "required"
        found.append(OptionInfo(f.name, _type_name(kind), default, description))
    return found


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "none" if value is None else repr(value)


def _type_name(kind: Any) -> str:
    if isinstance(kind, mi.Metadata):
        return _type_name(kind.type)
    if isinstance(kind, mi.LiteralType):
        return "one of " + ", ".join(repr(v) for v in kind.values)
    if isinstance(kind, mi.UnionType):
        return " | ".join(_type_name(t) for t in kind.types)
    names: dict[type[mi.Type], str] = {
        mi.IntType: "int",
        mi.FloatType: "float",
        mi.StrType: "str",
        mi.BoolType: "bool",
        mi.NoneType: "none",
        mi.AnyType: "any",
    }
    name = names.get(type(kind), type(kind).__name__.removesuffix("Type").lower())
    bounds = [
        (op, getattr(kind, attr, None)) for op, attr in ((">", "gt"), (">=", "ge"), ("<", "lt"), ("<=", "le"))
    ]
    return " ".join([name, *(f"{op} {v:g}" for op, v in bounds if v is not None)])

"""Checking plain data against a schema Struct, reporting every problem at once.

msgspec stops at the first error, which makes a user fix a config one line per run. So this
module walks the type information of the schema (``msgspec.inspect``) over the data, collects a
line per problem naming its dotted path, and hands the data to msgspec only once it is clean.
"""

from __future__ import annotations

import difflib
import functools
import os
from collections import deque
from pathlib import Path
from typing import TypeVar, overload

import msgspec
import msgspec.inspect as mi

__all__ = ["ConfigError", "build", "check", "convert", "resolve_paths", "type_at"]

T = TypeVar("T", bound=msgspec.Struct)


class AssemblyError(RuntimeError):
    """The config describes something that cannot be assembled here (a model, a service or a
    package it names is not there)."""


class ConfigError(Exception):
    """A config that cannot be used; ``problems`` holds one line per problem."""

    exit_code = 2  # what the command line exits with

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@functools.cache
def info_of(cls: type) -> mi.Type:
    return mi.type_info(cls)


def convert(data: object, cls: type[T], *, base_dir: Path | None = None) -> T:
    """Resolve the relative paths in ``data``, check it against ``cls`` and build it.

    Raises ``ConfigError`` with every problem found.
    """
    data = resolve_paths(data, info_of(cls), base_dir or Path.cwd())
    problems = check(data, info_of(cls))
    if problems:
        raise ConfigError(problems)
    return build(data, cls)


def build(data: object, cls: type[T]) -> T:
    """Build ``cls`` from data that ``check`` found clean."""
    try:
        return msgspec.convert(data, cls, strict=True)
    except msgspec.ValidationError as exc:  # a rule the walker does not know; still one clear line
        raise ConfigError([str(exc)]) from None


# --- the walker -----------------------------------------------------------------------------------


def check(value: object, info: mi.Type, path: str = "", *, partial: bool = False) -> list[str]:
    """Every problem of ``value`` against ``info``, one line each, as ``dotted.path: what``.

    ``partial`` accepts mappings that leave out required keys (an overlay states only changes).
    """
    problems: list[str] = []
    _check(value, info, path, problems, partial)
    return problems


def _check(value: object, info: mi.Type, path: str, problems: list[str], partial: bool) -> None:
    where = path or "(top level)"
    if isinstance(info, mi.Metadata):
        overlay = (info.extra or {}).get("platoon_overlay")
        if overlay is not None and isinstance(value, dict):
            _check(value, info_of(overlay), path, problems, True)
        else:
            _check(value, info.type, path, problems, partial)
    elif isinstance(info, mi.AnyType):
        pass
    elif isinstance(info, mi.StructType):
        _check_struct(value, info, path, problems, partial)
    elif isinstance(info, mi.UnionType):
        _check_union(value, info, path, problems, partial)
    elif isinstance(info, mi.ListType):
        if not isinstance(value, list):
            problems.append(f"{where}: expected list, got {kind(value)}")
            return
        if info.min_length is not None and len(value) < info.min_length:
            problems.append(f"{where}: expected at least {info.min_length} item(s), got {len(value)}")
        for index, item in enumerate(value):
            _check(item, info.item_type, _join(path, index), problems, partial)
    elif isinstance(info, mi.DictType):
        if not isinstance(value, dict):
            problems.append(f"{where}: expected mapping, got {kind(value)}")
            return
        if info.min_length is not None and len(value) < info.min_length:
            problems.append(f"{where}: expected at least {info.min_length} entry(ies), got {len(value)}")
        for key, item in value.items():
            if not isinstance(key, str):
                problems.append(f"{where}: keys must be strings, got {kind(key)} {key!r}")
                continue
            _check(item, info.value_type, _join(path, key), problems, partial)
    elif isinstance(info, mi.LiteralType):
        if not any(type(value) is type(choice) and value == choice for choice in info.values):
            choices = ", ".join(repr(choice) for choice in info.values)
            hint = _quote_hint(value)
            if isinstance(value, str):
                close = difflib.get_close_matches(value, [str(c) for c in info.values], n=1, cutoff=0.6)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(f"{where}: expected one of {choices}, got {value!r}{hint}")
    else:
        _check_scalar(value, info, where, problems)


def _check_struct(value: object, info: mi.StructType, path: str, problems: list[str], partial: bool) -> None:
    if not isinstance(value, dict):
        problems.append(f"{path or '(top level)'}: expected mapping, got {kind(value)}")
        return
    fields = {f.name: f for f in info.fields}
    for key, item in value.items():
        if not isinstance(key, str):
            problems.append(f"{path or '(top level)'}: keys must be strings, got {kind(key)} {key!r}")
        elif key not in fields:
            problems.append(f"{_join(path, key)}: unknown key{_suggest(key, info, path)}")
        else:
            _check(item, fields[key].type, _join(path, key), problems, partial)
    if not partial:
        for f in info.fields:
            if f.required and f.name not in value:
                problems.append(f"{_join(path, f.name)}: missing required key")


def _check_union(value: object, info: mi.UnionType, path: str, problems: list[str], partial: bool) -> None:
    if any(not check(value, option, path, partial=partial) for option in info.types):
        return
    # Report from inside the one option of the value's shape, so a typo deep in a mapping is named
    # at its own path rather than as "expected mapping or null".
    same_shape = [option for option in info.types if _fits(value, option)]
    if len(same_shape) == 1 and isinstance(value, dict | list):
        _check(value, same_shape[0], path, problems, partial)
        return
    expected = _or([describe(option) for option in info.types])
    takes_text = any(isinstance(_container_in(option), mi.StrType) for option in info.types)
    hint = _quote_hint(value) if takes_text else ""
    problems.append(f"{path or '(top level)'}: expected {expected}, got {kind(value)}{hint}")


_SCALARS: dict[type, tuple[type, ...]] = {
    mi.IntType: (int,),
    mi.FloatType: (int, float),
    mi.StrType: (str,),
    mi.BoolType: (bool,),
}


def _check_scalar(value: object, info: mi.Type, where: str, problems: list[str]) -> None:
    if isinstance(info, mi.NoneType):
        if value is not None:
            problems.append(f"{where}: expected null, got {kind(value)}")
        return
    accepted = _SCALARS.get(type(info))
    if accepted is None:
        problems.append(f"{where}: unsupported type {describe(info)} in the schema")
        return
    if (isinstance(value, bool) and bool not in accepted) or not isinstance(value, accepted):
        hint = _quote_hint(value) if accepted == (str,) else ""
        problems.append(f"{where}: expected {describe(info)}, got {kind(value)}{hint}")
        return
    broken = _broken_bound(value, info)
    if broken:
        shown = repr(value) if isinstance(value, str) else value
        problems.append(f"{where}: expected {describe(info)} {broken}, got {shown}")


def _broken_bound(value: object, info: mi.Type) -> str | None:
    """The bound of ``info`` that ``value`` (of a type ``info`` accepts) breaks, if any."""
    if isinstance(info, mi.StrType) and isinstance(value, str):
        if info.min_length is not None and len(value) < info.min_length:
            return f"of at least {info.min_length} character(s)"
        return None
    if not isinstance(info, mi.IntType | mi.FloatType) or not isinstance(value, int | float):
        return None
    for bound, holds in (
        ("ge", lambda b: value >= b),
        ("gt", lambda b: value > b),
        ("le", lambda b: value <= b),
        ("lt", lambda b: value < b),
    ):
        limit = getattr(info, bound)
        if limit is not None and not holds(limit):
            return {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}[bound] + f" {limit}"
    return None


def _suggest(key: str, info: mi.StructType, path: str) -> str:
    """A did-you-mean: a close sibling name, or the same name one or more levels down."""
    close = difflib.get_close_matches(key, [f.name for f in info.fields], n=1, cutoff=0.75)
    if close:
        return f" (did you mean {_join(path, close[0])}?)"
    queue = deque([(info, path, 0)])
    while queue:
        struct, prefix, depth = queue.popleft()
        for f in struct.fields:
            inner = _struct_in(f.type)
            if inner is None or depth >= 3:
                continue
            if any(sub.name == key for sub in inner.fields):
                return f" (did you mean {_join(_join(prefix, f.name), key)}?)"
            queue.append((inner, _join(prefix, f.name), depth + 1))
    return ""


def _struct_in(info: mi.Type) -> mi.StructType | None:
    """The Struct a field holds, if it holds one (possibly optional, or as an overlay)."""
    if isinstance(info, mi.Metadata):
        overlay = (info.extra or {}).get("platoon_overlay")
        if overlay is None:
            return _struct_in(info.type)
        overlaid = info_of(overlay)
        return overlaid if isinstance(overlaid, mi.StructType) else None
    if isinstance(info, mi.UnionType):
        return next(filter(None, map(_struct_in, info.types)), None)
    return info if isinstance(info, mi.StructType) else None


# --- paths ----------------------------------------------------------------------------------------


@overload
def resolve_paths(value: dict[str, object], info: mi.Type, base_dir: Path) -> dict[str, object]: ...
@overload
def resolve_paths(value: object, info: mi.Type, base_dir: Path) -> object: ...
def resolve_paths(value: object, info: mi.Type, base_dir: Path) -> object:
    """Make the relative paths in ``value`` absolute against ``base_dir`` (the naming file's folder).

    Fields typed ``FilePath`` always; ``PathOrName`` fields only when written as a path
    (``./``, ``../``, ``~``); and in free-form mappings (``service_kwargs``, ``harness_options``...)
    every string written as a path, since their meaning is not known here. A mapping comes back
    a new mapping with the same keys.
    """
    if isinstance(info, mi.Metadata):
        extra = info.extra or {}
        mode = extra.get("platoon_path")
        if mode is not None and isinstance(value, str):
            return _absolute(value, base_dir) if mode == "path" or _looks_like_path(value) else value
        if extra.get("platoon_overlay") is not None:
            return resolve_paths(value, info_of(extra["platoon_overlay"]), base_dir)
        return resolve_paths(value, info.type, base_dir)
    if isinstance(info, mi.UnionType):
        option = next((option for option in info.types if _fits(value, option)), None)
        return value if option is None else resolve_paths(value, option, base_dir)
    if isinstance(info, mi.StructType) and isinstance(value, dict):
        fields = {f.name: f.type for f in info.fields}
        return {k: resolve_paths(v, fields[k], base_dir) if k in fields else v for k, v in value.items()}
    if isinstance(info, mi.ListType) and isinstance(value, list):
        return [resolve_paths(item, info.item_type, base_dir) for item in value]
    if isinstance(info, mi.DictType) and isinstance(value, dict):
        return {k: resolve_paths(v, info.value_type, base_dir) for k, v in value.items()}
    if isinstance(info, mi.AnyType):
        if isinstance(value, str) and _looks_like_path(value):
            return _absolute(value, base_dir)
        if isinstance(value, dict):
            return {k: resolve_paths(v, info, base_dir) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve_paths(item, info, base_dir) for item in value]
    return value


def _looks_like_path(text: str) -> bool:
    return text in (".", "..", "~") or text.startswith(("./", "../", "~/"))


def _absolute(text: str, base_dir: Path) -> str:
    return os.path.normpath(os.path.join(base_dir, os.path.expanduser(text)))


# --- types ----------------------------------------------------------------------------------------


def type_at(info: mi.Type, parts: list[str]) -> mi.Type | None:
    """The schema type at a dotted path (list indices included), or None where it is free-form."""
    for part in parts:
        container = _container_in(info)
        if isinstance(container, mi.StructType):
            found = next((f.type for f in container.fields if f.name == part), None)
            if found is None:
                return None
            info = found
        elif isinstance(container, mi.ListType):
            info = container.item_type
        elif isinstance(container, mi.DictType):
            info = container.value_type
        else:
            return None
    return info


def _container_in(info: mi.Type) -> mi.Type:
    if isinstance(info, mi.Metadata):
        overlay = (info.extra or {}).get("platoon_overlay")
        return info_of(overlay) if overlay is not None else _container_in(info.type)
    if isinstance(info, mi.UnionType):
        containers = [_container_in(option) for option in info.types]
        return next((c for c in containers if isinstance(c, mi.StructType | mi.ListType | mi.DictType)), info)
    return info


def _fits(value: object, info: mi.Type) -> bool:
    """Whether ``value`` has the shape of ``info`` (mapping, list, string, ...), ignoring contents."""
    if isinstance(info, mi.Metadata):
        return _fits(value, info.type)
    if isinstance(value, dict):
        return isinstance(info, mi.StructType | mi.DictType)
    if isinstance(value, list):
        return isinstance(info, mi.ListType)
    if isinstance(value, str):
        return isinstance(info, mi.StrType | mi.LiteralType)
    return value is None and isinstance(info, mi.NoneType)


def describe(info: mi.Type) -> str:
    """A type as a config author would name it."""
    if isinstance(info, mi.Metadata):
        return describe(info.type)
    if isinstance(info, mi.StructType | mi.DictType):
        return "mapping"
    if isinstance(info, mi.UnionType):
        return _or([describe(option) for option in info.types])
    if isinstance(info, mi.LiteralType):
        return "one of " + ", ".join(repr(choice) for choice in info.values)
    names = {
        mi.IntType: "int",
        mi.FloatType: "float",
        mi.StrType: "str",
        mi.BoolType: "bool",
        mi.NoneType: "null",
        mi.ListType: "list",
        mi.AnyType: "any value",
    }
    return names.get(type(info), type(info).__name__)


def kind(value: object) -> str:
    """The name of a value's type, in YAML's words."""
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__


def _or(names: list[str]) -> str:
    unique = list(dict.fromkeys(names))
    return unique[0] if len(unique) == 1 else ", ".join(unique[:-1]) + " or " + unique[-1]


def _quote_hint(value: object) -> str:
    """Why YAML made a number or a bool of what the author likely meant as text."""
    if isinstance(value, bool):
        return " (quote it: YAML reads yes, no, on, off, true and false as booleans)"
    if isinstance(value, int | float):
        return " (quote it to make it a string)"
    return ""


def _join(path: str, key: str | int) -> str:
    return f"{path}.{key}" if path else str(key)

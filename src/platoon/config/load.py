"""Reading config files: ``extends:``, ``key=value`` overrides and strict validation.

A config is read in three layers, lowest first: the files it extends (each resolved the same way,
relative to the file that names it), the file itself, then the overrides from the command line.
Mappings merge deeply and lists replace. The result is checked against ``Config`` as a whole, and
every problem is raised at once as a ``ConfigError``.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import yaml

from .merge import deep_merge
from .policies import resolve_policies
from .schema import Config
from .validate import ConfigError, build, check, info_of, kind, resolve_paths, type_at

__all__ = ["dumps_yaml", "load_config", "read_file", "to_builtins", "validate_config"]


def load_config(path: str | os.PathLike[str], overrides: Sequence[str] = ()) -> Config:
    """Load a config file with what it extends, apply ``key=value`` overrides and validate it.

    Relative paths in the file are resolved against its folder; those in overrides against the
    current directory.
    """
    problems: list[str] = []
    data = _load_layers(Path(os.path.abspath(path)), (), problems)
    if problems:
        raise ConfigError(problems)
    for override in overrides:
        _apply_override(data, override, problems)
    return validate_config(data, problems=problems)


def validate_config(
    data: Mapping[str, object], *, base_dir: Path | None = None, problems: Sequence[str] = ()
) -> Config:
    """Check plain data (as a config file holds it) and build the ``Config``, or raise every problem.

    Relative paths are resolved against ``base_dir`` (default: the current directory).
    """
    data = resolve_paths(dict(data), info_of(Config), base_dir or Path.cwd())
    found = [*problems, *check(data, info_of(Config)), *_cross_checks(data)]
    if data.get("extends") is not None:
        found.append("extends: only a config file can extend another")
    if found:
        raise ConfigError(found)
    config = build(data, Config)
    found = _reference_token_checks(config)
    if found:
        raise ConfigError(found)
    return config


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The mapping a YAML, JSON or TOML file holds (by extension; YAML otherwise), or ConfigError.

    Its values are as the file wrote them, unchecked: a caller reads them with ``isinstance``.
    """
    problems: list[str] = []
    data = _read(Path(path), problems)
    if problems:
        raise ConfigError(problems)
    return data


def to_builtins(config: Config) -> dict[str, Any]:
    """The config as plain data, every default written out; ``validate_config`` reads it back."""
    data = msgspec.to_builtins(config)
    data.pop("extends", None)
    return data


def dumps_yaml(config: Config | Mapping[str, object]) -> str:
    """YAML text of a config (or of plain data), in schema order."""
    data = to_builtins(config) if isinstance(config, Config) else dict(config)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


# --- files and extends ----------------------------------------------------------------------------


def _load_layers(path: Path, chain: tuple[Path, ...], problems: list[str]) -> dict[str, object]:
    if path in chain:
        problems.append("extends cycle: " + " -> ".join(_show(p) for p in (*chain, path)))
        return {}
    data = _read(path, problems, extended_by=chain[-1] if chain else None)
    extends = data.pop("extends", None)
    bases: list[str]
    if extends is None:
        bases = []
    elif isinstance(extends, str):
        bases = [extends]
    elif isinstance(extends, list) and all(isinstance(base, str) for base in extends):
        bases = extends
    else:
        problems.append(f"{_show(path)}: extends: expected a path or a list of paths, got {kind(extends)}")
        bases = []
    merged: dict[str, object] = {}
    for base in bases:
        base_path = Path(os.path.normpath(path.parent / os.path.expanduser(base)))
        merged = deep_merge(merged, _load_layers(base_path, (*chain, path), problems))
    return deep_merge(merged, resolve_paths(data, info_of(Config), path.parent))


def _read(path: Path, problems: list[str], extended_by: Path | None = None) -> dict[str, object]:
    shown = _show(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        by = f" (extended by {_show(extended_by)})" if extended_by else ""
        problems.append(f"{shown}: file not found{by}")
        return {}
    except IsADirectoryError:
        problems.append(f"{shown}: is a directory, not a config file")
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"{shown}: cannot read: {getattr(exc, 'strerror', None) or exc}")
        return {}
    try:
        data = _parse(text, path.suffix.lower())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problems.append(f"{shown}{line}: bad YAML: {exc.problem or exc.context}")
        return {}
    except yaml.YAMLError as exc:
        problems.append(f"{shown}: bad YAML: {exc}")
        return {}
    except json.JSONDecodeError as exc:
        problems.append(f"{shown}:{exc.lineno}: bad JSON: {exc.msg}")
        return {}
    except tomllib.TOMLDecodeError as exc:
        problems.append(f"{shown}: bad TOML: {exc}")
        return {}
    if data is None:
        return {}
    if not isinstance(data, dict):
        problems.append(f"{shown}: expected a mapping at the top level, got {kind(data)}")
        return {}
    return data


def _parse(text: str, suffix: str) -> object:
    if suffix == ".json":
        return json.loads(text)
    if suffix == ".toml":
        return tomllib.loads(text)
    return yaml.load(text, Loader=_StrictLoader)  # nosec B506 # _StrictLoader is a SafeLoader


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key written twice is an error rather than a silent win."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, object]:
        seen: set[str] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str) or key == "<<":
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _show(path: Path) -> str:
    """A path as the user most likely wrote it: relative to here when below here."""
    relative = os.path.relpath(path)
    return path.as_posix() if relative.startswith("..") else Path(relative).as_posix()


# --- overrides ------------------------------------------------------------------------------------


def _apply_override(data: dict[str, object], override: str, problems: list[str]) -> None:
    key, sep, raw = override.partition("=")
    append = key.endswith("+")
    key = key.removesuffix("+")
    parts = key.split(".")
    if not sep or not all(parts):
        problems.append(f"override {override}: expected key=value or key+=value with a dotted key")
        return
    try:
        value = yaml.load(raw, Loader=_StrictLoader)  # nosec B506 # _StrictLoader is a SafeLoader
    except yaml.YAMLError as exc:
        problems.append(f"override {override}: bad value: {getattr(exc, 'problem', None) or exc}")
        return
    target = type_at(info_of(Config), [*parts, "0"] if append else parts)
    # A value YAML reads as a number or a bool stays the text it was where the schema wants text
    # (``stats.trial_name=007``).
    if target is not None and check(value, target) and not check(raw, target):
        value = raw
    error = _set(data, parts, value, append)
    if error:
        problems.append(f"override {override}: {error}")


def _set(data: dict[str, object], parts: list[str], value: object, append: bool) -> str | None:
    """Set ``value`` at a dotted path, creating missing mappings on the way; an error or None."""
    node: object = data
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth]) or "the top level"
        slot: str | int
        if isinstance(node, dict):
            slot = part
        elif isinstance(node, list):
            try:
                slot = int(part)
            except ValueError:
                return f"{where} is a list; expected an index, got {part!r}"
            if not -len(node) <= slot < len(node):
                return f"index {slot} out of range for {where} (length {len(node)})"
        else:
            return f"{where} is {_a(kind(node))}, not a mapping or a list"
        if depth < len(parts) - 1:
            if _get(node, slot) is None:
                _put(node, slot, {})  # a missing (or null) mapping on the way is created
            node = _get(node, slot)
        elif not append:
            _put(node, slot, value)
        else:
            current = _get(node, slot)
            if current is None:
                _put(node, slot, [value])
            elif isinstance(current, list):
                _put(node, slot, [*current, value])
            else:
                return f"{'.'.join(parts)} is {_a(kind(current))}; += appends to a list"
    return None


def _get(node: dict[str, object] | list[object], slot: str | int) -> object:
    """What a mapping holds at a key (None where it has none), or a list at an index in range."""
    return node.get(str(slot)) if isinstance(node, dict) else node[int(slot)]


def _put(node: dict[str, object] | list[object], slot: str | int, value: object) -> None:
    if isinstance(node, dict):
        node[str(slot)] = value
    else:
        node[int(slot)] = value


# --- rules across keys ----------------------------------------------------------------------------


def _cross_checks(data: Mapping[str, object]) -> list[str]:
    """Rules that no single key's type can say; tolerant of data that is badly typed elsewhere."""
    problems: list[str] = []
    environments = data.get("environments")
    # `platoon sft` alone learns from recorded episodes: a config for it may have no environment
    rl = data.get("train") is not None and data.get("sft") is None
    if environments in (None, []) and (rl or data.get("eval") is not None):
        problems.append("environments: at least one entry is needed to train or evaluate")
    environments = environments if isinstance(environments, list) else []
    names: dict[str, int] = {}
    for index, entry in enumerate(environments):
        if not isinstance(entry, dict):
            continue
        if entry.get("env") is None and entry.get("service") is None:
            problems.append(f"environments.{index}: set env or service")
        name = entry.get("name")
        if isinstance(name, str) and name in names:
            problems.append(
                f"environments.{index}.name: {name!r} is already used by environments.{names[name]}"
            )
        elif isinstance(name, str):
            names[name] = index
    stats = data.get("stats")
    for key in ("experiment_name", "trial_name"):
        name = stats.get(key) if isinstance(stats, dict) else None
        if isinstance(name, str) and (name in ("", ".", "..") or "/" in name or "\\" in name):
            problems.append(f"stats.{key}: {name!r} must be a single folder name")
    plugins = data.get("plugins")
    for index, plugin in enumerate(plugins if isinstance(plugins, list) else []):
        if not isinstance(plugin, dict):
            continue
        given = [key for key in ("handler", "component") if plugin.get(key) is not None]
        if len(given) != 1:
            problems.append(f"plugins.{index}: set exactly one of handler or component")
    problems += _policy_checks(data, environments)
    return problems


def _policy_checks(data: Mapping[str, object], environments: list[object]) -> list[str]:
    """`policies:` and each entry's `agents.policy` name one another (see RFC 0001)."""
    problems: list[str] = []
    policies = data.get("policies")
    names = list(policies) if isinstance(policies, dict) else []
    if isinstance(policies, dict):
        for name in policies:
            if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
                problems.append(f"policies.{name}: a policy's name is letters, digits, - and _ only")
        if data.get("train") is None:
            problems.append("policies: needs a train: section (the schedule, and what a policy leaves out)")
        elif all(isinstance(p, dict) and p.get("frozen") is True for p in policies.values()):
            problems.append("policies: every policy is frozen, so nothing would train")
        checkpoint = data.get("checkpoint")
        if isinstance(checkpoint, dict) and checkpoint.get("load_path") is not None:
            problems.append(
                "checkpoint.load_path: one training state cannot start several policies; "
                "name each policy's own with policies.<name>.load_path"
            )
        for name, policy in policies.items():
            if isinstance(policy, dict) and policy.get("frozen") is True and policy.get("load_path"):
                problems.append(
                    f"policies.{name}.load_path: a frozen policy never trains; "
                    "it samples model_path (sampler weights)"
                )
    problems += _kl_reference_checks(data, policies if isinstance(policies, dict) else {})
    for index, entry in enumerate(environments):
        agents = entry.get("agents") if isinstance(entry, dict) else None
        choice = agents.get("policy") if isinstance(agents, dict) else None
        where = f"environments.{index}.agents.policy"
        if not isinstance(choice, dict):
            if len(names) > 1:
                problems.append(f"{where}: the config has several policies; say which plays each agent")
            continue
        if not names:
            problems.append(f"{where}: names policies, but the config has no policies: section")
            continue
        mapping = choice.get("map")
        for key, value in mapping.items() if isinstance(mapping, dict) else []:
            if isinstance(value, str) and value not in names:
                problems.append(f"{where}.map.{key}: {value!r} is not one of policies: {', '.join(names)}")
            if choice.get("by") == "depth" and not (isinstance(key, str) and key.isdigit()):
                problems.append(f'{where}.map.{key}: a depth is written as a quoted number, e.g. "0"')
    return problems


# What scores a trained policy's own tokens under another policy: (its section, the key that
# names a frozen policy, the key that names weights, what that policy is to the trained one,
# what a frozen policy cannot take)
_REFERENCES = (
    ("kl", "reference_policy", "reference_path", "a KL reference", "KL penalty"),
    ("distill", "teacher", "teacher_path", "a teacher", "teacher"),
)


def _kl_reference_checks(data: Mapping[str, object], policies: Mapping[str, object]) -> list[str]:
    """`kl.reference_policy` and `distill.teacher` name a frozen policy whose logprobs are
    comparable with those of each trained policy that takes it (one tokenizer, one renderer)."""
    problems: list[str] = []
    train = given if isinstance(given := data.get("train"), dict) else {}
    entries = {name: p for name, p in policies.items() if isinstance(p, dict)}
    frozen = {name for name, p in entries.items() if p.get("frozen") is True}
    for section, by_name, by_path, role, takes in _REFERENCES:
        places = [
            (f"train.{section}", train.get(section)),
            *((f"policies.{n}.{section}", p.get(section)) for n, p in entries.items()),
        ]
        for where, given in places:
            reference = given.get(by_name) if isinstance(given, dict) else None
            if not isinstance(given, dict) or not isinstance(reference, str):
                continue  # none, or of the wrong type (which the schema check reports)
            if given.get(by_path) is not None:
                problems.append(f"{where}: set {by_path} or {by_name}, not both")
            if not policies:
                problems.append(f"{where}.{by_name}: names a frozen policy, but the config has no policies:")
            elif reference not in policies:
                problems.append(
                    f"{where}.{by_name}: {reference!r} is not one of policies: {', '.join(policies)}"
                )
            elif reference not in frozen:
                problems.append(f"{where}.{by_name}: {reference!r} trains; {role} is a frozen policy")
        for name in frozen:
            if entries[name].get(section) is not None:
                problems.append(
                    f"policies.{name}.{section}: a frozen policy never trains, so it takes no {takes}"
                )
    return problems


def _reference_token_checks(config: Config) -> list[str]:
    """A trained policy and the frozen policy it takes as KL reference or teacher score the same
    tokens: one tokenizer, one renderer (read from the policies as resolved, each key `train:`'s
    where the policy leaves it out). A policy takes a teacher or a KL reference, not both."""

    problems: list[str] = []
    specs = resolve_policies(config) if config.policies else {"default": None}
    for name, spec in specs.items():
        train = spec.train if spec is not None else config.train
        if train is None or (spec is not None and spec.frozen):
            continue
        own = config.policies[name] if config.policies else None
        if train.kl is not None and train.distill is not None:
            where = f"policies.{name}" if own is not None and (own.kl or own.distill) else "train"
            problems.append(
                f"{where}: distill and kl at once; the teacher already keeps the policy near it "
                "(drop kl:, or distill with a weight below 1 to keep the task's reward)"
            )
        for section, by_name, *_ in _REFERENCES:
            given = getattr(train, section)
            reference = getattr(given, by_name) if given is not None else None
            other = specs.get(reference or "")
            if spec is None or other is None or not other.frozen:
                continue  # no reference by name, or one the checks of the raw config refused
            where = (
                f"policies.{name}.{section}"
                if getattr(own, section, None) is not None
                else f"train.{section}"
            )
            mine = spec.train.tokenizer or spec.train.model_name
            theirs = other.train.tokenizer or other.train.model_name
            if mine != theirs:
                problems.append(
                    f"{where}.{by_name}: {reference!r} has the tokenizer {theirs!r} and {name} "
                    f"{mine!r}; the {by_name.split('_')[0]} scores {name}'s tokens, so they need one tokenizer (set "
                    "tokenizer: alike on both where two models share one)"
                )
            if spec.train.renderer_name != other.train.renderer_name:
                problems.append(
                    f"{where}.{by_name}: {reference!r} renders with {other.train.renderer_name!r} "
                    f"and {name} with {spec.train.renderer_name!r}; their logprobs would not compare"
                )
    return problems


def _a(noun: str) -> str:
    return ("an " if noun[0] in "aeiou" else "a ") + noun

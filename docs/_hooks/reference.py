"""The reference pages, generated from the code at build time so they cannot drift.

mkdocs loads this file as a hook (``hooks:`` in mkdocs.yml): ``on_files`` adds one generated page
per entry of ``PAGES``. The tests import it too (``tests/docs/``) to check that every key has a
description. Nothing here states a fact of the code by hand except the short descriptions of the
harness spec's keys and placeholders, and a test fails when those and the code disagree.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import io
import os
import textwrap
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "platoon"
REPO_URL = "https://github.com/ApGa/platoon/blob/main"

GENERATED_NOTE = (
    "<!-- Generated from the code by docs/_hooks/reference.py at build time: do not edit. -->\n\n"
    '!!! note "Generated"\n    This page is generated from the code each time the documentation is built.\n\n'
)


# --- types ----------------------------------------------------------------------------------------


def type_name(info: mi.Type) -> str:
    """A short, readable name for a msgspec type."""
    if isinstance(info, mi.Metadata):
        inner = type_name(info.type)
        bounds = []
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(info.type, attr, None)
            if value is not None:
                bounds.append(f"{sign} {value}")
        extra = info.extra or {}
        if extra.get("platoon_path") == "path":
            inner = "path"
        elif extra.get("platoon_path") == "maybe":
            inner = "path or name"
        elif extra.get("platoon_overlay") is not None:
            inner = f"partial {extra['platoon_overlay'].__name__}"
        return f"{inner} ({', '.join(bounds)})" if bounds else inner
    if isinstance(info, mi.UnionType):
        return " | ".join(type_name(t) for t in info.types)
    if isinstance(info, mi.LiteralType):
        return " | ".join(repr(v) for v in info.values)
    if isinstance(info, mi.ListType):
        return f"list[{type_name(info.item_type)}]"
    if isinstance(info, mi.DictType):
        return f"dict[{type_name(info.key_type)}, {type_name(info.value_type)}]"
    if isinstance(info, mi.StructType):
        return info.cls.__name__
    if isinstance(info, mi.AnyType):
        return "any"
    if isinstance(info, mi.NoneType):
        return "null"
    names = {
        mi.IntType: "int",
        mi.FloatType: "float",
        mi.StrType: "str",
        mi.BoolType: "bool",
    }
    for kind, name in names.items():
        if isinstance(info, kind):
            bounds = []
            for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
                value = getattr(info, attr, None)
                if value is not None:
                    bounds.append(f"{sign} {value}")
            if getattr(info, "min_length", None):
                bounds.append(f"length ≥ {info.min_length}")
            return f"{name} ({', '.join(bounds)})" if bounds else name
    return type(info).__name__.removesuffix("Type").lower()


def struct_of(info: mi.Type) -> mi.StructType | None:
    """The struct a field holds (directly, or as the one struct of an optional), else None."""
    if isinstance(info, mi.Metadata):
        return struct_of(info.type)
    if isinstance(info, mi.StructType):
        return info
    if isinstance(info, mi.UnionType):
        structs = [t for t in info.types if isinstance(t, mi.StructType)]
        return structs[0] if len(structs) == 1 else None
    if isinstance(info, mi.ListType):
        return struct_of(info.item_type)
    return None


def default_text(f: mi.Field) -> str:
    if f.required:
        return "required"
    if f.default_factory is not msgspec.NODEFAULT:
        value = f.default_factory()
    else:
        value = f.default
    if value is msgspec.UNSET or value is msgspec.NODEFAULT:
        return "—"
    if isinstance(value, msgspec.Struct):
        return "(see below)"
    return f"`{msgspec.json.encode(msgspec.to_builtins(value)).decode()}`"


def field_comments(cls: type) -> dict[str, str]:
    """The comment at the end of each field's line in a class's source: its description."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    found: dict[str, str] = {}
    tree = ast.parse(source)
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            text = comments.get(node.end_lineno or node.lineno)
            if not text:  # else the block of comment lines right above the field
                above, line = [], node.lineno - 1
                while line in comments and source.splitlines()[line - 1].lstrip().startswith("#"):
                    above.insert(0, comments[line])
                    line -= 1
                text = " ".join(above)
            if text:
                found[node.target.id] = text
    return found


def first_line(doc: str | None) -> str:
    return inspect.cleandoc(doc).split("\n\n")[0].replace("\n", " ") if doc else ""


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# --- the config -----------------------------------------------------------------------------------


@dataclass
class KeyDoc:
    path: str
    type: str
    default: str
    description: str


@dataclass
class StructDoc:
    path: str
    cls: type
    keys: list[KeyDoc] = field(default_factory=list)


def walk_struct(cls: type, path: str = "") -> Iterator[StructDoc]:
    """Every struct reachable from ``cls``, with its keys, in schema order."""
    info = mi.type_info(cls)
    comments = field_comments(cls)
    doc = StructDoc(path, cls)
    nested: list[tuple[str, type]] = []
    for f in info.fields:
        key = f"{path}.{f.name}" if path else f.name
        inner = struct_of(f.type)
        description = comments.get(f.name, "")
        if inner is not None and not description:
            description = first_line(inner.cls.__doc__)
        if isinstance(f.type, mi.ListType) and inner is not None:
            nested.append((f"{key}.N", inner.cls))
        elif inner is not None:
            nested.append((key, inner.cls))
        doc.keys.append(KeyDoc(key, type_name(f.type), default_text(f), description))
    yield doc
    for sub_path, sub in nested:
        yield from walk_struct(sub, sub_path)


def struct_table(doc: StructDoc, *, names: str = "path") -> str:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for key in doc.keys:
        shown = key.path if names == "path" else key.path.rsplit(".", 1)[-1]
        lines.append(f"| `{shown}` | {cell(key.type)} | {cell(key.default)} | {cell(key.description)} |")
    return "\n".join(lines)


def config_page() -> str:
    from platoon.config import Config, dumps_yaml

    out = [
        "# Config reference\n",
        GENERATED_NOTE,
        "Every key a config file may hold, from the schema in "
        f"[`platoon/config/schema.py`]({REPO_URL}/src/platoon/config/schema.py). "
        "A key that is not listed here is an error, and so is a value of the wrong type; the error "
        "names the dotted path (`environments.0.harness_options.num_retries`). `N` stands for a "
        "list index. `extends:` (a path or a list of paths) composes files: mappings merge deeply "
        "and lists replace; `key=value` on the command line overrides any entry "
        "(`key+=value` appends to a list).\n",
        "Types: *path* is made absolute relative to the file that names it; *path or name* is "
        "made absolute only when written as a path (`./x`, `../x`, `~/x`), so model names and "
        "`tinker://` paths pass through. *partial WorkflowConfig* takes any subset of "
        "[`train.workflow_config`](#trainworkflow_config) and lays it over the training one.\n",
    ]
    for doc in walk_struct(Config):
        title = doc.path or "top level"
        anchor_doc = first_line(doc.cls.__doc__)
        out.append(f"## `{title}`\n")
        if anchor_doc:
            out.append(f"{anchor_doc} (`{doc.cls.__name__}`)\n")
        out.append(struct_table(doc) + "\n")
    out.append("## Every default, written out\n")
    out.append(
        "What a config with one environment entry and a `train:` section resolves to "
        "(`platoon train` writes this as `config.yaml` into the run directory):\n"
    )
    from platoon.config import validate_config

    sample = validate_config(
        {
            "environments": [{"name": "guess", "service": "python://guess:GuessTheNumber"}],
            "train": {"model_name": "Qwen/Qwen3-4B-Instruct-2507", "renderer_name": "qwen3_instruct"},
        }
    )
    out.append("```yaml\n" + dumps_yaml(sample) + "```\n")
    return "\n".join(out)


def site_page() -> str:
    from platoon.config.site import Site
    from platoon.sandbox.registry import provider_names

    (doc,) = list(walk_struct(Site))
    return "\n".join(
        [
            "# Site profile reference\n",
            GENERATED_NOTE,
            "Facts of a machine or a cluster that no project config should repeat: where runs are "
            "written, where fetched and built things are cached, and which runtime starts task "
            "sandboxes. platoon reads the file `$PLATOON_SITE` names, else "
            "`$XDG_CONFIG_HOME/platoon/site.yaml` (`~/.config/platoon/site.yaml`). A file named by "
            "`$PLATOON_SITE` must exist; the default one may be absent, and then every key has its "
            "default. Unknown keys are errors; relative paths are taken from the profile's folder, "
            "and `~` is expanded.\n",
            struct_table(doc, names="key") + "\n",
            "Sandbox providers known in this build (built-in, registered, or from the "
            "`platoon.sandbox_providers` entry point group): "
            + ", ".join(f"`{name}`" for name in provider_names())
            + ". `auto` picks `docker` when a Docker engine answers on its usual socket, else "
            "`bwrap`.\n",
            "```yaml\n# ~/.config/platoon/site.yaml\nruns: ~/platoon-runs\ncache: ~/.cache/platoon\n"
            "provider: auto\n```\n",
        ]
    )


# --- the command line -----------------------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                found.append((name, helps.get(name) or "", sub))
    return found


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                name += " " + (action.metavar or action.dest.upper())
        else:
            name = action.metavar or action.dest
            if action.nargs in ("*", "+"):
                name += " ..."
        notes = []
        if action.required and action.option_strings:
            notes.append("required")
        if action.choices:
            notes.append("one of " + ", ".join(f"`{c}`" for c in action.choices))
        if action.default not in (None, False, argparse.SUPPRESS) and action.nargs != 0:
            notes.append(f"default `{action.default}`")
        if isinstance(action, argparse._AppendAction):
            notes.append("repeatable")
        help_text = (action.help or "").replace("%(default)s", str(action.default))
        rows.append(f"| `{name}` | {cell(help_text)} | {cell('; '.join(notes))} |")
    return rows


def _command_sections(parser: argparse.ArgumentParser, words: list[str], depth: int) -> Iterator[str]:
    for name, help_text, sub in _subcommands(parser):
        full = [*words, name]
        title = "#" * min(depth, 4)
        yield f"{title} `{' '.join(full)}`\n"
        if help_text:
            yield help_text[0].upper() + help_text[1:] + ".\n"
        usage = sub.format_usage().strip().removeprefix("usage: ")
        yield f"```text\n{usage}\n```\n"
        rows = _option_rows(sub)
        if rows:
            yield "| argument | what it does | notes |\n|---|---|---|\n" + "\n".join(rows) + "\n"
        yield from _command_sections(sub, full, depth + 1)


def cli_page() -> str:
    from platoon.cli import build_parser

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # usage lines wrap at the terminal's width: fix it
    try:
        parser = build_parser()
        out = [
            "# Command-line reference\n",
            GENERATED_NOTE,
            f"{parser.description}\n",
            "Every command that takes a `CONFIG` also takes `KEY=VALUE` overrides after it "
            "(see the [config reference](config.md)). A config error exits with code 2 and one line "
            "per problem; any other error exits 1 with one line, and `--debug` shows the traceback. "
            "SIGTERM stops a run like Ctrl-C, flushing what it has written.\n",
            "## `platoon`\n",
            "Options that come before the command:\n",
            "| argument | what it does | notes |\n|---|---|---|\n" + "\n".join(_option_rows(parser)) + "\n",
            *_command_sections(parser, ["platoon"], 2),
        ]
    finally:
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns
    return "\n".join(out)


def cli_commands() -> list[str]:
    """Every command line that the CLI page documents, as words (for the tests)."""
    from platoon.cli import build_parser

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> Iterator[str]:
        for name, _, sub in _subcommands(parser):
            full = [*words, name]
            yield " ".join(full)
            yield from walk(sub, full)

    return list(walk(build_parser(), ["platoon"]))


# --- events ---------------------------------------------------------------------------------------


@dataclass
class EventUse:
    """Where the source names an event type: modules that construct it and that take it."""

    publishers: dict[str, set[str]] = field(default_factory=dict)
    subscribers: dict[str, set[str]] = field(default_factory=dict)


def _scope_name(module: str, stack: list[str]) -> str:
    return f"{module}:{stack[0]}" if stack else module


def scan_event_use(names: set[str], root: Path = SRC) -> dict[str, EventUse]:
    """Which code constructs each event type (publishes it, or replies with it) and which
    subscribes to it, streams it or matches it with ``isinstance``, read from the source.

    Constructing an event is how code publishes it: every ``X(...)`` of an event class outside
    ``bus/events.py`` is counted as a publisher. A subscriber is ``subscribe(X, ...)``,
    ``stream(X, ...)`` or ``isinstance(value, X)`` (or a tuple holding ``X``).
    """
    uses = {name: EventUse() for name in names}
    for path in sorted(root.rglob("*.py")):
        if path.name == "events.py" and path.parent.name == "bus":
            continue
        module = "platoon." + ".".join(path.relative_to(root).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        tree = ast.parse(path.read_text(encoding="utf-8"))
        _visit(tree, module, [], names, uses)
    return uses


def _event_names_in(node: ast.AST, names: set[str]) -> list[str]:
    if isinstance(node, ast.Name) and node.id in names:
        return [node.id]
    if isinstance(node, ast.Attribute) and node.attr in names:
        return [node.attr]
    if isinstance(node, ast.Tuple):
        return [n for item in node.elts for n in _event_names_in(item, names)]
    return []


def _visit(node: ast.AST, module: str, stack: list[str], names: set[str], uses: dict[str, EventUse]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            _visit(child, module, [*stack, child.name], names, uses)
            continue
        if isinstance(child, ast.MatchClass):  # case EpisodeGraded(...):
            for name in _event_names_in(child.cls, names):
                uses[name].subscribers.setdefault(_scope_name(module, stack), set())
        if (  # a table of handlers: (EventType, self._on_event)
            isinstance(child, ast.Tuple)
            and len(child.elts) == 2
            and _event_names_in(child.elts[0], names)
            and isinstance(child.elts[1], (ast.Attribute, ast.Name))
            and not _event_names_in(child.elts[1], names)
        ):
            for name in _event_names_in(child.elts[0], names):
                uses[name].subscribers.setdefault(_scope_name(module, stack), set())
        if isinstance(child, ast.Call):
            scope = _scope_name(module, stack)
            func = child.func
            called = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if called in names:
                uses[called].publishers.setdefault(scope, set())
            if called in ("subscribe", "stream") and child.args:
                for name in _event_names_in(child.args[0], names):
                    uses[name].subscribers.setdefault(scope, set())
            if called == "isinstance" and len(child.args) == 2:
                for name in _event_names_in(child.args[1], names):
                    uses[name].subscribers.setdefault(scope, set())
        _visit(child, module, stack, names, uses)


def _field_rows(cls: type) -> list[str]:
    info = mi.type_info(cls)
    comments = field_comments(cls)
    rows = ["| field | type | default | description |", "|---|---|---|---|"]
    for f in info.fields:
        rows.append(
            f"| `{f.name}` | {cell(type_name(f.type))} | {cell(default_text(f))} | {cell(comments.get(f.name, ''))} |"
        )
    return rows


def _code_link(scope: str) -> str:
    module, _, cls = scope.partition(":")
    path = "src/" + module.replace(".", "/")
    path += "/__init__.py" if (ROOT / path).is_dir() else ".py"
    shown = module.removeprefix("platoon.") + (f".{cls}" if cls else "")
    return f"[`{shown}`]({REPO_URL}/{path})"


def events_page() -> str:
    from platoon.bus import events

    types = sorted(
        (cls for cls in events.event_types() if cls.__module__ == events.__name__), key=lambda c: c.__name__
    )
    uses = scan_event_use({cls.__name__ for cls in types})
    out = [
        "# Event reference\n",
        GENERATED_NOTE,
        "Every event type of `platoon.bus.events`. Events are frozen, tagged msgspec structs: the "
        "object a handler receives is what the event log writes and what the NATS bridge carries. "
        "A `Request` expects exactly one `Reply` whose `reply_to` is its `request_id`; every "
        "event type below that is a request or a reply says so.\n",
        "*Published by* lists the code that constructs the event (which is how code publishes it "
        "or replies with it); *taken by* lists the code that subscribes to it, streams it, "
        "matches it (`isinstance`, `case X()`) or lists it with a handler. Both are read from the source when the docs are built, so "
        "they follow the code. Components that take every event (the event log, metrics, the "
        "NATS bridge) are not listed under each type.\n",
        "| event | kind | published by | taken by |",
        "|---|---|---|---|",
    ]
    for cls in types:
        use = uses[cls.__name__]
        kind = (
            "request"
            if issubclass(cls, events.Request)
            else "reply"
            if issubclass(cls, events.Reply)
            else "fact"
        )
        pubs = ", ".join(_code_link(s) for s in sorted(use.publishers)) or "—"
        subs = ", ".join(_code_link(s) for s in sorted(use.subscribers)) or "—"
        out.append(f"| [`{cls.__name__}`](#{cls.__name__.lower()}) | {kind} | {pubs} | {subs} |")
    out.append("")
    common = {
        "Request": "`request_id` (a fresh id) is added to every request",
        "Reply": "`reply_to` (the request's id) and `error` (set when the responder could not answer) "
        "are added to every reply",
    }
    for base, text in common.items():
        out.append(f"{base}s: {text}.\n")
    for cls in types:
        out.append(f"## `{cls.__name__}`\n")
        if cls.__doc__ and cls.__doc__ is not events.Event.__doc__:
            out.append(inspect.cleandoc(cls.__doc__) + "\n")
        base = (
            "Request" if issubclass(cls, events.Request) else "Reply" if issubclass(cls, events.Reply) else ""
        )
        own = [
            f
            for f in mi.type_info(cls).fields
            if f.name not in ("request_id", "reply_to", "error") or not base
        ]
        if own:
            rows = _field_rows(cls)
            rows = rows[:2] + [r for r in rows[2:] if r.split("`")[1] in {f.name for f in own}]
            out.append("\n".join(rows) + "\n")
    out.append("## Types used by events\n")
    for helper in (events.TaskRef, events.ToolSpec, events.Datum):
        out.append(f"### `{helper.__name__}`\n")
        if helper.__doc__:
            out.append(inspect.cleandoc(helper.__doc__) + "\n")
        out.append("\n".join(_field_rows(helper)) + "\n")
    return "\n".join(out)


# --- harness specs --------------------------------------------------------------------------------

# What each key of a TOML spec means. tests/docs checks that these keys are exactly the spec's.
SPEC_KEYS = {
    "name": "The harness's name, as a config names it (`harness: NAME`).",
    "command": "The program and its arguments; placeholders are filled per episode.",
    "description": "One paragraph for `platoon harness list` and `show`.",
    "env": "The program's whole environment (in a sandbox nothing else of the host's is set); "
    "values take placeholders.",
    "files": "Files written into the work dir before the program starts, by relative path; "
    "contents take placeholders.",
    "install": "A command run once before the first episode (host runs), with static placeholders only.",
    "options": "Typed options (`[options.NAME]`) that a config sets in `harness_options`; "
    "checked before anything runs.",
    "exit_codes": "Exit code → episode status (`completed`, `limit`, `timeout`, `error`); "
    "0 is `completed`, any other unlisted code `error`.",
    "timeout": "Seconds before the program's process group is killed (the episode ends as `timeout`).",
    "runs_in": "`sandbox` (the default: in the task's sandbox, or a fresh one) or `host` "
    "(a host process with the host's environment: trusted code only).",
    "toolchain": "Pinned packages built once into the site cache and mounted read-only at `{toolchain}`.",
    "output_cap": "Bytes of the tail of stdout and of stderr kept; stdout's tail is the agent's final message.",
    "checks_tool_calls": "`true` when the agent checks its tool calls itself and answers a bad one "
    "(OpenHands): the gateway then returns calls the tools' schemas do not fit as calls, not text.",
}
OPTION_KEYS = {
    "type": "`int`, `float`, `str` or `bool`.",
    "default": "The value when the config sets none; without a default the option is required.",
    "min": "Lowest value (int and float options).",
    "max": "Highest value (int and float options).",
    "choices": "The allowed values (int and str options).",
    "description": "Shown by `platoon harness show`.",
}
TOOLCHAIN_KEYS = {
    "pip": "pip requirements, each pinned with `==` to one version, installed into a venv.",
    "npm": "npm packages, each pinned with `@` to one version; their bins are linked into `bin/`.",
    "python": "The interpreter the venv is made with (the sandbox must have it too), or a version "
    '(`"3.12"`): the site\'s `pythons:` or one platoon finds, mounted read-only into the sandbox.',
}
PLACEHOLDERS = {
    "instruction": "The task's instruction for this agent.",
    "gateway_url": "The gateway's OpenAI-compatible root (`.../v1`); the Anthropic dialect is "
    "served under the same root.",
    "gateway_root": "The same as `{gateway_url}` without `/v1`, for clients that add it themselves "
    "(Anthropic's).",
    "api_key": "The agent's own gateway key, valid until its episode ends.",
    "max_steps": "The agent's budget of model calls.",
    "mcp_url": "The environment's tools as an MCP server (streamable HTTP).",
    "workdir": "The program's work dir (in a sandbox: its home, where `[files]` are written).",
    "python": "An interpreter: platoon's own on the host, `python3` in a sandbox.",
    "spec_dir": "The spec's folder (in a sandbox: mounted read-only at `/opt/platoon/spec`).",
    "cache_dir": "The harness's own folder in the site cache, where `install` may put things.",
    "toolchain": "Where the toolchain is (in a sandbox: `/opt/platoon/toolchain`, its `bin` first on PATH).",
}


def _described_table(cls: type, descriptions: dict[str, str]) -> str:
    info = mi.type_info(cls)
    rows = ["| key | type | default | what it is |", "|---|---|---|---|"]
    for f in info.fields:
        rows.append(
            f"| `{f.name}` | {cell(type_name(f.type))} | {cell(default_text(f))} | {cell(descriptions.get(f.name, ''))} |"
        )
    return "\n".join(rows)


def spec_page() -> str:
    from platoon.harness import command
    from platoon.harness.toolchain import Toolchain

    static = sorted(command._STATIC)
    episode = sorted(command._EPISODE)
    rows = ["| placeholder | where it may be used | what it becomes |", "|---|---|---|"]
    for name in episode:
        rows.append(f"| `{{{name}}}` | `command`, `env`, `files` | {PLACEHOLDERS[name]} |")
    rows.append(
        "| `{option.NAME}` | `command`, `env`, `files` | The value of option NAME for this episode. |"
    )
    for name in static:
        rows.append(f"| `{{{name}}}` | everywhere, `install` too | {PLACEHOLDERS[name]} |")
    shipped = sorted((SRC / "harness" / "specs").glob("*.toml"))
    return "\n".join(
        [
            "# Harness spec reference\n",
            GENERATED_NOTE,
            "A command-line agent is a harness described by a TOML file: `harness: path/to/agent.toml` "
            "in a config, or a spec shipped in `platoon/harness/specs/` by its name. The spec is "
            "checked strictly when the config is loaded: an unknown key, a wrong type, an unpinned "
            "toolchain package or an unknown placeholder is an error naming the key. See "
            "[Write a TOML agent spec](../how-to/toml-agent-spec.md) for a walk through one.\n",
            "## Top-level keys\n",
            _described_table(command.CommandSpec, SPEC_KEYS) + "\n",
            "## `[options.NAME]`\n",
            _described_table(command.OptionSpec, OPTION_KEYS) + "\n",
            "## `[toolchain]`\n",
            _described_table(Toolchain, TOOLCHAIN_KEYS) + "\n",
            "## Placeholders\n",
            "`{{` and `}}` are literal braces. Any other `{NAME}` that is not listed here is an error.\n",
            "\n".join(rows) + "\n",
            "## Specs shipped with platoon\n",
            "\n".join(
                f"- [`{p.stem}`]({REPO_URL}/src/platoon/harness/specs/{p.name}): "
                + first_line(
                    command.parse_spec(__import__("tomllib").loads(p.read_text()), str(p)).description
                )
                for p in shipped
            )
            + "\n",
        ]
    )


# --- extension points -----------------------------------------------------------------------------


def plugins_page() -> str:
    from platoon import plugins

    rows = ["| kind | entry-point group | installed here |", "|---|---|---|"]
    for kind, group in plugins.GROUPS.items():
        installed = ", ".join(f"`{name}`" for name in sorted(plugins.available(kind))) or "—"
        rows.append(f"| {kind.replace('_', ' ')} | `{group}` | {installed} |")
    return "\n".join(
        [
            "# Entry-point groups\n",
            GENERATED_NOTE,
            "Installed packages add to platoon through these entry-point groups. Nothing is imported "
            "at start-up: a config names a thing, and only then is the entry point with that name "
            "loaded. A name with a colon (`package.module:attr`) is imported directly instead. "
            "*Installed here* is what the build of these docs found.\n",
            "\n".join(rows) + "\n",
            "See [Extending platoon](../extending/README.md) for one page per extension point.\n",
        ]
    )


# --- the event flow -------------------------------------------------------------------------------

# The events of one training step, in the order the design gives them (docs/architecture.md).
STEP_FLOW = [
    "EpisodeRequested",
    "SessionOpenRequested",
    "SessionOpened",
    "AgentOpenRequested",
    "AgentOpened",
    "EpisodeStarted",
    "AgentSpawned",
    "ChatRequested",
    "ModelCallFinished",
    "ChatReplied",
    "ToolCalled",
    "ToolReturned",
    "AgentFinished",
    "EpisodeFinished",
    "GradeRequested",
    "Graded",
    "EpisodeGraded",
    "GroupCompleted",
    "BatchReady",
    "TrainStepFinished",
    "PolicyUpdated",
    "CheckpointSaved",
]


# The run whose graph the flow page draws: the quickstart's training run on the CPU.
FLOW_CONFIG = ROOT / "examples" / "quickstart" / "train-local.yaml"


def training_graph() -> Any:
    """The event graph of a training run, from its components' declarations (`platoon graph`)."""
    from platoon.bus.graph import event_graph
    from platoon.cli.graph import run_components
    from platoon.config import load_config

    return event_graph(run_components(load_config(FLOW_CONFIG), "train"))


def _class_link(node: Any) -> str:
    module = node.cls.__module__
    path = "src/" + module.replace(".", "/") + ".py"
    return f"[{node.name}]({REPO_URL}/{path})"


def flow_page() -> str:
    from platoon.bus import events

    graph = training_graph()
    by_name = {n.name: n for n in graph.nodes}
    lines = ["flowchart LR"]
    used: set[str] = set()
    edges = []
    rows = ["| event | published by | taken by |", "|---|---|---|"]
    for name in STEP_FLOW:
        event_type = getattr(events, name)
        pubs, subs = graph.publishers(event_type), graph.takers(event_type)
        rows.append(
            f"| `{name}` | {', '.join(_class_link(by_name[p]) for p in pubs) or '—'} | "
            f"{', '.join(_class_link(by_name[s]) for s in subs) or '—'} |"
        )
        for pub in pubs:
            for sub in subs:
                if pub != sub:
                    used |= {pub, sub}
                    edges.append(f"    {_node_id(pub)} -- {name} --> {_node_id(sub)}")
    for node in graph.nodes:
        if node.name in used:
            lines.append(f'    {_node_id(node.name)}["{node.name}"]')
    observers = ", ".join(n.name for n in graph.observers) or "none"
    return "\n".join(
        [
            "# The event flow of a training step\n",
            GENERATED_NOTE,
            "The events of one training step, in order, with the components that publish each and "
            "the components that take it, from the components' own declarations (`subscribes` and "
            "`publishes`, see [Event handlers](../extending/event-handlers.md#writing-a-component)) "
            f"in a training run of [`{FLOW_CONFIG.relative_to(ROOT)}`]({REPO_URL}/{FLOW_CONFIG.relative_to(ROOT)}): "
            "what `platoon graph` prints for it. A request's reply goes back to whoever sent the "
            f"request. Components that take every event ({observers}) are left out. "
            "[How platoon fits together](../architecture.md) tells the same flow in words.\n",
            "\n".join(rows) + "\n",
            "```mermaid\n" + "\n".join([*lines, *edges]) + "\n```\n",
        ]
    )


def _node_id(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


# --- mkdocs ---------------------------------------------------------------------------------------

PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_page,
    "reference/config.md": config_page,
    "reference/site.md": site_page,
    "reference/events.md": events_page,
    "reference/harness-spec.md": spec_page,
    "reference/entry-points.md": plugins_page,
    "reference/event-flow.md": flow_page,
}


def generate(name: str) -> str:
    importlib.invalidate_caches()
    return PAGES[name]()


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for name in PAGES:
        existing = files.get_file_from_path(name)
        if existing is not None:
            files.remove(existing)
        files.append(File.generated(config, name, content=generate(name)))
    return files

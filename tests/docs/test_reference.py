"""The generated reference says everything and agrees with the code.

The reference pages are generated at build time (docs/_hooks/reference.py). These tests make
the generation complete: every config and site key has a description, the hand-written
descriptions of the harness spec are exactly the spec's keys and placeholders, every command
is on the CLI page, and the hand-written component table of docs/architecture.md matches what
the components declare they take and publish (what `platoon graph` prints).
"""

from __future__ import annotations

import gc
import importlib.util
import re
import sys
from pathlib import Path

import msgspec
import pytest

from platoon.config import Config
from platoon.config.site import Site
from platoon.harness import command
from platoon.harness.toolchain import Toolchain

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "docs" / "_hooks" / "reference.py")
assert _spec is not None and _spec.loader is not None
reference = importlib.util.module_from_spec(_spec)
sys.modules["docs_reference"] = reference  # dataclasses look their module up while the class is made
_spec.loader.exec_module(reference)


@pytest.fixture(autouse=True)
def _no_garbage_collection_while_parsing():
    """`inspect.getsource` parses whole modules; on CPython 3.11 a collection whose finalizers run
    while `ast.parse` builds its tree can fail it with "AST constructor recursion depth mismatch"
    (python/cpython#106905), seen once in a full run. Collect first, then not during the test."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


@pytest.mark.parametrize("cls", [Config, Site], ids=["config", "site"])
def test_every_key_has_a_type_a_default_and_a_description(cls):
    keys = [key for doc in reference.walk_struct(cls) for key in doc.keys]
    assert len(keys) > (100 if cls is Config else 2)
    undescribed = [key.path for key in keys if not key.description.strip()]
    assert not undescribed, f"add a comment to these fields in the schema: {undescribed}"
    assert all(key.type and key.default for key in keys)


def test_the_config_page_lists_every_key_and_a_valid_example():
    page = reference.generate("reference/config.md")
    for doc in reference.walk_struct(Config):
        for key in doc.keys:
            assert f"`{key.path}`" in page
    assert "train.workflow_config.rollout_config.inference_params.max_completion_tokens" in page


def test_the_spec_descriptions_are_exactly_the_specs_keys_and_placeholders():
    fields = lambda cls: {f.name for f in msgspec.structs.fields(cls)}  # noqa: E731
    assert set(reference.SPEC_KEYS) == fields(command.CommandSpec)
    assert set(reference.OPTION_KEYS) == fields(command.OptionSpec)
    assert set(reference.TOOLCHAIN_KEYS) == fields(Toolchain)
    assert set(reference.PLACEHOLDERS) == command._EPISODE | command._STATIC


def test_the_cli_page_has_every_command_and_option():
    page = reference.generate("reference/cli.md")
    commands = reference.cli_commands()
    assert {"platoon train", "platoon harness show", "platoon serve tinker", "platoon env serve"} <= set(
        commands
    )
    for words in commands:
        assert f"`{words}`" in page
    for option in ("--resume RUN_DIR", "--task SPLIT:ID", "--api-key API_KEY", "--salvage"):
        assert option in page


@pytest.mark.slow
def test_the_events_page_has_every_event_type_and_who_publishes_it():
    from platoon.bus import events

    page = reference.generate("reference/events.md")
    for cls in events.event_types():
        if cls.__module__ == events.__name__:
            assert f"## `{cls.__name__}`" in page
    # The scan finds the real publishers and takers of the core flow.
    uses = reference.scan_event_use({"BatchReady", "ModelCallFinished", "EpisodeRequested"})
    assert "platoon.train.batcher:CreditAssigner" in uses["BatchReady"].publishers
    assert "platoon.train.trainer:Trainer" in uses["BatchReady"].subscribers
    assert "platoon.gateway.core:Gateway" in uses["ModelCallFinished"].publishers
    assert "platoon.programs.runner:EpisodeRunner" in uses["EpisodeRequested"].subscribers


def _architecture_rows() -> list[tuple[str, list[str], list[str]]]:
    """(module, events taken, events published) per row of the component table that names a file."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        found = re.search(r"\(`([\w/]+)\.py`\)", cells[0]) if len(cells) == 3 else None
        if found:
            module = "platoon." + found.group(1).replace("/", ".")
            names = lambda cell: re.findall(r"`([A-Z]\w+)`", cell)  # noqa: E731
            rows.append((module, names(cells[1]), names(cells[2])))
    return rows


def test_the_architecture_table_matches_the_code():
    from platoon.bus import events

    rows = _architecture_rows()
    assert len(rows) >= 6
    graph = reference.training_graph()
    problems = []
    for module, takes, publishes in rows:
        nodes = [n for n in graph.nodes if n.cls.__module__ == module]
        if not nodes:
            problems.append(f"no component of a training run is in {module}")
        for name in publishes:
            if not any(getattr(events, name) in (n.publishes or ()) for n in nodes):
                problems.append(f"{module} does not declare that it publishes {name}")
        for name in takes:
            if not any(n.takes(getattr(events, name)) and not n.takes_anything for n in nodes):
                problems.append(f"{module} does not declare that it takes {name}")
    assert not problems, "docs/architecture.md disagrees with the declarations: " + "; ".join(problems)


def test_the_flow_page_is_the_graph_of_a_training_run():
    page = reference.generate("reference/event-flow.md")
    graph = reference.training_graph()
    for name in reference.STEP_FLOW:
        assert f"| `{name}` |" in page
    for pub, name, sub in graph.edges():
        if name in reference.STEP_FLOW:
            first, second = graph.nodes[pub].name, graph.nodes[sub].name
            assert f"{reference._node_id(first)} -- {name} --> {reference._node_id(second)}" in page


def test_every_generated_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    for name in reference.PAGES:
        assert name in nav


def test_every_test_the_docs_cite_exists():
    """The security model names the test that attacks each guarantee: those tests must exist."""
    cited = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        last_file = None
        for ref in re.findall(r"`((?:tests/[\w/]+\.py|\.\.\.)(?:::\w+)?)`", page.read_text()):
            path, _, name = ref.partition("::")
            path = last_file if path == "..." else path
            last_file = path
            cited.append((page.name, path, name))
    assert len(cited) >= 15
    missing = []
    for page, path, name in cited:
        source = ROOT / path
        if not source.is_file():
            missing.append(f"{page}: {path}")
        elif name and not re.search(rf"^(async )?def {name}\(", source.read_text(), re.M):
            missing.append(f"{page}: {path}::{name}")
    assert not missing, f"the docs cite tests that do not exist: {missing}"

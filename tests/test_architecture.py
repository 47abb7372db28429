"""The house stays walkable: layers point one way, no import cycles, no module over 800 lines,
and `Any` stays rare.

Read from the source with `ast`, never by importing it, so an import hidden inside a function
or under `TYPE_CHECKING` counts like any other: a cycle dodged at run time is still a cycle to
the reader. The layers are written down in `docs/architecture.md`.
"""

from __future__ import annotations

import ast
import gc
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "platoon"

# Each module's layer, by the longest prefix that names it: 1 entry points, 2 assembly,
# 3 components, 4 contracts and pure logic. A module may import its own layer and those below.
LAYERS: dict[str, int] = {
    "platoon": 1,  # the package's __init__: the public API
    "platoon.__main__": 1,
    "platoon.cli": 1,
    "platoon.api": 1,
    "platoon.testing": 1,
    "platoon.assembly": 2,
    "platoon.train": 3,
    "platoon.programs": 3,
    "platoon.harness": 3,
    "platoon.gateway": 3,
    "platoon.envs": 3,
    "platoon.sandbox": 3,
    "platoon.credit": 3,
    "platoon.rewards": 3,
    "platoon.stats": 3,
    "platoon.backends": 3,
    "platoon.visualization": 3,
    "platoon.models": 3,
    "platoon._openreward": 3,
    "platoon.bus": 4,
    "platoon.config": 4,
    "platoon.policy": 4,
    "platoon.naming": 4,
    "platoon.errors": 4,
    "platoon.serving": 4,
    "platoon.plugins": 4,
}

MAX_LINES = 800

# Annotations that mention `Any` (parameters, returns, annotated names) in src/platoon.
# The ratchet only goes down: lower it when a change removes some.
ANY_BUDGET = 275


@cache
def _parsed(path: Path) -> ast.Module:
    """The module's syntax tree, parsed with the garbage collector off: a finalizer that warns
    during a parse fails it on CPython 3.11.7 (python/cpython#106905; see conftest.py)."""
    gc.disable()
    try:
        return ast.parse(path.read_text(), str(path))
    finally:
        gc.enable()


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


@cache
def _imports() -> dict[str, set[str]]:
    """Each module's imports of platoon's own modules, wherever in the module they are."""
    modules = _modules()

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(_parsed(path)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for name in names:
                target = known(name)
                # A module's own parent packages are imported by Python before it: no edge.
                if target and target != module and not module.startswith(target + "."):
                    found.add(target)
        edges[module] = found
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(edges):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def layer(module: str) -> int:
    name = module
    while name not in LAYERS:
        if "." not in name:
            raise AssertionError(f"{module} has no layer in LAYERS: add it, and to docs/architecture.md")
        name = name.rpartition(".")[0]
    return LAYERS[name]


def _any_annotations(path: Path) -> int:
    def mentions_any(annotation: ast.expr) -> bool:
        for node in ast.walk(annotation):
            if isinstance(node, ast.Name) and node.id == "Any":
                return True
            if isinstance(node, ast.Attribute) and node.attr == "Any":
                return True
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "Any" in node.value:
                return True
        return False

    count = 0
    for node in ast.walk(_parsed(path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            args = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
            annotations = [arg.annotation for arg in args if arg is not None] + [node.returns]
        elif isinstance(node, ast.AnnAssign):
            annotations = [node.annotation]
        else:
            continue
        count += sum(1 for annotation in annotations if annotation is not None and mentions_any(annotation))
    return count


def test_there_are_no_import_cycles_not_even_inside_functions():
    cycles = _cycles(_imports())
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_every_import_points_down_the_layers():
    upward = {
        (module, target)
        for module, targets in _imports().items()
        for target in targets
        if layer(target) < layer(module)
    }
    climbing = sorted(f"{m} (layer {layer(m)}) imports {t} (layer {layer(t)})" for m, t in upward)
    assert not climbing, "imports that climb a layer:\n" + "\n".join(climbing)


def test_no_module_is_over_800_lines():
    long = {
        str(path.relative_to(SRC)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (two concerns at least): {long}"


def test_any_annotations_stay_within_their_budget():
    counts = {str(p.relative_to(SRC)): _any_annotations(p) for p in PACKAGE.rglob("*.py")}
    total = sum(counts.values())
    worst = sorted(counts.items(), key=lambda kv: -kv[1])[:10]
    assert total <= ANY_BUDGET, f"{total} annotations mention Any (budget {ANY_BUDGET}); most: {worst}"


def test_the_cycle_finder_finds_a_cycle_and_a_clean_graph_has_none():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_architecture_page_lists_the_layers_this_test_checks():
    page = (SRC.parent / "docs" / "architecture.md").read_text()
    written: dict[str, int] = {}
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and (number := cells[0].split(".")[0]).isdigit():
            for module in re.findall(r"`(platoon[\w.]*)`", cells[1]):
                written[module] = int(number)
    assert written == LAYERS, "docs/architecture.md's layer table and LAYERS disagree"


def test_below_the_assembly_no_function_takes_the_whole_config():
    """The assembly resolves the config once into each component's settings; a component that
    took the `Config` would read the config again, and climb back up a layer to do it."""
    taking = []
    for module, path in _modules().items():
        if layer(module) < 3 or module.startswith("platoon.config"):
            continue
        tree = _parsed(path)
        imported = any(
            isinstance(node, ast.ImportFrom)
            and (node.module or "").startswith("platoon.config")
            and any(alias.name == "Config" for alias in node.names)
            for node in ast.walk(tree)
        )
        if not imported:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                    if arg.annotation is not None and any(
                        isinstance(n, ast.Name) and n.id == "Config" for n in ast.walk(arg.annotation)
                    ):
                        taking.append(f"{module}.{node.name}({arg.arg})")
    assert not taking, f"components that take the whole Config: {taking}"


def test_every_import_inside_a_function_says_why():
    """An import of platoon's own inside a function is kept only for an optional extra (tinker,
    torch, nats-py, the openreward SDK) or the command line's start-up time, and says so on its
    line or in a comment just above its group of imports; any other belongs at the top."""
    unexplained = []
    for path in _modules().values():
        lines = path.read_text().splitlines()
        for function in ast.walk(_parsed(path)):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom):
                    own = node.level > 0 or (node.module or "").startswith("platoon")
                elif isinstance(node, ast.Import):
                    own = any(alias.name.startswith("platoon") for alias in node.names)
                else:
                    continue
                if not own or "#" in lines[node.lineno - 1]:
                    continue
                above = node.lineno - 2  # the comment may head a group of imports
                while above >= 0 and lines[above].strip().startswith(("from ", "import ")):
                    above -= 1
                if above < 0 or not lines[above].strip().startswith("#"):
                    unexplained.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not unexplained, f"imports inside functions with no reason given: {sorted(set(unexplained))}"

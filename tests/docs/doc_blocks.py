"""Reading the marked code blocks of the documentation, so the tests can run them.

A block is marked by an HTML comment on the line before its fence (invisible in the built site):

    <!-- test: run -->                    a shell block, run with bash in the page's workspace
    <!-- test: run cwd=examples/quickstart args="--policy scripted:scripted:binary_search" -->
                                          run from a folder of the repository (the page's prose
                                          puts the reader there); `args` is appended to every
                                          `platoon train|eval|run|rollout` command of the block
    <!-- test: run expect="reward: 1" -->  the output must contain this text
    <!-- test: run setup="platoon train ..." -->   a command run first, unseen: what the page
                                          assumes the reader did before (a run to look at)
    <!-- test: file my_env.py -->          the block is written to this path of the workspace
    <!-- test: python -->                  a Python block, run as a script in the workspace
    <!-- test: run needs=torch,bwrap -->   the page's test needs torch (the embedded backend) or
                                          bubblewrap, and skips without them (most pages that need
                                          them are recognised without saying so)
    <!-- test: run install=ci -->          a block that makes the virtual environment: its
                                          `python3.11 -m venv .venv` and `pip install` steps are
                                          answered by the test's own environment (CI installs it
                                          with README's test command); the rest runs as written
    <!-- test: skip REASON -->             shown, not run, and the reason says why
    <!-- test: yaml site -->               a YAML block that is a site profile, not a config

A page's blocks run one after the other as a reader types them into one shell: the working
directory and the exported variables a block leaves are where the next block starts. A block
with a `cwd` option runs from that folder of the repository and leaves the reader where it was,
so no later block writes into the repository. README.md and CONTRIBUTING.md are pages too; the reader of those
starts in a copy of the repository with nothing installed.

Every ```yaml block is checked against the config schema (or the site profile's), and every
```toml block that describes a harness (it has `command`) against the spec schema. Every shell
block must be marked `run` or `skip`, so none is left untested without a reason.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$")
_MARK = re.compile(r"^\s*<!--\s*test:\s*(?P<body>.*?)\s*-->\s*$")
_SNIPPET = re.compile(r'^--8<-- "(?P<path>[^"]+)"$', re.M)
SHELLS = {"bash", "sh", "shell", "console"}


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    action: str | None = None  # run, file, python, skip, yaml, or None when unmarked
    arg: str = ""  # the file path (file), the reason (skip), the kind (yaml)
    options: dict[str, str] = field(default_factory=dict)
    included: Path | None = None  # the file a block that is one `--8<--` include shows

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


ROOT_PAGES = (ROOT / "README.md", ROOT / "CONTRIBUTING.md")


def pages() -> list[Path]:
    return [*ROOT_PAGES, *sorted(p for p in DOCS.rglob("*.md") if "_hooks" not in p.parts)]


def blocks(page: Path) -> list[Block]:
    """Every fenced code block of a page, with its marker if it has one."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, indent = match["fence"], match["indent"]
        info = match["info"].strip()
        # ```python, or ``` { .python title="..." } (superfences' attribute form, which ruff's
        # Markdown formatting leaves alone: used for blocks that include a file)
        attr = re.match(r"\{\s*\.([\w+-]+)", info) if info.startswith("{") else None
        lang = (attr[1] if attr else (info.split() or [""])[0].lstrip(".")).lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not (
            lines[i].strip().startswith(fence[0] * len(fence)) and lines[i].strip().strip(fence[0]) == ""
        ):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        raw = "\n".join(body) + "\n"
        block = Block(page, start + 1, lang, _expand_snippets(raw))
        whole = _SNIPPET.fullmatch(raw.strip())
        block.included = ROOT / whole["path"] if whole else None
        mark = _marker_before(lines, start)
        if mark is not None:
            _apply_marker(block, mark)
        found.append(block)
    return found


def _expand_snippets(text: str) -> str:
    """Blocks that include a file (`--8<-- "path"`, pymdownx.snippets) stand for its content."""
    return _SNIPPET.sub(lambda m: (ROOT / m["path"]).read_text(encoding="utf-8").rstrip("\n"), text)


def _marker_before(lines: list[str], start: int) -> str | None:
    j = start - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j >= 0:
        match = _MARK.match(lines[j])
        if match:
            return match["body"]
    return None


def _apply_marker(block: Block, body: str) -> None:
    words = shlex.split(body)
    if not words:
        raise ValueError(f"{block.where}: empty test marker")
    block.action = words[0]
    rest = words[1:]
    if block.action in ("file", "yaml"):
        block.arg = rest.pop(0) if rest else ""
    elif block.action == "skip":
        block.arg = " ".join(rest)
        rest = []
    for word in rest:
        key, sep, value = word.partition("=")
        if not sep:
            raise ValueError(f"{block.where}: expected key=value in the test marker, got {word!r}")
        block.options[key] = value
    if block.action not in ("run", "file", "python", "skip", "yaml"):
        raise ValueError(f"{block.where}: unknown test action {block.action!r}")


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks(page)]

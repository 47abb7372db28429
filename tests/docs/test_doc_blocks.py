"""Every command and config in the documentation works: marked blocks run, YAML validates.

See `doc_blocks.py` for the markers. Each page's blocks run in order in a workspace of their own (a
temporary folder on PYTHONPATH, with a site profile of its own), so a page can write a module, a
config, and then run `platoon` on them, as a reader would.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from doc_blocks import ROOT, ROOT_PAGES, SHELLS, Block, all_blocks, blocks, pages

import forkserver
from model_fixtures import CACHE
from platoon.config import ConfigError, load_config, validate_config
from platoon.config.site import Site
from platoon.config.validate import convert
from platoon.harness.command import parse_spec

RUNNABLE = ("run", "file", "python")
# Pages that train on the embedded backend (or serve it) need torch: marked so, they skip without it.
_TORCH = re.compile(
    r"train-local|backend[:=] ?local|platoon-tiny-qwen3|serve tinker|save_tiny_model|examples/rao/"
)


# Pages that start sandboxes (Harbor tasks, command-line agents) need bubblewrap.
_SANDBOX = re.compile(r"service: harbor|create_sandbox|harbor-dataset")
_NO_BWRAP = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap (bwrap) is not installed")


def _page_param(page: Path):
    runnable = [b for b in blocks(page) if b.action in RUNNABLE]
    marks = []
    needs = {need for b in runnable for need in b.options.get("needs", "").split(",") if need}
    texts = [b.text + b.options.get("setup", "") for b in runnable]
    if "torch" in needs or any(_TORCH.search(text) for text in texts):
        marks.append(pytest.mark.torch)
    if "bwrap" in needs or any(_SANDBOX.search(b.text) for b in blocks(page)):
        marks.append(_NO_BWRAP)
    return pytest.param(page, marks=marks, id=_id(page))


PAGES_WITH_RUNS = [p for p in pages() if any(b.action in RUNNABLE for b in blocks(p))]
YAML_BLOCKS = [b for b in all_blocks() if b.lang in ("yaml", "yml")]
TOML_BLOCKS = [b for b in all_blocks() if b.lang == "toml"]
# A `platoon` command that takes config overrides, as a line or one step of an `&&` chain.
_OVERRIDABLE = re.compile(
    r"^(\s*(?:[A-Z_]+=\S*\s+)*)(platoon|\.venv/bin/platoon|python -m platoon) (train|eval|run|rollout)(\s|$)"
)


def _id(item: Path | Block) -> str:
    if isinstance(item, Block):
        return item.where
    return str(item.relative_to(ROOT))


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory):
    """One site cache for every page, so the tiny model is built once."""
    return tmp_path_factory.mktemp("platoon-cache")


def _with_args(script: str, args: str) -> str:
    if not args:
        return script
    out = []
    for line in script.splitlines():
        command, sep, comment = line.partition("  #")
        steps = command.rstrip().split(" && ")
        if _OVERRIDABLE.match(steps[-1]):  # an override goes at the end of its command
            line = f"{command.rstrip()} {args}" + (f"  #{comment}" if sep else "")
        elif any(_OVERRIDABLE.match(step) for step in steps):
            raise ValueError(f"args= for a platoon command that is not the last of its line: {line}")
        out.append(line)
    return "\n".join(out) + "\n"


# Answers for a block that makes the virtual environment (`install=ci`): the environment is the
# test's own, which CI installed with the README's test command, the same steps as the block's.
_INSTALLED = """
python3.11() {
  if [ "$*" = "-m venv .venv" ]; then ln -sfn "$PLATOON_TEST_VENV" .venv; else command python3.11 "$@"; fi
}
pip() { echo "pip $*: installed already (CI installs it with README's test command)"; }
"""

# Each block ends by leaving the reader's shell for the next one: where it is, what it exported.
# (Run after the block's last line, not from an EXIT trap: a block may set its own.)
_KEEP_STATE = """
pwd > "$PLATOON_TEST_STATE/cwd"; env -0 > "$PLATOON_TEST_STATE/env"
"""


class Reader:
    """One reader's shell through a page: where it is and what it has exported."""

    def __init__(self, workspace: Path, env: dict[str, str], state: Path) -> None:
        self.cwd, self.env, self.state = workspace, env | {"PLATOON_TEST_STATE": str(state)}, state
        state.mkdir()

    def run(self, block: Block) -> None:
        timeout = float(block.options.get("timeout", 300))
        cwd = ROOT / block.options["cwd"] if "cwd" in block.options else self.cwd
        if block.action == "python":
            argv, stdin = [sys.executable, "-"], block.text
        else:
            script = _with_args(block.text, block.options.get("args", ""))
            if "setup" in block.options:  # what the page assumes was done before (a run to look at)
                script = f"{block.options['setup']}\n{script}"
            if block.options.get("install") == "ci":
                script = _INSTALLED + script
            argv, stdin = ["bash", "-e", "-o", "pipefail", "-s"], script + _KEEP_STATE
        result = subprocess.run(
            argv, input=stdin, cwd=cwd, env=self.env, capture_output=True, text=True, timeout=timeout
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, (
            f"{block.where}: exit {result.returncode}\n{stdin}\n--- output ---\n{output[-6000:]}"
        )
        expect = block.options.get("expect")
        if expect is not None:
            assert expect in output, f"{block.where}: expected {expect!r} in the output\n{output[-6000:]}"
        if block.action != "python" and (self.state / "cwd").exists():
            if "cwd" not in block.options:  # a block run from the repository leaves the reader where it was
                self.cwd = Path((self.state / "cwd").read_text().strip())
            pairs = (item.partition("=") for item in (self.state / "env").read_text().split("\0") if item)
            self.env = {k: v for k, _, v in pairs if k not in ("_", "OLDPWD", "PWD", "SHLVL")}
            for kept in self.state.iterdir():
                kept.unlink()


def _fresh_checkout(workspace: Path, home: Path) -> dict[str, str]:
    """A reader of README.md at the root of a copy of the repository, with nothing installed.

    The copy is links to the repository's entries, so examples and sources are the real ones;
    what the reader makes (a `.venv`, an export) lands in the copy. The `.venv` the install
    block makes is a virtual environment whose `platoon` is the test's (forked, see
    tests/forkserver.py) and whose `activate` is the real one's, pointed at it.
    """
    for entry in ROOT.iterdir():
        if entry.name not in (".venv", ".git") and not entry.name.startswith((".mypy", ".pytest", ".ruff")):
            (workspace / entry.name).symlink_to(entry)
    venv = home / "venv"
    (venv / "bin").mkdir(parents=True)
    activate = (Path(sys.prefix) / "bin" / "activate").read_text()
    (venv / "bin" / "activate").write_text(activate.replace(sys.prefix, str(venv)))
    (venv / "bin" / "platoon").symlink_to(forkserver.shim_dir() / "platoon")
    (venv / "bin" / "python").symlink_to(sys.executable)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if Path(p) != Path(sys.prefix) / "bin"]
    return {"PATH": os.pathsep.join(path), "PLATOON_TEST_VENV": str(venv)}


@pytest.mark.slow
@pytest.mark.parametrize("page", [_page_param(p) for p in PAGES_WITH_RUNS])
def test_the_runnable_blocks_of_a_page_run(page, tmp_path, shared_cache):
    workspace = tmp_path / "work"
    workspace.mkdir()
    # A home of its own, with a site profile where a user keeps one: runs go to ~/platoon-runs
    # as the pages say, and the cache is shared between pages.
    home = tmp_path / "home"
    site = home / ".config" / "platoon" / "site.yaml"
    site.parent.mkdir(parents=True)
    site.write_text(yaml.safe_dump({"cache": str(shared_cache)}))
    env = {k: v for k, v in os.environ.items() if k not in ("PLATOON_SITE", "XDG_CONFIG_HOME")}
    env.update(
        HOME=str(home),
        # `platoon` forks from a server that has imported torch and platoon (tests/forkserver.py)
        PATH=os.pathsep.join(
            [str(forkserver.shim_dir()), str(Path(sys.executable).parent), env.get("PATH", "")]
        ),
        PLATOON_FORKSERVER=forkserver.socket_path(),
        PYTHONPATH=os.pathsep.join(p for p in [str(workspace), env.get("PYTHONPATH", "")] if p),
        HF_HUB_OFFLINE="1",
        PLATOON_REPO=str(ROOT),  # the pages that use the repository's examples say so
        COLUMNS="100",
    )
    env.pop("TINKER_API_KEY", None)
    env.pop("WANDB_API_KEY", None)
    if page in ROOT_PAGES:
        # The machine's cache, where README's test command pulled the real model first.
        site.write_text(yaml.safe_dump({"cache": str(CACHE)}))
        env.update(_fresh_checkout(workspace, home))
        env.pop("PLATOON_REPO")
    reader = Reader(workspace, env, tmp_path / "shell")
    for block in blocks(page):
        if block.action == "file":
            target = workspace / block.arg
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text)
        elif block.action in ("run", "python"):
            reader.run(block)


@pytest.mark.parametrize("block", [b for b in all_blocks() if b.lang in SHELLS], ids=_id)
def test_every_shell_block_is_run_or_says_why_not(block):
    assert block.action in ("run", "skip"), (
        f"{block.where}: mark this block <!-- test: run --> or <!-- test: skip REASON -->"
    )
    if block.action == "skip":
        assert block.arg, f"{block.where}: a skipped block must say why"


def _is_site(block: Block) -> bool:
    return block.arg == "site" or (block.action == "file" and Path(block.arg).name == "site.yaml")


@pytest.mark.parametrize("block", YAML_BLOCKS, ids=_id)
def test_every_yaml_block_is_a_valid_config(block, tmp_path):
    data = yaml.safe_load(block.text)
    if block.action == "yaml" and block.arg == "other":
        return  # YAML that is neither a config nor a site profile (the marker says so)
    assert data is None or isinstance(data, dict), f"{block.where}: a config is a mapping"
    data = dict(data or {})
    try:
        if block.included is not None and not _is_site(block):
            load_config(block.included)  # a file of the repository, with what it extends
        elif _is_site(block):
            convert(data, Site, base_dir=tmp_path)
        else:
            data.pop("extends", None)  # the files it extends are checked where they are shown
            validate_config(data, base_dir=tmp_path)
    except ConfigError as exc:
        pytest.fail(f"{block.where}: not a valid {'site profile' if _is_site(block) else 'config'}:\n{exc}")


@pytest.mark.parametrize("block", TOML_BLOCKS, ids=_id)
def test_every_toml_block_parses_and_harness_specs_validate(block):
    data = tomllib.loads(block.text)
    if "command" in data:
        parse_spec(data, block.where)


def test_the_markers_are_used():
    """The machinery above is not vacuous: the docs do mark blocks to run."""
    actions = [b.action for b in all_blocks()]
    assert actions.count("run") >= 10
    assert actions.count("file") >= 8
    assert len(YAML_BLOCKS) >= 10

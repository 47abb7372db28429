"""How a config walks through the assembly: the platoon modules `assemble` enters, and how often
it comes back into one it entered before (issue #49 asked for a walk a reader can follow).

Each call whose caller is in another platoon module than the callee is an entry (library frames
in between are looked through). Figures on examples/quickstart/train.yaml: before #49 (dcd54a1)
42 entries into 13 modules, 29 of them re-entries; at #49's close 30 entries, 13 modules, 17
re-entries (the settings reading the config's fields through `config/schema.py`).

Run: python benchmarks/assembly_walk.py [CONFIG] [--purpose train] [--walk]
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from pathlib import Path
from types import FrameType

import platoon
from platoon.assembly.parts import assemble
from platoon.config.load import load_config

SRC = str(Path(platoon.__file__).resolve().parent) + os.sep
QUICKSTART = Path(__file__).resolve().parent.parent / "examples" / "quickstart" / "train.yaml"


def module_of(frame: FrameType | None) -> str | None:
    """The platoon module a frame runs in (`assembly/parts.py`), None outside platoon."""
    if frame is None:
        return None
    name = str(Path(frame.f_code.co_filename).resolve())
    return name[len(SRC) :] if name.startswith(SRC) else None


def walk(config_path: Path, purpose: str) -> list[tuple[str | None, str]]:
    """(caller's module, callee's module) for each call into another platoon module."""
    sys.path.insert(0, str(config_path.parent))  # the example's own modules, as `platoon` finds them
    config = load_config(config_path)
    entries: list[tuple[str | None, str]] = []

    def hook(frame: FrameType, event: str, arg: object) -> None:
        callee = module_of(frame) if event == "call" else None
        if callee is None:
            return
        caller = frame.f_back
        while caller is not None and module_of(caller) is None:
            caller = caller.f_back
        if module_of(caller) != callee:
            entries.append((module_of(caller), callee))

    cwd = Path.cwd()
    os.chdir(config_path.parent)
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            sys.setprofile(hook)
            try:
                assemble(config, purpose, run_dir=run_dir)
            finally:
                sys.setprofile(None)
    finally:
        os.chdir(cwd)
    return entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", type=Path, default=QUICKSTART)
    parser.add_argument("--purpose", default="train")
    parser.add_argument("--walk", action="store_true", help="print each entry")
    args = parser.parse_args()
    entries = walk(args.config.resolve(), args.purpose)
    seen: set[str] = set()
    again: collections.Counter[str] = collections.Counter()
    for caller, callee in entries:
        if args.walk:
            print(f"  {caller} -> {callee}")
        if callee in seen:
            again[callee] += 1
        seen.add(callee)
    print(f"{len(entries)} entries into {len(seen)} modules, {sum(again.values())} of them re-entries")
    print("re-entered most:", ", ".join(f"{m} {n}" for m, n in again.most_common(5)))


if __name__ == "__main__":
    main()

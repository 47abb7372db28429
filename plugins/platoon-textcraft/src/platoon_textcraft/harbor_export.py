"""Export TextCraft tasks as Harbor task directories, for bash agents and Harbor-based harnesses.

    python -m platoon_textcraft.harbor_export OUT_DIR [--env textcraft-synth] --split test-depth3 --n 20

Each task directory holds ``task.toml`` (``[metadata] difficulty`` = crafting depth),
``instruction.md``, ``environment/`` (a Dockerfile installing the ``textcraft`` command with this
task's recipes), ``tests/test.sh`` (replays the recorded actions and writes
``/logs/verifier/reward.txt``: 1 or 0) and ``solution/solve.sh`` (a known plan, for Harbor's oracle).
``TEXTCRAFT_LOGS_DIR`` (default ``/logs``) and ``TEXTCRAFT_STATE`` (default
``/app/inventory.json``) move those paths, to run ``test.sh`` outside a container.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from platoon_textcraft import crafting, harbor_cli
from platoon_textcraft.env import TextCraft, TextCraftSynth
from platoon_textcraft.recipes import solve
from platoon_textcraft.tasks import TaskError, TaskSpec, make_task, num_tasks

__all__ = ["ENVIRONMENTS", "ExportError", "export_tasks", "write_task"]

ENVIRONMENTS: dict[str, type[TextCraft]] = {"platoon-textcraft": TextCraft, "textcraft-synth": TextCraftSynth}

DOCKERFILE = """\
FROM python:3.12-slim
COPY textcraft.py crafting.py world.json /opt/textcraft/
RUN printf '#!/bin/sh\\nexec python3 /opt/textcraft/textcraft.py "$@"\\n' > /usr/local/bin/textcraft \\
    && chmod +x /usr/local/bin/textcraft && mkdir -p /app
ENV TEXTCRAFT_WORLD=/opt/textcraft/world.json TEXTCRAFT_STATE=/app/inventory.json
WORKDIR /app
"""

TEST_SH = """\
#!/usr/bin/env bash
# Grades this TextCraft task: replays the agent's recorded actions against the recipes kept here
# (not the container's copy) and writes 1 if they leave the goal in the inventory, else 0.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
verifier="${TEXTCRAFT_LOGS_DIR:-/logs}/verifier"
mkdir -p "$verifier"
reward="$(python3 "$here/textcraft.py" --world "$here/world.json" \\
    --state "${TEXTCRAFT_STATE:-/app/inventory.json}" grade 2>/dev/null)"
if [ "$reward" = "1" ]; then echo 1 > "$verifier/reward.txt"; else echo 0 > "$verifier/reward.txt"; fi
"""


class ExportError(Exception):
    """The export cannot be written as asked (an existing directory, a bad split or index)."""


def write_task(task_dir: Path, task_spec: Mapping[str, Any], *, name_prefix: str = "platoon") -> Path:
    """Write one task as a Harbor task directory at ``task_dir`` (which must not exist)."""
    try:
        spec = TaskSpec.parse(task_spec)
        world = spec.build_world()
    except TaskError as exc:
        raise ExportError(str(exc)) from None
    if task_dir.exists():
        raise ExportError(f"{task_dir} already exists; pass --force to replace it")
    task_id = spec.id or spec.target.replace(" ", "-")
    depth = spec.depth if spec.depth is not None else world.depth(spec.target)
    world_json = json.dumps(
        {
            "task": {"id": task_id, "target": spec.target, "count": spec.count, "inventory": spec.inventory},
            **world.to_builtins(),
        },
        indent=1,
    )
    plan = solve(world, spec.target, spec.count, spec.inventory)
    goal = f"{spec.count} {spec.target}"
    # Built in a sibling temporary directory and renamed, so a failed export leaves no half task.
    task_dir.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(dir=task_dir.parent, prefix=f".{task_dir.name}-"))
    try:
        files = {
            "task.toml": _task_toml(f"{name_prefix}/textcraft-{task_id}", spec, depth, goal),
            "instruction.md": _instruction(goal, world.base_items),
            "environment/Dockerfile": DOCKERFILE,
            "environment/world.json": world_json,
            "tests/test.sh": TEST_SH,
            "tests/world.json": world_json,
            "solution/solve.sh": "#!/usr/bin/env bash\nset -e\n"
            + "".join(f"textcraft {a.op} {a.count} {shlex.quote(a.item)}\n" for a in plan),
        }
        for name, text in files.items():
            path = building / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            if name.endswith(".sh"):
                path.chmod(0o755)
        for folder in ("environment", "tests"):
            shutil.copy(harbor_cli.__file__, building / folder / "textcraft.py")
            shutil.copy(crafting.__file__, building / folder / "crafting.py")
        building.rename(task_dir)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return task_dir


def export_tasks(
    out_dir: Path,
    env: type[TextCraft] = TextCraft,
    split: str = "test",
    n: int = 10,
    start: int = 0,
    *,
    force: bool = False,
) -> list[Path]:
    """Write tasks ``start .. start+n-1`` of ``split`` of ``env`` under ``out_dir``, one
    directory each (``textcraft-<split>-<index>``), a Harbor dataset as a whole."""
    try:
        total = num_tasks(split, env.settings)
        if n < 1 or not 0 <= start < start + n <= total:
            raise ExportError(f"tasks {start}..{start + n - 1} are not all in split {split!r} of {total}")
        specs = [make_task(split, i, env.settings) for i in range(start, start + n)]
    except TaskError as exc:
        raise ExportError(str(exc)) from None
    written = []
    for spec in specs:
        task_dir = Path(out_dir) / f"textcraft-{spec['id']}"
        if force and task_dir.exists():
            shutil.rmtree(task_dir)
        written.append(write_task(task_dir, spec))
    return written


def _task_toml(name: str, spec: TaskSpec, depth: int, goal: str) -> str:
    # json.dumps quotes strings in a form TOML reads as basic strings.
    q = json.dumps
    return f"""\
schema_version = "1.4"

[task]
name = {q(name)}
description = {q(f"TextCraft: craft {goal} from base items by recipes (depth {depth}).")}
keywords = ["textcraft", "crafting", "planning"]

[metadata]
difficulty = {depth}
category = "crafting"
target = {q(spec.target)}
target_count = {spec.count}
split = {q(spec.split or "")}
index = {spec.index if spec.index is not None else -1}

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 1800.0

[environment]
build_timeout_sec = 600.0
cpus = 1
memory_mb = 512
network_mode = "no-network"
"""


def _instruction(goal: str, base_items: tuple[str, ...]) -> str:
    return f"""\
# Craft {goal}

Use the `textcraft` command to end up with **{goal}** in your inventory.

- `textcraft goal`: the goal and the base items.
- `textcraft info ITEM`: the recipe(s) that make ITEM, or that it is a base item.
- `textcraft get N ITEM`: fetch N of a base item (there is an endless supply).
- `textcraft craft N ITEM`: craft at least N of ITEM; each batch uses up the inputs of one recipe.
- `textcraft inventory`: what you have.

Base items: {", ".join(base_items)}.

The task is graded on the inventory when you stop: it must hold {goal}. Only actions made with
`textcraft` count.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m platoon_textcraft.harbor_export",
        description="Write TextCraft tasks as Harbor task dirs.",
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--env", choices=sorted(ENVIRONMENTS), default="platoon-textcraft")
    parser.add_argument("--split", default="test")
    parser.add_argument("--n", type=int, default=10, help="how many tasks")
    parser.add_argument("--start", type=int, default=0, help="index of the first task")
    parser.add_argument("--seed", type=int, default=None, help="task seed (default: the variant's)")
    parser.add_argument("--force", action="store_true", help="replace task directories that exist")
    args = parser.parse_args(argv)
    env = ENVIRONMENTS[args.env]
    if args.seed is not None:
        env = env.variant(f"{env.__name__}Seed{args.seed}", seed=args.seed)
    try:
        written = export_tasks(args.out_dir, env, args.split, args.n, args.start, force=args.force)
    except ExportError as exc:
        print(f"harbor_export: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {len(written)} Harbor tasks to {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

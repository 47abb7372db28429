"""`platoon rollout`, `platoon eval`, `platoon train` and `platoon run`."""

from __future__ import annotations

import difflib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from platoon import api
from platoon.assembly import RunOptions, assemble, import_packages
from platoon.bus import Bus
from platoon.bus.events import EpisodeGraded, EpisodeRequested, Event, TaskRef, new_id
from platoon.cli import CommandError
from platoon.cli.signals import run_async
from platoon.cli.train import train_command
from platoon.cli.tree import render_tree
from platoon.config import Config, entry_names, load_config, load_site, run_dir
from platoon.train.evaluate import list_tasks, progress_printer

log = structlog.get_logger("platoon.cli")


@dataclass
class Setup:
    config: Config
    config_path: Path
    run_dir: Path


def _setup(args: Any, purpose: str) -> Setup:
    path = Path(args.config)
    config = load_config(path, args.overrides)
    import_packages(config, path.resolve().parent)
    directory = run_dir(config, load_site(), purpose=purpose)
    return Setup(config, path, directory)


def _task(args: Any, config: Config) -> TaskRef:
    split, sep, task_id = args.task.partition(":")
    if not sep or not task_id:
        raise CommandError(f"--task {args.task!r}: expected SPLIT:ID (e.g. train:train-41) or SPLIT:#N")
    names = entry_names(config)
    env = args.env or names[0]
    if env not in names:
        raise CommandError(f"--env {env!r}: the config's environments are {', '.join(names)}")
    return TaskRef(env=env, split=split, task_id=task_id)


async def _find_task(bus: Bus, wanted: TaskRef) -> TaskRef:
    """The task whose id is exactly `wanted.task_id`, or the `#N`-th of the split (from 0)."""

    tasks = await list_tasks(bus, wanted.env, wanted.split)
    for task in tasks:
        if task.task_id == wanted.task_id:
            return task
    index = wanted.task_id.removeprefix("#")
    if wanted.task_id.startswith("#") and index.isdigit():
        if int(index) < len(tasks):
            return tasks[int(index)]
        raise CommandError(f"--task {wanted.split}:#{index}: split {wanted.split!r} has {len(tasks)} tasks")
    ids = [t.task_id for t in tasks]
    ending = suffix_matches(wanted.task_id, ids)
    if len(ending) == 1:  # train:41 for train-41, as the seed's README writes it
        return tasks[ids.index(ending[0])]
    close = ending[:3] or difflib.get_close_matches(wanted.task_id, ids, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; its first are {', '.join(ids[:3])}"
    where = f"split {wanted.split!r} of {wanted.env!r} ({len(tasks)} tasks)"
    problem = f"{len(ending)} tasks of {where} end in it" if ending else f"not in {where}"
    raise CommandError(
        f"task {wanted.task_id!r}: {problem}{hint} (give an id as listed, or #N for the N-th task)"
    )


def suffix_matches(wanted: str, ids: list[str]) -> list[str]:
    """The ids that end in `wanted` after a separator: `41` names `train-41` (or `train_41`)."""
    return [i for i in ids if i.endswith(("-" + wanted, "_" + wanted, ":" + wanted, "/" + wanted))]


def rollout(args: Any) -> int:
    setup = _setup(args, "rollout")
    wanted = _task(args, setup.config)

    async def main() -> list[Event]:

        asked = RunOptions(policy=getattr(args, "policy", None))
        run = assemble(setup.config, "rollout", asked, run_dir=setup.run_dir)
        async with run.running() as bus:
            task = await _find_task(bus, wanted)
            episode_id = new_id()
            seen: list[Event] = []
            async with bus.stream(Event, name="rollout") as events:
                await bus.publish(
                    EpisodeRequested(episode_id=episode_id, group_id=new_id(), task=task, purpose="rollout")
                )
                async for event in events:
                    if getattr(event, "episode_id", None) == episode_id:
                        seen.append(event)
                    if isinstance(event, EpisodeGraded) and event.episode_id == episode_id:
                        break
            return seen

    events = run_async(main)
    sys.stdout.write(render_tree(events))
    print(f"run directory: {setup.run_dir}", file=sys.stderr)
    return 0


def evaluate(args: Any) -> int:
    setup = _setup(args, "eval")
    config = setup.config

    async def main() -> Any:
        return await api.evaluate(
            config,
            setup.run_dir,
            policy=getattr(args, "policy", None),
            split=getattr(args, "split", None),
            progress=progress_printer(),
        )

    report = run_async(main)
    path = setup.run_dir / "eval.json"
    summary = {
        "reward_mean": report.reward_mean,
        "pass@k": report.pass_at_k,
        **(
            {"reward_parts": parts}
            if (parts := {k: v for k, v in report.reward_parts.items() if k != "reward"})
            else {}
        ),
        "episodes": report.episodes,
        "failures": report.failures,
    }
    print(json.dumps(summary))
    print(f"report: {path}", file=sys.stderr)
    if not report.episodes:
        split = getattr(args, "split", None) or "the eval split"
        raise CommandError(f"nothing was evaluated: {split} has no tasks (see eval.split, eval.max_tasks)")
    if not report.graded:
        why = (
            ", ".join(f"{n} {reason}" for reason, n in sorted(report.failures.items()))
            or "no reason recorded"
        )
        raise CommandError(f"no episode was graded ({why}); see {path}")
    return 0


def run(args: Any) -> int:
    """Train with its evals when the config has `train:`, else evaluate."""
    config = load_config(Path(args.config), args.overrides)
    if config.train is not None:
        return train_command(args)
    return evaluate(args)

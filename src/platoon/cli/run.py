"""`platoon rollout`, `platoon eval`, `platoon train` and `platoon run`."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import structlog

from platoon import system
from platoon.bus import Bus, EventLog
from platoon.bus.events import Event, TaskRef
from platoon.cli import CommandError
from platoon.config import Config, load_config, load_site, run_dir, write_run_files

log = structlog.get_logger("platoon.cli")


@dataclass
class Setup:
    config: Config
    config_path: Path
    run_dir: Path


def _setup(args: Any) -> Setup:
    path = Path(args.config)
    config = load_config(path, args.overrides)
    system.import_packages(config, path.resolve().parent)
    directory = run_dir(config, load_site())
    return Setup(config, path, directory)


def _model_and_renderer(config: Config) -> tuple[str | None, str]:
    model = config.train.model_name if config.train else (config.eval.model_name if config.eval else None)
    renderer = (
        config.train.renderer_name if config.train else (config.eval.renderer_name if config.eval else None)
    )
    return model, renderer or "qwen3_instruct"


def _tokenizer(config: Config, *, scripted: bool) -> Any:
    model, _ = _model_and_renderer(config)
    name = (config.train.tokenizer if config.train else None) or model
    if name is None:
        if scripted:
            return system.load_tokenizer(system.TOY_TOKENIZER)
        raise CommandError("the config names no model: set train.model_name (or eval.model_name)")
    try:
        return system.load_tokenizer(name)
    except system.SystemError:
        if not scripted:
            raise
        log.warning(
            "tokenizer not available locally; the scripted policy uses platoon's toy Qwen3 tokenizer",
            wanted=name,
        )
        return system.load_tokenizer(system.TOY_TOKENIZER)


@contextlib.asynccontextmanager
async def _policy(config: Config, args: Any, tokenizer: Any) -> AsyncIterator[Any]:
    """The sampler factory: a scripted policy, the embedded backend, or a Tinker service."""
    policy = getattr(args, "policy", None)
    if policy:
        yield system.policy_from_ref(policy, tokenizer)
        return
    from platoon.policy.tinker import TinkerSamplerFactory

    model, _ = _model_and_renderer(config)
    model_path = config.eval.model_path if config.eval else None
    if config.train is not None and config.train.backend == "local":
        from platoon.backends.local import running_server_in_thread

        async with running_server_in_thread(config.train.model_name) as base_url:
            import tinker

            client = tinker.ServiceClient(base_url=base_url, api_key="tml-local")
            yield TinkerSamplerFactory(client, config.train.model_name, model_path=model_path)
        return
    client = system.tinker_service_client(config)
    yield TinkerSamplerFactory(client, model or "", model_path=model_path)


@contextlib.asynccontextmanager
async def _rollout_system(setup: Setup, args: Any, *, eval: bool) -> AsyncIterator[Bus]:
    from platoon.programs import EpisodeRunner, Grader

    config = setup.config
    if not config.environments:
        raise CommandError("the config has no environments")
    tokenizer = _tokenizer(config, scripted=bool(getattr(args, "policy", None)))
    _, renderer_name = _model_and_renderer(config)
    renderer, parser = system.make_renderer(
        renderer_name, tokenizer, config.train.tool_call_parser if config.train else "auto"
    )
    runner = EpisodeRunner(
        system.entry_settings(config, eval=eval),
        max_concurrent=config.eval.concurrency if (eval and config.eval) else 256,
        seed=config.train.seed if config.train else 0,
    )
    write_run_files(
        setup.run_dir,
        config,
        {"renderer": renderer_name, "tool_call_parser": parser, "policy": getattr(args, "policy", None)},
    )
    async with _policy(config, args, tokenizer) as factory:
        components = [
            EventLog(setup.run_dir),
            *system.env_services(config),
            system.gateway_for(config, renderer, factory),
            runner,
            Grader(reward_processors=system.reward_processors(config)),
            *system.plugin_components(config),
        ]
        async with Bus() as bus, system.running(bus, components):
            yield bus


def run_async(main: Any) -> Any:
    """`anyio.run(main)`, raising an error from inside the run's task groups as itself, so the
    command line prints it as its one-line message rather than as an exception group."""
    try:
        return anyio.run(main)
    except BaseExceptionGroup as group:
        error: BaseException = group
        while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
            error = error.exceptions[0]
        if isinstance(error, BaseExceptionGroup):
            raise
        raise error from None


def _task(args: Any, config: Config) -> TaskRef:
    split, sep, task_id = args.task.partition(":")
    if not sep or not task_id:
        raise CommandError(f"--task {args.task!r}: expected SPLIT:ID, e.g. train:41")
    names = system.entry_names(config)
    env = args.env or names[0]
    if env not in names:
        raise CommandError(f"--env {env!r}: the config's environments are {', '.join(names)}")
    return TaskRef(env=env, split=split, task_id=task_id)


async def _find_task(bus: Bus, wanted: TaskRef) -> TaskRef:
    from platoon.train.evaluate import list_tasks

    tasks = await list_tasks(bus, wanted.env, wanted.split)
    for task in tasks:
        if task.task_id == wanted.task_id:
            return task
    if wanted.task_id.isdigit() and int(wanted.task_id) < len(tasks):
        return tasks[int(wanted.task_id)]
    raise CommandError(
        f"task {wanted.task_id!r} is not in split {wanted.split!r} of {wanted.env!r} ({len(tasks)} tasks)"
    )


def rollout(args: Any) -> int:
    setup = _setup(args)
    wanted = _task(args, setup.config)

    async def main() -> list[Event]:
        from platoon.bus.events import EpisodeGraded, EpisodeRequested, new_id

        async with _rollout_system(setup, args, eval=False) as bus:
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

    from platoon.cli.tree import render_tree

    events = run_async(main)
    sys.stdout.write(render_tree(events))
    print(f"run directory: {setup.run_dir}", file=sys.stderr)
    return 0


def evaluate(args: Any) -> int:
    setup = _setup(args)
    config = setup.config

    async def main() -> Any:
        from platoon.config.schema import workflow_for
        from platoon.train.evaluate import evaluate as run_eval
        from platoon.train.evaluate import list_tasks, progress_printer

        async with _rollout_system(setup, args, eval=True) as bus:
            tasks: list[TaskRef] = []
            for name, entry in zip(system.entry_names(config), config.environments, strict=True):
                split = getattr(args, "split", None) or (
                    config.eval.split if config.eval and config.eval.split else entry.splits.eval
                )
                found = await list_tasks(bus, name, split)
                if config.eval and config.eval.max_tasks:
                    found = found[: config.eval.max_tasks]
                tasks += found
            workflow = workflow_for(config, None, eval=True)
            return await run_eval(
                bus,
                tasks,
                group_size=workflow.group_size,
                concurrency=config.eval.concurrency if config.eval else 16,
                progress=progress_printer(),
            )

    from platoon.train.evaluate import as_json

    report = run_async(main)
    path = setup.run_dir / "eval.json"
    path.write_bytes(as_json(report))
    summary = {
        "reward_mean": report.reward_mean,
        "pass@k": report.pass_at_k,
        "episodes": report.episodes,
        "failures": report.failures,
    }
    print(json.dumps(summary))
    print(f"report: {path}", file=sys.stderr)
    return 0


def train(args: Any) -> int:
    from platoon.train.loop import train_command

    return train_command(args)


def run(args: Any) -> int:
    """Train with its evals when the config has `train:`, else evaluate."""
    config = load_config(Path(args.config), args.overrides)
    if config.train is not None:
        return train(args)
    return evaluate(args)

"""`platoon worker CONFIG --nats URL`: play rollouts for a trainer on another machine.

The worker loads the trainer's config, runs its env services, a gateway, the episode runner
and the grader, and takes `EpisodeRequested` from the run's NATS queue group once it knows
the trainer's policy. It samples from the sampler the trainer announces (a Tinker service:
the `base_url` the trainer announces, `$TINKER_BASE_URL` taking precedence, else hosted
Tinker), or from `--policy scripted:MODULE:ATTR`. SIGTERM or SIGINT stops it cleanly (a
second one at once); so does the end of the trainer's run.

It refuses a NATS server that lets anyone in, where anyone could announce a policy or end the
run, unless `nats.insecure=true` says the server is the user's alone (`platoon nats init`
writes one that asks each role for its password).

Also runnable as `python -m platoon.cli.worker`, with the same arguments.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import structlog

from platoon.assembly import RunOptions, assemble, import_packages
from platoon.cli import CommandError
from platoon.config import AssemblyError, load_config
from platoon.errors import first_error
from platoon.stats.logging import configure_logging
from platoon.train.distributed import DistributedError

__all__ = ["add_arguments", "main", "worker"]

log = structlog.get_logger("platoon.worker")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The worker's arguments, for `platoon worker` and `python -m platoon.cli.worker`."""
    p.add_argument("config", help="the trainer's YAML config file")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="override any config entry")
    p.add_argument("--nats", metavar="URL", help="the NATS server (default: the config's nats.url)")
    p.add_argument("--policy", help="scripted:MODULE:ATTR to play a scripted policy (tests, demos)")
    p.add_argument("--name", help="the worker's name in the trainer's metrics (default: host:pid)")
    p.add_argument("--drain", type=float, metavar="SECONDS", help="how long a stop waits for episodes")


def worker(args: Any) -> int:

    path = Path(args.config)
    config = load_config(path, args.overrides)
    import_packages(config, path.resolve().parent)
    if config.train is None:
        raise CommandError("a worker needs the trainer's config, with its train: section")
    if config.nats is None and not args.nats:
        raise CommandError("no NATS server: add a nats: section to the config or pass --nats URL")
    try:
        asked = RunOptions(
            policy=getattr(args, "policy", None),
            nats_url=args.nats,
            worker_name=getattr(args, "name", None),
            drain_timeout=getattr(args, "drain", None),
        )
        node = assemble(config, "worker", asked).worker()
    except DistributedError as exc:
        raise CommandError(str(exc)) from None
    except AssemblyError as exc:
        if str(exc).startswith("--policy"):
            raise CommandError(str(exc)) from None
        raise
    reason = anyio.run(_serve, node, backend="asyncio")
    if node.refusal is not None:
        raise CommandError(node.refusal)
    print(f"platoon worker {node.name}: stopped ({reason})", file=sys.stderr)
    return 0


async def _serve(node: Any) -> str:
    """Run the worker; the first SIGTERM/SIGINT stops it gracefully, a second one at once."""
    from platoon.bus.nats import NatsBridgeError  # the nats extra: a worker has it, the command line may not

    stop = anyio.Event()
    reason = "signal"
    error: str | None = None
    async with anyio.create_task_group() as tg:

        async def signals() -> None:
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
                async for signum in received:
                    if stop.is_set():
                        log.warning("second signal: stopping now", signal=signal.Signals(signum).name)
                        tg.cancel_scope.cancel()
                        return
                    log.info("stopping: no more work; finishing the episodes in flight")
                    stop.set()

        async def serve() -> None:
            nonlocal reason, error
            try:
                reason = await node.run(stop=stop)
            except* NatsBridgeError as group:
                error = str(first_error(group))
            tg.cancel_scope.cancel()

        tg.start_soon(signals)
        tg.start_soon(serve)
    if error is not None:
        raise CommandError(error)
    return reason


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="platoon worker", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    add_arguments(parser)
    args = parser.parse_args(argv)

    configure_logging("console", "info")
    try:
        return worker(args)
    except Exception as exc:
        if args.debug:
            raise
        print(f"platoon: error: {exc}", file=sys.stderr)
        return 2 if type(exc).__name__ == "ConfigError" else 1


if __name__ == "__main__":
    sys.exit(main())

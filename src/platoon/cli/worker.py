"""`platoon worker CONFIG --nats URL`: play rollouts for a trainer on another machine.

The worker loads the trainer's config, runs its env services, a gateway, the episode runner
and the grader, and takes `EpisodeRequested` from the run's NATS queue group once it knows
the trainer's policy. It samples from the sampler the trainer announces (a Tinker service:
the `base_url` the trainer announces, `$TINKER_BASE_URL` taking precedence, else hosted
Tinker), or from `--policy scripted:MODULE:ATTR`. SIGTERM or SIGINT stops it cleanly (a
second one at once); so does the end of the trainer's run.

Also runnable as `python -m platoon.cli.worker`, with the same arguments.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import structlog

from platoon import system
from platoon.cli import CommandError
from platoon.config import Config, load_config

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
    from platoon.train.distributed import DistributedError, Worker

    path = Path(args.config)
    config = load_config(path, args.overrides)
    system.import_packages(config, path.resolve().parent)
    if config.train is None:
        raise CommandError("a worker needs the trainer's config, with its train: section")
    if config.nats is None and not args.nats:
        raise CommandError("no NATS server: add a nats: section to the config or pass --nats URL")
    config = _local_model(config)
    tokenizer = system.tokenizer_for(config, scripted=bool(getattr(args, "policy", None)))
    from platoon.gateway.renderers import get_renderer

    train = config.train
    assert train is not None
    parser = None if train.tool_call_parser == "auto" else train.tool_call_parser
    renderer = get_renderer(train.renderer_name, tokenizer, tool_call_parser=parser)
    policy = getattr(args, "policy", None)
    from platoon.train.distributed import authenticated

    sampler_for = (
        _scripted(policy, tokenizer)
        if policy
        else _TinkerPolicies(config, trust_announced=authenticated(config))
    )
    try:
        node = Worker(
            config,
            sampler_for=sampler_for,
            renderer=renderer,
            url=args.nats,
            name=getattr(args, "name", None),
            drain_timeout=getattr(args, "drain", None),
        )
    except DistributedError as exc:
        raise CommandError(str(exc)) from None
    reason = anyio.run(_serve, node, backend="asyncio")
    if node.refusal is not None:
        raise CommandError(node.refusal)
    print(f"platoon worker {node.name}: stopped ({reason})", file=sys.stderr)
    return 0


async def _serve(node: Any) -> str:
    """Run the worker; the first SIGTERM/SIGINT stops it gracefully, a second one at once."""
    from platoon.bus.nats import NatsBridgeError

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
                first: BaseException = group
                while isinstance(first, BaseExceptionGroup):
                    first = first.exceptions[0]
                error = str(first)
            tg.cancel_scope.cancel()

        tg.start_soon(signals)
        tg.start_soon(serve)
    if error is not None:
        raise CommandError(error)
    return reason


def _local_model(config: Config) -> Config:
    """Build platoon's tiny demo model here too, when the config trains it."""
    from platoon.train.loop import TINY_MODEL, _replace_model

    if config.train is not None and config.train.model_name == TINY_MODEL:
        return _replace_model(config, system.resolve_model(TINY_MODEL, seed=config.train.seed))
    return config


def _scripted(ref: str, tokenizer: Any) -> Any:
    try:
        factory = system.policy_from_ref(ref, tokenizer)
    except system.SystemError as exc:
        raise CommandError(str(exc)) from None

    async def sampler_for(policy: Any) -> Any:
        return await factory.updated(policy)

    return sampler_for


class _TinkerPolicies:
    """Samplers on the Tinker service the trainer announces, one service client per URL.

    The worker's `TINKER_API_KEY` goes only to a URL it trusts: its own `$TINKER_BASE_URL` or
    `tinker_base_url`, hosted Tinker, or one announced over an authenticated NATS connection
    (where only the trainer may announce). An announcement heard over an unauthenticated bus
    could come from anyone, so its URL gets the placeholder key of a keyless local server.
    """

    def __init__(self, config: Config, *, trust_announced: bool = False) -> None:
        self.config = config
        self.trust_announced = trust_announced
        self.clients: dict[str | None, Any] = {}

    def _client(self, base_url: str | None) -> Any:
        own = os.environ.get("TINKER_BASE_URL") or self.config.tinker_base_url
        url = own or base_url
        if url not in self.clients:
            if url is None:
                self.clients[url] = system.tinker_service_client(self.config)
            else:
                import tinker

                trusted = url == own or self.trust_announced
                api_key = (os.environ.get("TINKER_API_KEY") if trusted else None) or "tml-local"
                if not trusted:
                    log.warning(
                        "sampling from the announced Tinker URL without this worker's key: the announcement "
                        "is not authenticated (set nats.credentials_file, or TINKER_BASE_URL)",
                        url=url,
                    )
                self.clients[url] = tinker.ServiceClient(base_url=url, api_key=api_key)
        return self.clients[url]

    async def __call__(self, policy: Any) -> Any:
        from platoon.policy.tinker import TinkerSamplerFactory

        assert self.config.train is not None
        client = await anyio.to_thread.run_sync(self._client, policy.base_url)
        factory = TinkerSamplerFactory(
            client,
            policy.base_model or self.config.train.model_name,
            model_path=policy.sampler_path or None,
            version=policy.version,
        )
        return await factory.initial()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="platoon worker", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    add_arguments(parser)
    args = parser.parse_args(argv)
    from platoon.stats.logging import configure_logging

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

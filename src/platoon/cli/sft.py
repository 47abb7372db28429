"""`platoon sft CONFIG --from RUN_DIR [--from ...] [--where EXPR] [--agent NAME] [--resume RUN_DIR]`:
supervised fine-tuning of the config's policy on recorded episodes, in a run folder of its own
(`<trial>-sft`), whose checkpoint `platoon train` starts from (`checkpoint.load_path`)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from platoon.api import sft
from platoon.assembly import check_training_service, import_packages
from platoon.cli.signals import run_async
from platoon.cli.train import _claimed, resumable
from platoon.config import load_config, load_site, run_dir
from platoon.stats.summary import sft_summary
from platoon.train.checkpoints import ResumeError
from platoon.train.recorded import RecordedError

__all__ = ["sft_command"]


def sft_command(args: argparse.Namespace) -> int:
    """`platoon sft CONFIG --from RUN_DIR ...`."""
    path = Path(args.config)
    config = load_config(path, args.overrides)
    import_packages(config, path.resolve().parent)
    check_training_service(config)
    if args.resume:
        directory = Path(args.resume)
    else:
        directory = run_dir(config, load_site(), purpose="sft")
        config, directory = _claimed(config, directory, new_trial=args.new_trial, overwrite=args.overwrite)
    sources = tuple(args.sources)
    where = tuple(args.where or ())
    words = ["platoon", "sft", *(w for s in sources for w in ("--from", s))]
    words += [w for expr in where for w in ("--where", expr)] + (
        ["--agent", args.agent] if args.agent else []
    )
    started = time.monotonic()
    trained = ("checkpoints.jsonl", "metrics.jsonl")  # a step trained: something to resume
    with resumable(args, directory, marks=trained, words=words, passes=(ResumeError, RecordedError)):
        run_async(
            lambda: sft(
                config,
                run_dir=directory,
                sources=sources,
                where=where,
                agent=args.agent,
                resume=bool(args.resume),
            )
        )
    print(sft_summary(directory, time.monotonic() - started))
    return 0

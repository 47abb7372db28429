"""`platoon train CONFIG [KEY=VALUE ...] [--resume RUN_DIR | --new-trial | --overwrite]`: a
training run in its own folder, with a summary at the end and, when it stops, the command that
goes on with it."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import msgspec

from platoon.api import train
from platoon.assembly import check_training_service, import_packages
from platoon.cli import CommandError
from platoon.cli.signals import run_async
from platoon.config import Config, load_config, load_site, run_dir
from platoon.config.redact import redact_text
from platoon.config.rundir import make_private_dir
from platoon.errors import sole_error
from platoon.models.loading import TokenizerMissing
from platoon.stats.metrics import HealthLimits
from platoon.stats.summary import train_summary
from platoon.train.checkpoints import CheckpointStore, ResumeError
from platoon.train.loop import NothingGraded

__all__ = ["RunStopped", "how_to_resume", "resumable", "train_command"]

# What a training run leaves (a rollout or an eval of the same config shares the directory).
_RUN_FILES = ("identity.json", "metrics.jsonl", "checkpoints.jsonl")
_FAILED = ".failed-attempt"


class RunStopped(RuntimeError):
    """A training run ended by an error it could not go on past; the message says how to resume."""


def run_stopped(exc: BaseException, hint: str) -> RunStopped:
    """A run that failed once it had something to resume: its reason (out of a task group's
    wrapping) and `hint`, the command that resumes it."""
    exc = sole_error(exc)
    return RunStopped(f"{str(exc) or type(exc).__name__}\n{hint}")


@contextlib.contextmanager
def resumable(
    args: argparse.Namespace,
    directory: Path,
    *,
    marks: Sequence[str] = ("identity.json",),
    words: Sequence[str] = ("platoon", "train"),
    passes: tuple[type[BaseException], ...] = (),
) -> Iterator[None]:
    """A run stopped by Ctrl-C or an error says the command that goes on with it, once it has
    something to resume (one of `marks` in `directory`). `passes`: errors whose own messages say
    what to do, raised as they are."""
    try:
        yield
    except KeyboardInterrupt:
        if (directory / "identity.json").exists():
            print(f"platoon: {how_to_resume(args, directory, words)}", file=sys.stderr)
        raise
    except passes:
        raise
    except Exception as exc:
        if not any((directory / mark).exists() for mark in marks):
            raise  # it failed before there was anything to resume
        raise run_stopped(exc, how_to_resume(args, directory, words)) from exc


def how_to_resume(
    args: argparse.Namespace, directory: Path, command: Sequence[str] = ("platoon", "train")
) -> str:
    """Where a stopped run stands and the command that goes on with it (secrets left out).
    `command`: the command's words before its config (`platoon sft` adds its `--from`s after)."""
    try:
        stores = [CheckpointStore(d) for d in sorted((directory / "checkpoints").glob("*")) if d.is_dir()]
        found = [store.latest() for store in stores or [CheckpointStore(directory)]]
        # several policies: a resume starts from the newest step all of them saved
        latest = None if None in found else min(found, key=lambda c: c.step)  # type: ignore[union-attr]
    except ResumeError:
        latest = None
    line = " ".join(
        [
            *command[:2],
            shlex.quote(str(args.config)),
            *(shlex.quote(o) for o in [*command[2:], *(getattr(args, "overrides", None) or ())]),
            "--resume",
            shlex.quote(str(directory)),
        ]
    )
    where = (
        f"its last checkpoint is after step {latest.step}, so a resume trains from step {latest.step + 1}"
        if latest
        else "it has no checkpoint yet, so a resume starts it again from step 1"
    )
    return f"the run stopped; {where}: {redact_text(line)}"


def _holds_run(directory: Path) -> bool:
    """Whether a run trained at least one step here (its metrics or a checkpoint say so)."""
    for name in ("metrics.jsonl", "checkpoints.jsonl"):
        with contextlib.suppress(OSError), open(directory / name, "rb") as f:
            if any(line.strip() for line in f):
                return True
    return False


def _set_aside_failed_attempt(directory: Path) -> None:
    """An attempt that ended before its first step (a config problem, say) leaves the run's
    files and no step: they go to `.failed-attempt/` (replacing an older one) so that the
    command, fixed, runs here again without asking, and what the attempt logged is kept."""
    if not any((directory / name).exists() for name in _RUN_FILES):
        return
    aside = directory / _FAILED
    shutil.rmtree(aside, ignore_errors=True)
    make_private_dir(aside)
    for path in directory.iterdir():
        if path.name != _FAILED:
            path.rename(aside / path.name)
    print(
        f"platoon: {directory} held an attempt that trained no step; it is kept in {aside}", file=sys.stderr
    )


def _claimed(config: Config, directory: Path, *, new_trial: bool, overwrite: bool) -> tuple[Config, Path]:
    """The config and directory a new run writes to, when its directory may hold a run already:
    refused with the three ways on, or a numbered new trial beside it, or the old run deleted."""
    if not _holds_run(directory):
        _set_aside_failed_attempt(directory)
        return config, directory
    n = 2
    while _holds_run(directory.with_name(f"{directory.name}-{n}")):
        n += 1
    beside = directory.with_name(f"{directory.name}-{n}")
    if new_trial:
        _set_aside_failed_attempt(beside)
        stats = msgspec.structs.replace(config.stats, trial_name=beside.name)
        return msgspec.structs.replace(config, stats=stats), beside
    if overwrite:
        shutil.rmtree(directory)
        return config, directory
    raise CommandError(
        f"{directory} already holds a run: pass --resume {directory} to continue it, --new-trial to "
        f"train as {beside.name} beside it, or --overwrite to delete it and start over"
    )


def train_command(args: argparse.Namespace) -> int:
    """`platoon train CONFIG [KEY=VALUE ...] [--resume RUN_DIR]`."""
    path = Path(args.config)
    config = load_config(path, args.overrides)
    import_packages(config, path.resolve().parent)
    check_training_service(config)
    if getattr(args, "resume", None):
        directory = Path(args.resume)
    else:
        directory = run_dir(config, load_site())
        config, directory = _claimed(
            config,
            directory,
            new_trial=getattr(args, "new_trial", False),
            overwrite=getattr(args, "overwrite", False),
        )
    started = time.monotonic()
    live = sys.stderr.isatty() and not getattr(args, "quiet", False)
    resume = bool(getattr(args, "resume", None))
    with resumable(args, directory, passes=(ResumeError, NothingGraded, TokenizerMissing)):
        try:
            run_async(lambda: train(config, run_dir=directory, resume=resume, progress=live))
        except TokenizerMissing as exc:
            local = path.with_name("train-local.yaml")
            if local.exists() and local != path:
                raise TokenizerMissing(
                    f"{exc}. This example trains a model built here with {local}"
                ) from None
            raise
    limits = HealthLimits(config.stats.warn_mismatch_kl, config.stats.warn_clipped_fraction)
    print(train_summary(directory, time.monotonic() - started, limits))
    return 0

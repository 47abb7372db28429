"""`platoon events RUN_DIR`: print a run's event log.

A damaged log (records that fail their checksum, a last record cut short) is read past the
damage, and the command then says what was lost and exits 1; `--salvage` exits 0 all the same.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from datetime import UTC, datetime

import msgspec

from platoon.bus import LogDamage, read_records, to_json
from platoon.bus.events import event_types
from platoon.cli import CommandError


def events(args: argparse.Namespace) -> int:
    try:
        return _print(args)
    except BrokenPipeError:  # `platoon events RUN | head` closed the pipe: not an error
        sys.stderr.close()
        return 0


def _print(args: argparse.Namespace) -> int:
    wanted = set(args.types or ())
    known = sorted(t.__name__ for t in event_types())
    unknown = sorted(wanted - set(known))
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise CommandError(f"--type {unknown[0]}: no such event type{hint}")
    out = sys.stdout
    damage = LogDamage(path="")
    for stamp, event in read_records(args.run_dir, damage):
        name = type(event).__name__
        if wanted and name not in wanted:
            continue
        if args.json:
            data = msgspec.json.decode(to_json(event))
            out.write(msgspec.json.encode({"time": stamp, **data}).decode() + "\n")
        else:
            fields = msgspec.structs.asdict(event)
            body = " ".join(f"{k}={_short(v)}" for k, v in fields.items())
            when = datetime.fromtimestamp(stamp, UTC).strftime("%H:%M:%S.%f")[:-3] if stamp else "--"
            out.write(f"{name} {body} @{when}\n")
    if damage.found:
        out.flush()
        print(f"platoon: the event log is damaged: {damage.describe()}", file=sys.stderr)
        if not getattr(args, "salvage", False):
            print("platoon: what could be read is above; --salvage exits 0 all the same", file=sys.stderr)
            return 1
    return 0


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

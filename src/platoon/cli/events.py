"""`platoon events RUN_DIR`: print a run's event log."""

from __future__ import annotations

import sys

import msgspec

from platoon.bus import read_events, to_json


def events(args) -> int:
    try:
        return _print(args)
    except BrokenPipeError:  # `platoon events RUN | head` closed the pipe: not an error
        sys.stderr.close()
        return 0


def _print(args) -> int:
    wanted = set(args.types or ())
    out = sys.stdout
    for event in read_events(args.run_dir):
        name = type(event).__name__
        if wanted and name not in wanted:
            continue
        if args.json:
            out.write(to_json(event).decode() + "\n")
        else:
            fields = msgspec.structs.asdict(event)
            body = " ".join(f"{k}={_short(v)}" for k, v in fields.items())
            out.write(f"{name} {body}\n")
    return 0


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

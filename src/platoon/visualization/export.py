"""`platoon view RUN_DIR --export DIR`: a static copy of the viewer that opens from disk.

The page is the same; each answer the server would give is written as a small script
(`data/<key>.js`) that the page loads with a `<script>` tag, which works from `file://` where
`fetch` does not. The copy holds every run, step, episode and model call of the runs named.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import msgspec

from platoon.bus.events import ModelCallFinished
from platoon.visualization.app import Api, static_dir
from platoon.visualization.index import iter_rows
from platoon.visualization.runs import RunSet

__all__ = ["data_key", "export"]

_SAFE = re.compile(r"[A-Za-z0-9-]")
_encoder = msgspec.json.Encoder()


def data_key(name: str, params: dict[str, Any]) -> str:
    """The file name of an answer: the same function as `dataKey` in app.js."""
    query = "&".join(f"{k}={params[k]}" for k in sorted(params) if params[k] not in (None, ""))
    return "".join(c if _SAFE.fullmatch(c) else f"_{ord(c):02x}" for c in f"{name}?{query}")


def export(runs: RunSet, out: str | Path) -> dict[str, int]:
    """Write the static copy into `out` (created); returns how many answers of each kind."""
    out = Path(out)
    (out / "static").mkdir(parents=True, exist_ok=True)
    data = out / "data"
    data.mkdir(exist_ok=True)
    static = static_dir()
    for name in ("app.js", "app.css"):
        shutil.copyfile(static / name, out / "static" / name)
    page = (static / "index.html").read_text()
    page = page.replace(
        '<script src="static/app.js"></script>',
        '<script>window.PLATOON_STATIC = true;</script>\n<script src="static/app.js"></script>',
    )
    (out / "index.html").write_text(page)

    api = Api(runs)
    counts: dict[str, int] = {}

    def write(name: str, params: dict[str, Any], answer: Any = None) -> Any:
        params = {k: str(v) for k, v in params.items()}
        answer = api.answer(name, params) if answer is None else answer
        key = data_key(name, params)
        body = b"window.__platoonData[" + _encoder.encode(key) + b"] = " + _encoder.encode(answer) + b";\n"
        (data / f"{key}.js").write_bytes(body)
        counts[name] = counts.get(name, 0) + 1
        return answer

    write("runs", {})
    for run in runs:
        write("run", {"run": run.id})
        write("metrics", {"run": run.id})
        steps = write("steps", {"run": run.id})
        if not run.index.log_path.is_file():
            continue
        for step in steps["steps"]:
            write("episodes", {"run": run.id, "purpose": step["purpose"], "step": step["step"]})
        groups: set[str] = set()
        for row in iter_rows(run.index, sort="requested_at", descending=False):
            if row["group_id"] and row["group_id"] not in groups:
                groups.add(row["group_id"])
                write("episodes", {"run": run.id, "group_id": row["group_id"]})
            write("episode", {"run": run.id, "id": row["episode_id"]})
            for record in run.index.episode_records(row["episode_id"]):
                if isinstance(record.event, ModelCallFinished):
                    write("call", {"run": run.id, "episode": row["episode_id"], "call": record.event.call_id})
    return counts

"""The verifiers side of `service: verifiers://ENV_ID`: one process per env entry, under Python >= 3.12.

platoon runs on Python 3.11 and verifiers needs 3.12, so the environment lives in this process,
started by `platoon.envs.verifiers.process` with the venv's interpreter (it imports only the
standard library, verifiers and its two adapters beside it, never platoon). It is started as
`python worker.py SETTINGS SOCKET`, says on stdout that it is ready (or one line saying why not),
then answers on the unix socket, one JSON request line and one JSON reply line per connection,
many connections at once:

    {"op": "tasks"}                                    -> {"tasks": [{index, task_id, prompt}]}
    {"op": "run", "index": 0, "base_url": URL,
     "api_key": KEY, "model": NAME}                    -> {"ok", "reward", "rewards", "metrics", ...}

It stops when its stdin closes.

It speaks each API generation of verifiers behind that one protocol: the classic one (0.1.8 to
0.3: a package whose module has `load_environment`, `vf_classic.py`) and v1 (0.4, and the v1
stack of 0.2-0.3: a taskset id, `vf_v1.py`). A run is one episode of the task, its model client
pointed at `base_url` (platoon's per-episode gateway), scored by the task's rubric. The key
reaches the client through an environment variable whose name holds `API_KEY`, which verifiers'
subprocess runtime keeps from harness programs. Anything the environment prints goes to stderr;
a failure to load says the innermost error and the package it came from (`worker_errors.py`).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import sys
from typing import Any, TextIO

from worker_errors import Refused, explain


def api_of(env_id: str) -> str:
    """Which API the environment is written for: `classic` when its module (importable where
    verifiers still has the classic stack) has `load_environment`, else `v1`. Importing it here
    surfaces its own import errors, not verifiers' "not found" around them."""
    classic = _has("verifiers.envs")
    module = env_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_")
    if _has(module):
        loaded = importlib.import_module(module)
        if hasattr(loaded, "load_environment"):
            if not classic:
                raise Refused(
                    f"{module} is written for verifiers' classic API (load_environment), which this "
                    "verifiers no longer has: name a verifiers version below 0.4 (service_kwargs.verifiers)"
                )
            return "classic"
    if not _has("verifiers.v1"):
        raise Refused(f"no module {module!r} with load_environment, and this verifiers has no v1 API")
    return "v1"


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def load(settings: dict[str, Any]) -> Any:
    if api_of(settings["env_id"]) == "classic":
        from vf_classic import ClassicEnv

        return ClassicEnv(settings)
    from vf_v1 import V1Env

    return V1Env(settings)


class Worker:
    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.env: Any = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: one request line in, one reply line out."""
        try:
            request = json.loads(await reader.readline())
            if request["op"] == "tasks":
                answer: dict[str, object] = {"tasks": self.env.describe()}
            elif request["op"] == "run":
                answer = await self.env.run(
                    int(request["index"]), request["base_url"], request["api_key"], request["model"]
                )
            else:
                answer = {"error": f"unknown op {request['op']!r}"}
        except Refused as exc:
            answer = {"error": str(exc)}
        except Exception as exc:  # one episode's failure is its reply, never the worker's end
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        writer.write((json.dumps(answer) + "\n").encode())
        await writer.drain()
        writer.close()

    async def serve(self, socket_path: str, ready: TextIO) -> None:
        """Load the environment, say so on `ready` (or why not), then answer connections on the
        socket until stdin closes (platoon's side went away)."""
        try:
            self.env = load(self.settings)
            count = len(self.env.describe())
        except Exception as exc:
            ready.write(json.dumps({"error": explain(exc)}) + "\n")
            return
        async with self.env.serving():
            server = await asyncio.start_unix_server(self.handle, path=socket_path, limit=16 * 1024 * 1024)
            ready.write(json.dumps({"ready": True, "tasks": count, "api": self.env.api}) + "\n")
            async with server:
                await asyncio.to_thread(sys.stdin.read)  # returns at EOF


async def main() -> None:
    # stdout says ready (or why not) once; whatever the environment prints goes to stderr
    ready = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    await Worker(json.loads(sys.argv[1])).serve(sys.argv[2], ready)


if __name__ == "__main__":
    asyncio.run(main())

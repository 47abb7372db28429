"""The verifiers side of `service: verifiers://ENV_ID`: one process per env entry, under Python >= 3.12.

platoon runs on Python 3.11 and verifiers needs 3.12, so the environment lives in this process,
started by `platoon.envs.verifiers.process` with the venv's interpreter (it imports only the
standard library and verifiers, never platoon). It is started as `python worker.py SETTINGS SOCKET`, says on
stdout that it is ready (or one line saying why not), then answers on the unix socket, one JSON
request line and one JSON reply line per connection, many connections at once:

    {"op": "tasks"}                                    -> {"tasks": [{index, task_id, prompt}]}
    {"op": "run", "index": 0, "base_url": URL,
     "api_key": KEY, "model": NAME}                    -> {"ok", "reward", "rewards", "metrics", ...}

It stops when its stdin closes.

A run is one verifiers episode of the task: the environment's own harness, in its subprocess
runtime, with its model client pointed at `base_url` (platoon's per-episode gateway), scored by
the task's rubric. The key reaches the client through an environment variable whose name holds
`API_KEY`, which verifiers' subprocess runtime keeps from the harness program. Anything the
environment prints goes to stderr.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from typing import TYPE_CHECKING, TextIO, TypedDict

if TYPE_CHECKING:
    import verifiers.v1 as vf

CLOUD_RUNTIMES = ("prime", "modal", "e2b")


class Settings(TypedDict, total=False):
    env_id: str
    harness: str
    env_args: dict[str, object]
    max_tasks: int | None


class Request(TypedDict, total=False):
    op: str
    index: int
    base_url: str
    api_key: str
    model: str


def _table(value: object) -> dict[str, object]:
    return dict(value) if isinstance(value, dict) else {}


class Refused(Exception):
    """A setting this bridge will not run; the message is one line that says why."""


def build_env(settings: Settings) -> vf.Env:
    """The verifiers Env the settings name, every role on the local subprocess runtime."""
    import verifiers.v1 as vf
    from verifiers.v1.configs.agent import agent_config_fields
    from verifiers.v1.utils.loaders import harness_class

    raw = _table(settings.get("env_args"))
    raw["taskset"] = {**_table(raw.get("taskset")), "id": settings["env_id"]}
    roles = agent_config_fields(vf.resolve_env_config(dict(raw)))
    for role in roles:
        given = _table(raw.get(role))
        given.setdefault("harness", {"id": settings.get("harness") or "null"})
        given.setdefault("runtime", {"type": "subprocess"})
        raw[role] = given
    config = vf.resolve_env_config(raw)
    for role, agent in agent_config_fields(config).items():
        kind = getattr(agent.runtime, "type", "?")
        if kind in CLOUD_RUNTIMES:
            raise Refused(
                f"role {role}: the {kind} runtime runs in a cloud that needs an account; "
                "platoon runs verifiers environments in the subprocess runtime"
            )
        if kind != "subprocess":
            raise Refused(f"role {role}: the {kind} runtime is not supported by platoon yet; use subprocess")
        harness_id = agent.harness.id if agent.harness is not None else "bash"
        if harness_class(harness_id).EXECUTES_CODE:
            raise Refused(
                f"role {role}: harness {harness_id} runs the model's commands, and the subprocess "
                "runtime would run them on this machine unconfined; use a harness that runs none (null)"
            )
    return vf.load_environment(config)


def list_tasks(env: vf.Env, max_tasks: int | None) -> list[vf.Task]:
    taskset = env.taskset
    if max_tasks is not None:
        taskset = taskset.take(max_tasks)
    elif not taskset.bounded:
        raise Refused("the taskset is infinite: give service_kwargs.max_tasks")
    return list(taskset)


def describe(tasks: list[vf.Task]) -> list[dict[str, object]]:
    return [
        {
            "index": i,
            "task_id": task.data.id or task.data.name or str(i),
            "prompt": task.data.prompt_text,
            "system_prompt": task.data.system_prompt,
        }
        for i, task in enumerate(tasks)
    ]


def score(episode: vf.Episode) -> dict[str, object]:
    """The episode's grade: each reward function's value (unweighted), the weighted sum, metrics."""
    rewards: dict[str, float] = {}
    metrics: dict[str, float] = {}
    total = 0.0
    missing = []
    for trace in episode.traces:
        prefix = "" if len(episode.traces) == 1 else f"{trace.agent.name}."
        for name, reward in trace.rewards.items():
            if reward is None:
                missing.append(name)
                continue
            rewards[prefix + name] = reward.score
            total += reward.value
        for name, value in trace.metrics.items():
            if value is not None and math.isfinite(value):
                metrics[prefix + name] = value
    errors = [f"{e.type}: {e.message}" for e in episode.errors]
    errors += [f"{e.type}: {e.message}" for t in episode.traces for e in t.errors]
    return {
        "ok": bool(episode.ok) and not missing,
        "reward": total,
        "rewards": rewards,
        "metrics": metrics,
        "unscored": missing,
        "errors": errors[-5:],
        "reply": episode.traces[-1].last_reply if episode.traces else "",
        "turns": sum(t.num_turns for t in episode.traces),
    }


class Worker:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.env: vf.Env | None = None
        self.tasks: list[vf.Task] = []
        self.runs = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: one request line in, one reply line out."""
        try:
            request: Request = json.loads(await reader.readline())
            if request["op"] == "tasks":
                answer: dict[str, object] = {"tasks": describe(self.tasks)}
            elif request["op"] == "run":
                answer = await self.run(request)
            else:
                answer = {"error": f"unknown op {request['op']!r}"}
        except Refused as exc:
            answer = {"error": str(exc)}
        except Exception as exc:  # one episode's failure is its reply, never the worker's end
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        writer.write((json.dumps(answer) + "\n").encode())
        await writer.drain()
        writer.close()

    async def run(self, request: Request) -> dict[str, object]:
        import verifiers.v1 as vf

        assert self.env is not None
        task = self.tasks[int(request["index"])]
        self.runs += 1
        variable = f"PLATOON_EPISODE_{self.runs}_API_KEY"  # kept from harness programs (API_KEY)
        os.environ[variable] = request["api_key"]
        try:
            client = vf.EvalClientConfig(base_url=request["base_url"], api_key_var=variable)
            ctx = vf.ModelContext(client=client, model=request["model"], sampling=vf.SamplingConfig())
            episode = await self.env.run_episode(task, ctx)
        finally:
            os.environ.pop(variable, None)
        return score(episode)

    async def serve(self, socket_path: str, ready: TextIO) -> None:
        """Load the environment, say so on `ready` (or why not), then answer connections on the
        socket until stdin closes (platoon's side went away)."""
        try:
            self.env = build_env(self.settings)
            self.tasks = list_tasks(self.env, self.settings.get("max_tasks"))
        except Exception as exc:
            text = str(exc) if isinstance(exc, Refused) else f"{type(exc).__name__}: {exc}"
            ready.write(json.dumps({"error": " ".join(text.split())}) + "\n")
            return
        async with self.env.serving():
            server = await asyncio.start_unix_server(self.handle, path=socket_path, limit=16 * 1024 * 1024)
            ready.write(json.dumps({"ready": True, "tasks": len(self.tasks)}) + "\n")
            async with server:
                await asyncio.to_thread(sys.stdin.read)  # returns at EOF


async def main() -> None:
    # stdout says ready (or why not) once; whatever the environment prints goes to stderr
    ready = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    settings: Settings = json.loads(sys.argv[1])
    await Worker(settings).serve(sys.argv[2], ready)


if __name__ == "__main__":
    asyncio.run(main())

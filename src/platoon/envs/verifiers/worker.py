"""The verifiers side of `service: verifiers://ENV_ID`: one process per env entry, under Python >= 3.12.

platoon runs on Python 3.11 and verifiers needs 3.12, so the environment lives in this process,
started by `platoon.envs.verifiers.process` with the venv's interpreter (it imports only the
standard library and verifiers, never platoon). It is started as
`python worker.py SETTINGS SOCKET`, says on stdout that it is ready (or one line saying why not),
then answers on the unix socket, one JSON request line and one JSON reply line per connection,
many connections at once:

    {"op": "tasks"}                                    -> {"tasks": [{index, task_id, prompt}]}
    {"op": "run", "index": 0, "base_url": URL,
     "api_key": KEY, "model": NAME}                    -> {"ok", "reward", "rewards", "metrics", ...}

It stops when its stdin closes.

It speaks each API generation of verifiers behind that one protocol: the classic one (0.1.8 to
0.3: a package whose module has `load_environment`, `ClassicEnv`) and v1 (0.4, and the v1
stack of 0.2-0.3: a taskset id, `V1Env`). A run is one episode of the task, its model client
pointed at `base_url` (platoon's per-episode gateway), scored by the task's rubric. The key
reaches the client through an environment variable whose name holds `API_KEY`, which verifiers'
subprocess runtime keeps from harness programs. Anything the environment prints goes to stderr;
a failure to load says the innermost error and the package it came from (`explain`).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import json
import math
import os
import sys
import sysconfig
import traceback
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, TextIO, TypedDict

if TYPE_CHECKING:
    import verifiers.v1 as vf

CLOUD_RUNTIMES = ("prime", "modal", "e2b")


class Settings(TypedDict, total=False):
    env_id: str
    harness: str | None
    env_args: dict[str, object]
    max_tasks: int | None


# --- why an environment did not load ---------------------------------------------------------


class Refused(Exception):
    """A setting the worker will not run; the message is one line that says why."""


def table(value: object) -> dict[str, object]:
    return dict(value) if isinstance(value, dict) else {}


def innermost(exc: BaseException) -> BaseException:
    """The exception at the bottom of `exc`'s chain: its cause, or the one it was raised while
    handling (even `from None`: that is what hid the real reason)."""
    seen = {id(exc)}
    while True:
        below = exc.__cause__ or exc.__context__
        if below is None or id(below) in seen:
            return exc
        seen.add(id(below))
        exc = below


def origin(exc: BaseException) -> str | None:
    """Where `exc` was raised, as `<distribution> <version> (<module file>:<line>)`: the deepest
    frame outside the standard library and verifiers itself (None when there is none)."""
    skipped = [sysconfig.get_paths()["stdlib"]]
    try:
        import verifiers

        skipped.append(os.path.dirname(verifiers.__file__ or ""))
    except ImportError:
        pass
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    frames = [f for f in frames if not any(f.filename.startswith(s + os.sep) for s in skipped if s)]
    if not frames:
        return None
    frame = frames[-1]
    relative = _on_path(frame.filename)
    if relative is None:
        return f"{frame.filename}:{frame.lineno}"
    top = relative.split(os.sep, 1)[0].removesuffix(".py")
    names = importlib.metadata.packages_distributions().get(top) or []
    where = f"{relative}:{frame.lineno}"
    for name in names:
        try:
            return f"{name} {importlib.metadata.version(name)} ({where})"
        except importlib.metadata.PackageNotFoundError:
            continue
    return where


def _on_path(filename: str) -> str | None:
    for entry in sorted((p for p in sys.path if p), key=len, reverse=True):
        root = os.path.abspath(entry) + os.sep
        if filename.startswith(root):
            return filename[len(root) :]
    return None


def explain(exc: BaseException) -> str:
    """One line saying why loading failed: a refusal as it is; otherwise the innermost error,
    where it was raised, and the verifiers version it met."""
    if isinstance(exc, Refused):
        return " ".join(str(exc).split())
    inner = innermost(exc)
    text = f"{type(inner).__name__}: {inner}"
    where = origin(inner)
    if where is not None:
        text += f" (raised in {where})"
    if inner is not exc:
        outer = " ".join(f"{type(exc).__name__}: {exc}".split())
        text += f", under: {outer[:200]}" + ("..." if len(outer) > 200 else "")
    try:
        text += f"; the venv has verifiers {importlib.metadata.version('verifiers')}"
    except importlib.metadata.PackageNotFoundError:
        text += "; the venv has no verifiers"
    return " ".join(text.split())[:1500]


# --- the classic API (verifiers 0.1.8 to 0.3) -----------------------------------------------------


class ClassicEnv:
    api = "classic"

    def __init__(self, settings: Settings) -> None:
        import verifiers as vf

        if settings.get("harness") not in (None, "null"):
            raise Refused(
                f"harness {settings['harness']!r}: a classic verifiers environment (load_environment) "
                "plays its own rollout; it takes no harness"
            )
        self.env = vf.load_environment(settings["env_id"], **table(settings.get("env_args")))
        dataset = self.env.get_dataset() if getattr(self.env, "dataset", None) is not None else None
        if dataset is None:
            dataset = self.env.get_eval_dataset()
        rows = dataset.to_list()
        max_tasks = settings.get("max_tasks")
        self.rows = rows[:max_tasks] if max_tasks is not None else rows
        self.runs = 0

    def describe(self) -> list[dict[str, object]]:
        tasks = []
        for i, row in enumerate(self.rows):
            prompt = row.get("prompt")
            system = None
            if isinstance(prompt, list):
                system = next((_text(m.get("content")) for m in prompt if m.get("role") == "system"), None)
                prompt = "\n".join(_text(m.get("content")) for m in prompt if m.get("role") == "user")
            ident = next(
                (row[k] for k in ("id", "task_id", "name") if isinstance(row.get(k), str | int)), None
            )
            tasks.append(
                {
                    "index": i,
                    "task_id": str(ident if ident is not None else i),
                    "prompt": str(prompt or row.get("question") or ""),
                    "system_prompt": system,
                }
            )
        return tasks

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        yield

    async def run(self, index: int, base_url: str, api_key: str, model: str) -> dict[str, object]:
        row = dict(self.rows[index])
        row.setdefault("example_id", index)
        self.runs += 1
        variable = f"PLATOON_EPISODE_{self.runs}_API_KEY"
        os.environ[variable] = api_key
        try:
            accepted = inspect.signature(self.env.generate).parameters
            extra = {k: v for k, v in (("use_tqdm", False), ("max_concurrent", 1)) if k in accepted}
            outputs = await self.env.generate(
                [row], client=_client(base_url, api_key, variable), model=model, sampling_args={}, **extra
            )
        finally:
            os.environ.pop(variable, None)
        return self.score(outputs)

    def score(self, outputs: Mapping[str, object]) -> dict[str, object]:
        """The rollout's grade: each reward function's value (weight 0: a metric), the rubric's sum."""
        out: dict[str, object]
        rollouts = outputs.get("outputs")
        if isinstance(rollouts, list):  # 0.2 and later: one dict per rollout
            out = dict(rollouts[0])
        else:  # 0.1: one column per field
            out = {k: v[0] for k, v in outputs.items() if isinstance(v, list) and v}
            columns, state = outputs.get("metrics"), out.get("state")
            out["metrics"] = {k: v[0] for k, v in columns.items()} if isinstance(columns, dict) else {}
            out["error"] = state.get("error") if isinstance(state, dict) else None
        reward, completion, error, metrics = (
            out.get(k) for k in ("reward", "completion", "error", "metrics")
        )
        rubric = self.env.rubric
        weights = {
            getattr(f, "__name__", str(f)): w
            for f, w in zip(rubric._get_reward_funcs(), rubric._get_reward_weights(), strict=False)
        }
        values = metrics.items() if isinstance(metrics, dict) else ()
        numbers = {k: float(v) for k, v in values if isinstance(v, int | float) and math.isfinite(v)}
        rewards = {k: v for k, v in numbers.items() if weights.get(k, 0) != 0}
        total = float(reward) if isinstance(reward, int | float) and math.isfinite(reward) else None
        ok = error is None and total is not None
        replies = (
            [m for m in completion if m.get("role") == "assistant"] if isinstance(completion, list) else []
        )
        return {
            "ok": ok,
            "reward": total if ok else 0.0,
            "rewards": rewards,
            "metrics": {k: v for k, v in numbers.items() if k not in rewards},
            "unscored": [] if ok else ["reward"],
            "errors": [] if error is None else [str(error)[:500]],
            "reply": _text(replies[-1].get("content")) if replies else str(completion or ""),
            "turns": len(replies),
        }


def _client(base_url: str, api_key: str, variable: str) -> object:
    """verifiers' client config where it has one (0.1.11 and later), else an OpenAI client."""
    try:
        from verifiers.types import ClientConfig

        fields = getattr(ClientConfig, "model_fields", {})
        if "api_base_url" in fields:
            retries = {"max_retries": 0} if "max_retries" in fields else {}
            return ClientConfig(api_base_url=base_url, api_key_var=variable, **retries)
    except ImportError:
        pass
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


# --- the v1 API (verifiers 0.4, and the v1 stack of 0.2 and 0.3) ----------------------------------


class V1Env:
    api = "v1"

    def __init__(self, settings: Settings) -> None:
        import verifiers.v1 as vf
        from verifiers.v1.configs.agent import agent_config_fields
        from verifiers.v1.utils.loaders import harness_class

        raw = table(settings.get("env_args"))
        raw["taskset"] = {**table(raw.get("taskset")), "id": settings["env_id"]}
        roles = agent_config_fields(vf.resolve_env_config(dict(raw)))
        for role in roles:
            given = table(raw.get(role))
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
                raise Refused(
                    f"role {role}: the {kind} runtime is not supported by platoon yet; use subprocess"
                )
            harness_id = agent.harness.id if agent.harness is not None else "bash"
            if harness_class(harness_id).EXECUTES_CODE:
                raise Refused(
                    f"role {role}: harness {harness_id} runs the model's commands, and the subprocess "
                    "runtime would run them on this machine unconfined; use a harness that runs none (null)"
                )
        self.env = vf.load_environment(config)
        taskset = self.env.taskset
        max_tasks = settings.get("max_tasks")
        if max_tasks is not None:
            taskset = taskset.take(max_tasks)
        elif not taskset.bounded:
            raise Refused("the taskset is infinite: give service_kwargs.max_tasks")
        self.tasks = list(taskset)
        self.runs = 0

    def describe(self) -> list[dict[str, object]]:
        return [
            {
                "index": i,
                "task_id": task.data.id or task.data.name or str(i),
                "prompt": task.data.prompt_text,
                "system_prompt": task.data.system_prompt,
            }
            for i, task in enumerate(self.tasks)
        ]

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        async with self.env.serving():
            yield

    async def run(self, index: int, base_url: str, api_key: str, model: str) -> dict[str, object]:
        import verifiers.v1 as vf

        task = self.tasks[index]
        self.runs += 1
        variable = f"PLATOON_EPISODE_{self.runs}_API_KEY"  # kept from harness programs (API_KEY)
        os.environ[variable] = api_key
        try:
            client = vf.EvalClientConfig(base_url=base_url, api_key_var=variable)
            ctx = vf.ModelContext(client=client, model=model, sampling=vf.SamplingConfig())
            episode = await self.env.run_episode(task, ctx)
        finally:
            os.environ.pop(variable, None)
        return v1_score(episode)


def v1_score(episode: vf.Episode) -> dict[str, object]:
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


# --- the server ---------------------------------------------------------------------------------


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


def load(settings: Settings) -> ClassicEnv | V1Env:
    return ClassicEnv(settings) if api_of(settings["env_id"]) == "classic" else V1Env(settings)


class Worker:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.env: ClassicEnv | V1Env | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: one request line in, one reply line out."""
        assert self.env is not None  # the socket is served once it has loaded
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

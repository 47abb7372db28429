"""`service: verifiers://ENV_ID`: a verifiers environment's tasks as an env backend.

    environments:
      - service: verifiers://my-env        # the taskset id, as `vf-eval my-env` takes it
        harness: verifiers                 # the environment's own harness plays each episode
        service_kwargs:
          packages: ["my-env==0.3"]        # pip specs installed into its venv (or paths: [./src])
          verifiers: "0.2.0"               # optional: the verifiers version (default: what my-env requires)
          harness: "null"                  # verifiers' harness id (null: plain chat)
          env_args: {taskset: {...}}       # merged into verifiers' env config

The environment runs in its own worker process under a Python >= 3.12 venv, one per (verifiers
version, packages), built once into the site cache (`platoon.envs.verifiers.venv`): by `platoon
prepare`, or by `prepare` here, which the env service awaits before it answers any request (so
no request's clock runs while a venv builds). Each episode is one verifiers
episode: its harness in its subprocess runtime, its model client pointed at the episode's own
gateway URL and key (so every call is recorded with its exact tokens and trained), scored by
the task's rubric. The `verifiers` harness hands the session that URL and key (an
`AgentProcessRequested`); the grade is the rubric's weighted sum, and each reward function's
value is a `rule/<name>` part (its metrics `metric/<name>`).

Refused in one line: cloud runtimes (prime, modal, e2b: they need an account), container
runtimes (not supported yet), harnesses that run the model's commands (the subprocess runtime
would run them unconfined on this machine), an infinite taskset without `max_tasks`, and any
harness but `verifiers` playing the task (its rubric scores verifiers' own trace).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import anyio
import msgspec
import structlog

from platoon.bus.events import AgentProcessExited, AgentProcessRequested, ToolSpec
from platoon.config import load_site
from platoon.envs.service import EnvError, Grade, TaskInfo, ToolError, ToolResult
from platoon.harness.toolchain import build_toolchain, toolchain_dir

from .process import EpisodeResult, WorkerProcess, WorkerTasks
from .venv import ToolchainError, resolve_version, venv_toolchain

__all__ = ["SPLITS", "VerifiersBackend", "VerifiersSession"]

SPLITS = ("train", "test")  # verifiers tasksets have no splits: both are the whole taskset
_CLOUD = ("prime", "modal", "e2b")
_CONTAINERS = ("docker", "podman", "apptainer")
_MODEL = "platoon-policy"  # a name every gateway serves

log = structlog.get_logger("platoon.envs.verifiers")


class VerifiersBackend:
    """The env backend of `service: verifiers://ENV_ID` (see the module docstring).

    `packages` are pip specs installed into the venv with verifiers; `paths` are folders put on
    the worker's import path instead (an environment being written); `verifiers` names the
    verifiers version (default: the newest the packages' metadata allows); `harness` is verifiers'
    harness id for every role; `runtime` must be `subprocess`; `env_args` are merged into
    verifiers' env config; `max_tasks` bounds an infinite taskset; `cache` and `pythons`
    default to the site profile's.
    """

    def __init__(
        self,
        env_id: str,
        *,
        packages: Sequence[str] = (),
        paths: Sequence[str | os.PathLike[str]] = (),
        harness: str = "null",
        runtime: str = "subprocess",
        verifiers: str | None = None,
        env_args: Mapping[str, object] | None = None,
        max_tasks: int | None = None,
        cache: str | os.PathLike[str] | None = None,
        pythons: Sequence[str] = (),
    ) -> None:
        if not env_id:
            raise EnvError("service verifiers:// needs an environment id: verifiers://ENV_ID")
        if runtime in _CLOUD:
            raise EnvError(
                f"verifiers runtime {runtime!r} runs in a cloud that needs an account; "
                "platoon runs verifiers environments in the subprocess runtime"
            )
        if runtime != "subprocess":
            what = "is not supported by platoon yet" if runtime in _CONTAINERS else "is unknown"
            raise EnvError(f"verifiers runtime {runtime!r} {what}; use subprocess")
        if max_tasks is not None and max_tasks < 1:
            raise EnvError(f"max_tasks must be at least 1, got {max_tasks}")
        site = load_site() if cache is None or not pythons else None
        self.cache = os.fspath(cache if cache is not None else site.cache)  # type: ignore[union-attr]
        self.pythons = [os.fspath(p) for p in (pythons or (site.pythons if site else []))]
        self.packages = list(packages)
        self.paths = [os.fspath(p) for p in paths]
        self.version = verifiers
        self.settings = {
            "env_id": env_id,
            "harness": harness,
            "env_args": dict(env_args or {}),
            "max_tasks": max_tasks,
        }
        self._worker: WorkerProcess | None = None
        self._failure: str | None = None
        self._starting = anyio.Lock()
        self._tasks: list[TaskInfo] | None = None

    async def prepare(self) -> None:
        """Build the venv (saying so, the first time) and start the worker, before any request."""
        await self.worker()

    async def worker(self) -> WorkerProcess:
        """The running worker, started (and its venv built) on first use."""
        async with self._starting:
            if self._failure is not None:
                raise EnvError(self._failure)  # said once, not rebuilt for every request
            if self._worker is None:
                env_id = self.settings["env_id"]
                try:
                    version = await resolve_version(
                        self.packages, self.cache, self.pythons, named=self.version, paths=self.paths
                    )
                    toolchain = venv_toolchain(self.packages, version)
                    if not (toolchain_dir(toolchain, self.cache) / "bin" / "python").exists():
                        log.info(
                            "building the verifiers venv before listing the tasks (once; `platoon prepare "
                            "CONFIG` builds it ahead)",
                            env=env_id,
                            pins=", ".join(toolchain.pip),
                        )
                    venv = await build_toolchain(toolchain, self.cache, self.pythons)
                except ToolchainError as exc:
                    self._failure = f"verifiers environment {env_id}: the venv could not be built: {exc}"
                    raise EnvError(self._failure) from None
                worker = WorkerProcess(Path(venv), self.settings, self.paths)
                try:
                    await worker.start()
                except EnvError as exc:
                    self._failure = str(exc)
                    raise
                self._worker = worker
            return self._worker

    async def list_splits(self) -> list[str]:
        return list(SPLITS)

    async def list_tasks(self, split: str) -> list[TaskInfo]:
        if split not in SPLITS:
            raise EnvError(f"unknown split {split!r}; splits are train and test (the same tasks)")
        if self._tasks is None:
            reply = await (await self.worker()).request(WorkerTasks, "tasks")
            self._tasks = [
                TaskInfo(split="train", task_id=t.task_id, index=t.index, spec=msgspec.structs.asdict(t))
                for t in reply.tasks
            ]
        return [TaskInfo(split=split, task_id=t.task_id, index=t.index, spec=t.spec) for t in self._tasks]

    async def open(self, task: TaskInfo, secrets: Mapping[str, str]) -> VerifiersSession:
        """A session of the task; its episode runs when the `verifiers` harness asks. Secrets are
        not handed to the environment."""
        worker = await self.worker()
        return VerifiersSession(worker, task)

    async def aclose(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            await worker.aclose()


class VerifiersSession:
    """One task of a verifiers environment: its episode is run by `run_agent` (the `verifiers`
    harness's request) and graded by the rubric's result."""

    tools: list[ToolSpec]

    def __init__(self, worker: WorkerProcess, task: TaskInfo) -> None:
        self.worker = worker
        self.task = task
        self.instruction = str(task.spec.get("prompt") or "")
        self.tools = []
        self.result: EpisodeResult | None = None
        self.failure: str | None = None

    async def run_agent(self, req: AgentProcessRequested) -> AgentProcessExited:
        """Run the task's verifiers episode with its model client on the request's gateway URL
        and key (`OPENAI_BASE_URL`, `OPENAI_API_KEY` of the payload's `env`)."""
        if self.result is not None or self.failure is not None:
            return AgentProcessExited(reply_to=req.request_id, error="this task's episode has already run")
        try:
            env = json.loads(req.payload).get("env", {})
            base_url, api_key = str(env["OPENAI_BASE_URL"]), str(env["OPENAI_API_KEY"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return AgentProcessExited(reply_to=req.request_id, error=f"a malformed agent request: {exc}")
        try:
            with anyio.fail_after(req.timeout):
                result = await self.worker.request(
                    EpisodeResult,
                    "run",
                    index=self.task.index,
                    base_url=base_url,
                    api_key=api_key,
                    model=_MODEL,
                )
        except TimeoutError:
            self.failure = f"the verifiers episode passed its {req.timeout:g} s timeout"
            return AgentProcessExited(reply_to=req.request_id, timed_out=True, error=self.failure)
        except EnvError as exc:
            self.failure = f"the verifiers episode failed: {exc}"
            return AgentProcessExited(reply_to=req.request_id, error=self.failure)
        self.result = result
        return AgentProcessExited(
            reply_to=req.request_id,
            return_code=0 if result.ok else 1,
            stdout=result.reply,
            stderr="; ".join(result.errors),
        )

    async def call_tool(self, name: str, arguments: dict[str, object]) -> ToolResult:
        raise ToolError(f"a verifiers task has no platoon tools (asked for {name!r})")

    async def grade(self) -> Grade:
        if self.result is None:
            reason = self.failure or (
                "the verifiers episode did not run: a verifiers environment is played by its own "
                "harness (harness: verifiers)"
            )
            return Grade(reward=None, reason=reason)
        result = self.result
        rewards = {f"rule/{name}": value for name, value in result.rewards.items()}
        rewards |= {f"metric/{name}": value for name, value in result.metrics.items()}
        if not result.ok:
            why = "; ".join(result.errors) or f"unscored: {', '.join(result.unscored)}"
            return Grade(reward=None, rewards=rewards, reason=f"the verifiers episode failed: {why}")
        return Grade(reward=result.reward, rewards=rewards)

    async def fork(self, mode: Literal["fresh", "copy"]) -> VerifiersSession:
        if mode == "fresh":
            return VerifiersSession(self.worker, self.task)
        raise EnvError("a verifiers session cannot be copied")

    async def close(self) -> None:
        return None

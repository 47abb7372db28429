"""The worker's adapter for verifiers' v1 API (`import verifiers.v1 as vf`: 0.4, and the v1 stack
of 0.2-0.3): a taskset id loaded as an `Env` whose own harness plays each episode in verifiers'
subprocess runtime. Imported only by `worker.py`, in the worker's venv, never by platoon."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import AsyncIterator
from typing import Any

from worker_errors import CLOUD_RUNTIMES, Refused, table


class V1Env:
    api = "v1"

    def __init__(self, settings: dict[str, Any]) -> None:
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
        return score(episode)


def score(episode: Any) -> dict[str, object]:
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

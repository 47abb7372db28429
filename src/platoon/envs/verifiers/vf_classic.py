"""The worker's adapter for verifiers' classic API (`import verifiers as vf`, 0.1.8 to 0.3: a
package's `load_environment(**env_args)` returns a `vf.Environment` with a dataset and a rubric).
One episode is one rollout of one dataset row through `env.generate`, its model client pointed at
platoon's per-episode gateway URL; its score is the rubric's. Imported only by `worker.py`, in the
worker's venv, never by platoon."""

from __future__ import annotations

import contextlib
import inspect
import math
import os
from collections.abc import AsyncIterator
from typing import Any

from worker_errors import Refused, table


class ClassicEnv:
    api = "classic"

    def __init__(self, settings: dict[str, Any]) -> None:
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

    def score(self, outputs: Any) -> dict[str, object]:
        """The rollout's grade: each reward function's value (weight 0: a metric), the rubric's sum."""
        if "outputs" in outputs:  # 0.2 and later: one dict per rollout
            [out] = outputs["outputs"]
            reward, metrics, completion = (
                out.get("reward"),
                dict(out.get("metrics") or {}),
                out.get("completion"),
            )
            error = out.get("error")
        else:  # 0.1: columns
            reward, completion = outputs["reward"][0], outputs["completion"][0]
            metrics = {k: v[0] for k, v in (outputs.get("metrics") or {}).items()}
            error = (outputs.get("state") or [{}])[0].get("error")
        rubric = self.env.rubric
        weights = {
            getattr(f, "__name__", str(f)): w
            for f, w in zip(rubric._get_reward_funcs(), rubric._get_reward_weights(), strict=False)
        }
        numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
        rewards = {k: v for k, v in numbers.items() if weights.get(k, 0) != 0}
        rest = {k: v for k, v in numbers.items() if k not in rewards}
        ok = error is None and isinstance(reward, int | float) and math.isfinite(reward)
        replies = (
            [m for m in completion if m.get("role") == "assistant"] if isinstance(completion, list) else []
        )
        return {
            "ok": ok,
            "reward": float(reward) if ok else 0.0,
            "rewards": rewards,
            "metrics": rest,
            "unscored": [] if ok else ["reward"],
            "errors": [] if error is None else [str(error)[:500]],
            "reply": _text(replies[-1].get("content")) if replies else str(completion or ""),
            "turns": len(replies),
        }


def _client(base_url: str, api_key: str, variable: str) -> Any:
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


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)

"""Rewards beyond the environment's grade: reward rules and judges.

`build_reward_rules(entries, ...)` turns each environment entry's `reward:` and `judge:` into a
`RewardRules` for the grader. An entry with a `judge:` and no `reward:` is graded by its judge
alone; with both, `judge` rules that name no judge of their own use the entry's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING

from platoon.config.schema import EnvironmentConfig, JudgeConfig, RewardConfig, RewardRule
from platoon.models.loading import builtin_model_dir, load_tokenizer, make_renderer, resolve_model
from platoon.rewards.episode import Episode, EpisodeRecorder, Reply, ToolUse
from platoon.rewards.judge import (
    Judge,
    JudgeError,
    JudgeModel,
    JudgeReply,
    JudgeResult,
    OpenAIJudgeModel,
    SamplerJudgeModel,
    parse_score,
    render_rubric,
)
from platoon.rewards.rules import RewardOutcome, RewardRules, RuleError, rule_names
from platoon.serving import published_key_for

if TYPE_CHECKING:
    import tinker

    from platoon.policy.tinker import TinkerSampler

__all__ = [
    "Episode",
    "EpisodeRecorder",
    "Judge",
    "JudgeError",
    "JudgeModel",
    "JudgeReply",
    "JudgeResult",
    "OpenAIJudgeModel",
    "Reply",
    "RewardOutcome",
    "RewardRules",
    "RuleError",
    "SamplerJudgeModel",
    "ToolUse",
    "build_judge",
    "build_reward_rules",
    "parse_score",
    "render_rubric",
    "rule_names",
]


def build_reward_rules(
    entries: Mapping[str, EnvironmentConfig],
    *,
    tinker_base_url: str | None = None,
    tinker_api_key: str | None = None,
    model_name: str | None = None,
    renderer_name: str | None = None,
    judge_model: Callable[[JudgeConfig], JudgeModel] | None = None,
) -> dict[str, RewardRules]:
    """Each entry's rules, by entry name (entries with neither `reward:` nor `judge:` have none).

    `tinker_base_url`, `model_name` and `renderer_name` are the run's training service, base
    model and renderer, which a `tinker` judge uses where its config names none (with
    `tinker_api_key`, the key of the run's own service, sent only to that service). `judge_model`
    replaces how a judge's model is made (tests pass scripted ones)."""
    make = judge_model or (
        lambda cfg: _judge_model(cfg, tinker_base_url, tinker_api_key, model_name, renderer_name)
    )
    out: dict[str, RewardRules] = {}
    for name, entry in entries.items():
        if entry.reward is None and entry.judge is None:
            continue
        entry_judge = build_judge(entry.judge, make) if entry.judge is not None else None
        reward = entry.reward or RewardConfig(rules=[RewardRule(rule="judge")])
        judges = {
            i: build_judge(rule.judge, make) for i, rule in enumerate(reward.rules) if rule.judge is not None
        }
        try:
            out[name] = RewardRules(reward, judges=judges, entry_judge=entry_judge)
        except RuleError as exc:
            raise RuleError(f"environment {name!r}: {exc}") from None
    return out


def build_judge(cfg: JudgeConfig, make: Callable[[JudgeConfig], JudgeModel]) -> Judge:
    rubric = cfg.rubric
    if cfg.rubric_file is not None:
        with open(cfg.rubric_file, encoding="utf-8") as f:
            rubric = f.read()
    return Judge(cfg, make(cfg), rubric=rubric)


def _judge_model(
    cfg: JudgeConfig,
    tinker_base_url: str | None,
    tinker_api_key: str | None,
    model_name: str | None,
    renderer_name: str | None,
) -> JudgeModel:
    api_key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
    if cfg.api_key_env and api_key is None:
        raise RuleError(f"the judge's key variable {cfg.api_key_env} is not set")
    if cfg.backend == "openai":
        if not cfg.base_url or not cfg.model:
            raise RuleError("an openai judge needs base_url (the endpoint's /v1 root) and model")
        return OpenAIJudgeModel(cfg.base_url, cfg.model, api_key=api_key, timeout=cfg.timeout)

    model = cfg.model or model_name
    renderer_name = cfg.renderer_name or renderer_name
    if model is None or renderer_name is None:
        raise RuleError(
            "a tinker judge needs model and renderer_name (or a train: section to take them from)"
        )
    if builtin_model_dir(model) is not None:
        model = resolve_model(model)
    tokenizer = load_tokenizer(model)
    renderer, _ = make_renderer(renderer_name, tokenizer)
    base_url = cfg.base_url or tinker_base_url
    model_path = cfg.model_path

    services: list[tinker.ServiceClient] = []

    async def sampler() -> TinkerSampler:
        import tinker

        from platoon.policy.tinker import (  # the tinker extra, and it imports torch: only a tinker judge loads it
            TinkerSampler,
            sampling_client,
        )

        own = tinker_api_key if base_url == tinker_base_url else None  # the run's key, to its service only
        key = api_key or own or published_key_for(base_url) or os.environ.get("TINKER_API_KEY") or "tml-local"
        services.append(tinker.ServiceClient(base_url=base_url, api_key=key))
        kwargs = {"model_path": model_path} if model_path else {"base_model": model}
        return TinkerSampler(await sampling_client(services[0], **kwargs))

    async def close() -> None:
        import anyio

        for service in services:
            with anyio.move_on_after(10):
                try:
                    await anyio.to_thread.run_sync(partial(_close_service, service))
                except Exception:  # the service may be gone already; nothing is lost
                    pass

    return SamplerJudgeModel(sampler, renderer, name=f"tinker:{base_url}:{model_path or model}", close=close)


def _close_service(service: tinker.ServiceClient) -> None:
    service.close("success").result(timeout=10)

"""Building the components a run's settings name: env services, gateways, the grader, and what
lock.json and the worker handshake record of the opened policies.
"""

from __future__ import annotations

from pathlib import Path

import structlog

from platoon.assembly.policies import OpenPolicy
from platoon.assembly.settings import (
    GatewaySettings,
    Settings,
)
from platoon.bus.events import (
    PolicyUpdated,
)
from platoon.config import Config, entry_names
from platoon.envs import build_env_service
from platoon.envs.service import EnvService
from platoon.gateway import Gateway, GatewayPolicy
from platoon.gateway.renderers import Renderer
from platoon.models.loading import TOY_TOKENIZER, model_window, tokenizer_identity
from platoon.policy.base import SampleParams, SamplerFactory
from platoon.programs import Grader
from platoon.rewards import build_reward_rules
from platoon.train.distributed import parsers_identity

log = structlog.get_logger("platoon.assembly")


def _env_services(config: Config, run_dir: Path | None = None) -> list[EnvService]:
    """One env service per environment entry. A Harbor entry's artifacts go to the run's folder
    (`<run dir>/artifacts/<entry>`) unless it names its own `artifacts_dir`."""
    services = []
    for name, entry in zip(entry_names(config), config.environments, strict=True):
        kwargs = dict(entry.service_kwargs)
        if entry.service == "harbor" and run_dir is not None:
            kwargs.setdefault("artifacts_dir", str(run_dir / "artifacts" / name))
        services.append(build_env_service(name, entry.service, entry.env, kwargs))
    return services


def _tokenizer_lock(policy: OpenPolicy) -> dict[str, str]:
    """The policy's tokenizer as lock.json records it: the name the config gave it and the
    fingerprint of its vocabulary (see `tokenizer_identity`)."""
    p = policy.settings
    scripted = TOY_TOKENIZER if p.scripted else None  # a scripted policy's fallback, named
    return tokenizer_identity(policy.tokenizer, p.tokenizer or p.model_name or scripted)


def _policy_lock(opened: dict[str, OpenPolicy]) -> dict[str, object]:
    """What lock.json records of a run's several policies (the first's as the run's own)."""
    first = next(iter(opened.values()))
    return {
        "renderer": first.settings.renderer_name,
        "tool_call_parser": first.tool_call_parser,
        "tokenizer": _tokenizer_lock(first),
        "policies": {
            name: {
                "renderer": p.settings.renderer_name,
                "tool_call_parser": p.tool_call_parser,
                "tokenizer": _tokenizer_lock(p),
            }
            for name, p in opened.items()
        },
    }


def _parsers_identity(opened: dict[str, OpenPolicy]) -> dict[str, str]:
    return parsers_identity({name: p.tool_call_parser for name, p in opened.items()})


def _announced(policy: OpenPolicy) -> PolicyUpdated:
    """What the trainer announces of a policy at the start: the weights it resumed from (a
    trained one), or those it samples all run long (a frozen one)."""
    p = policy.settings
    if p.trainer is not None:
        assert policy.trainer is not None
        version, path, model = policy.trainer.version, policy.start_path or "", p.model_name
    else:
        version, path = 0, p.model_path or ""
        model = p.local_model() if p.backend == "local" else p.model_name
    return PolicyUpdated(
        version=version, sampler_path=path, base_model=model or "", base_url=policy.base_url, policy=p.name
    )


def _policies_gateway(
    g: GatewaySettings, opened: dict[str, OpenPolicy], factories: dict[str, SamplerFactory]
) -> Gateway:
    """The gateway of a run with several policies (RFC 0001): it serves each of them, the
    first as its own."""
    first, *others = opened
    served = {
        name: GatewayPolicy(
            opened[name].renderer,
            factories[name],
            frozen=opened[name].settings.frozen,
            model_name=opened[name].settings.model_name,
        )
        for name in others
    }
    return _gateway(g, opened[first].renderer, factories[first], policy=first, policies=served)


def _gateway(
    g: GatewaySettings,
    renderer: Renderer,
    factory: SamplerFactory,
    *,
    policy: str = "default",
    policies: dict[str, GatewayPolicy] | None = None,
) -> Gateway:

    return Gateway(
        renderer=renderer,
        sampler_factory=factory,
        defaults=SampleParams(),
        # Unset, the model's own: a prompt past it is refused before it is tokenized whole.
        context_window=g.context_window or model_window(renderer.tokenizer),
        max_concurrent_samples=g.max_concurrent_samples,
        host=g.host,
        port=g.port,
        model_name=g.model_name,
        model_aliases=list(g.model_aliases),
        constraint_tries=g.constraint_tries,
        policy=policy,
        policies=policies,
    )


def _grader(
    config: Config,
    settings: Settings,
    *,
    tinker_base_url: str | None = None,
    tinker_api_key: str | None = None,
    model_name: str | None = None,
) -> Grader:
    """Each entry's reward processor, reward rules and judges; a `tinker` judge that names no
    service, model or renderer uses the run's (`tinker_base_url`, `model_name`: the service and
    base model as the run opened them; `tinker_api_key`: the key of its own embedded service)."""
    train = config.train
    rules = build_reward_rules(
        dict(zip(entry_names(config), config.environments, strict=True)),
        tinker_base_url=tinker_base_url or config.tinker_base_url,
        tinker_api_key=tinker_api_key if tinker_base_url else None,
        model_name=model_name or (train.model_name if train else None),
        renderer_name=train.renderer_name if train else None,
    )
    return Grader(reward_processors=settings.reward_processors, rules=rules)

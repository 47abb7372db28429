"""Building the components a run's settings name: env services, gateways, the grader, and what
lock.json and the worker handshake record of the opened policies.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import msgspec
import structlog

from platoon.assembly.policies import OpenPolicy
from platoon.assembly.settings import Settings
from platoon.bus.events import (
    PolicyUpdated,
)
from platoon.config import Config, entry_names
from platoon.envs import build_env_service
from platoon.envs.service import EnvService
from platoon.gateway import Gateway, GatewayPolicy, GatewaySettings
from platoon.models.loading import TOY_TOKENIZER, model_window, tokenizer_identity
from platoon.policy.base import SampleParams, SamplerFactory
from platoon.programs import Grader
from platoon.rewards import build_reward_rules
from platoon.train.distributed import parsers_identity

log = structlog.get_logger("platoon.assembly")


def env_services(config: Config, run_dir: Path | None = None) -> list[EnvService]:
    """One env service per environment entry. A Harbor entry's artifacts go to the run's folder
    (`<run dir>/artifacts/<entry>`) unless it names its own `artifacts_dir`."""
    services = []
    for name, entry in zip(entry_names(config), config.environments, strict=True):
        kwargs = dict(entry.service_kwargs)
        if entry.service == "harbor" and run_dir is not None:
            kwargs.setdefault("artifacts_dir", str(run_dir / "artifacts" / name))
        services.append(build_env_service(name, entry.service, entry.env, kwargs))
    return services


def tokenizer_lock(policy: OpenPolicy) -> dict[str, str]:
    """The policy's tokenizer as lock.json records it: the name the config gave it and the
    fingerprint of its vocabulary (see `tokenizer_identity`)."""
    p = policy.settings
    scripted = TOY_TOKENIZER if p.scripted else None  # a scripted policy's fallback, named
    return tokenizer_identity(policy.tokenizer, p.tokenizer or p.model_name or scripted)


def policies_lock(opened: Mapping[str, OpenPolicy]) -> dict[str, object]:
    """What lock.json records of a run's policies: the first's as the run's own, and each one's
    by name when the config names them (`policies:`)."""
    first = next(iter(opened.values()))

    def lock(p: OpenPolicy) -> dict[str, object]:
        return {
            "renderer": p.settings.renderer_name,
            "tool_call_parser": p.tool_call_parser,
            "tokenizer": tokenizer_lock(p),
        }

    named = {name: lock(p) for name, p in opened.items() if p.settings.prefix}
    return {**lock(first), **({"policies": named} if named else {})}


def parsers_identity_of(opened: Mapping[str, OpenPolicy]) -> dict[str, str]:
    return parsers_identity({name: p.tool_call_parser for name, p in opened.items()})


def announced(policy: OpenPolicy) -> PolicyUpdated:
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


def gateway(
    settings: GatewaySettings, opened: Mapping[str, OpenPolicy], factories: Mapping[str, SamplerFactory]
) -> Gateway:
    """The gateway of a run: it serves each of the run's policies (the first under the gateway's
    model name, each other also under its own), sampled through `factories`."""
    first = next(iter(opened))
    served = {
        name: GatewayPolicy(
            p.renderer,
            factories[name],
            frozen=p.settings.frozen,
            model_name=None if name == first else p.settings.model_name,
        )
        for name, p in opened.items()
    }
    return gateway_of(settings, served)


def gateway_of(settings: GatewaySettings, served: Mapping[str, GatewayPolicy]) -> Gateway:
    """A gateway over `served`, its context window unset taken from the first policy's model: a
    prompt past it is refused before it is tokenized whole."""
    window = settings.context_window or model_window(next(iter(served.values())).renderer.tokenizer)
    return Gateway(served, msgspec.structs.replace(settings, context_window=window), defaults=SampleParams())


def grader(
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

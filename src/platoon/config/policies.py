"""The run's policies, resolved, and which one plays an agent (RFC 0001, part 2).

A config without `policies:` has one policy, "default", which is `train:` itself; every
existing config resolves to exactly that. With `policies:`, each entry is `train:` with the
keys it sets laid over it, so a policy states only how it differs.
"""

from __future__ import annotations

import msgspec

from .schema import Config, PolicyChoice, TrainConfig

__all__ = ["DEFAULT_POLICY", "PolicyChoiceError", "PolicySpec", "choose_policy", "resolve_policies"]

DEFAULT_POLICY = "default"
ROOT_ROLE = "root"  # the role of an episode's first agent, unless its program names another

# Keys of a PolicyConfig that are TrainConfig keys of the same meaning.
_TRAIN_KEYS = (
    "model_name",
    "renderer_name",
    "tokenizer",
    "tool_call_parser",
    "backend",
    "lora_rank",
    "optimizer",
    "loss_fn",
    "loss_fn_config",
    "kl",
    "distill",
    "correction",
)


class PolicySpec(msgspec.Struct, frozen=True, kw_only=True):
    """One policy as the run builds it: its `train:` settings with its own laid over them."""

    name: str
    train: TrainConfig  # model, renderer, optimizer, LoRA rank, loss, backend of this policy
    frozen: bool = False  # samples only
    tinker_base_url: str | None = None  # its Tinker-API server; None: $TINKER_BASE_URL or hosted
    model_path: str | None = None  # the sampler weights a frozen policy (or an evaluation) samples
    load_path: str | None = None  # the training state a trained policy starts from


class PolicyChoiceError(ValueError):
    """An agent that no policy of the config is chosen for."""


def resolve_policies(config: Config) -> dict[str, PolicySpec]:
    """Every policy of the run by name, in config order (empty without `train:`)."""
    if config.train is None:
        return {}
    if not config.policies:
        return {
            DEFAULT_POLICY: PolicySpec(
                name=DEFAULT_POLICY,
                train=config.train,
                tinker_base_url=config.tinker_base_url,
                model_path=config.eval.model_path if config.eval else None,
                load_path=config.checkpoint.load_path,
            )
        }
    specs = {}
    for name, policy in config.policies.items():
        changes = {key: getattr(policy, key) for key in _TRAIN_KEYS if getattr(policy, key) is not None}
        specs[name] = PolicySpec(
            name=name,
            train=msgspec.structs.replace(config.train, **changes),
            frozen=policy.frozen,
            tinker_base_url=policy.tinker_base_url or config.tinker_base_url,
            model_path=policy.model_path,
            load_path=policy.load_path,
        )
    return specs


def choose_policy(
    choice: PolicyChoice | None,
    *,
    depth: int,
    harness: str,
    role: str | None,
    default: str = DEFAULT_POLICY,
) -> str:
    """The policy that plays an agent. Without a choice, `default` (the run's one policy).

    A role comes from a program or an environment, which choose only among the config's
    policies: a key the map does not hold is refused, never mapped to some other policy.
    """
    if choice is None:
        return default
    key = {"depth": str(depth), "harness": harness, "role": role or ROOT_ROLE}[choice.by]
    policy = choice.map.get(key)
    if policy is None:
        raise PolicyChoiceError(
            f"no policy for the agent with {choice.by} {key!r}: agents.policy.map names "
            f"{', '.join(repr(k) for k in choice.map)}"
        )
    return policy

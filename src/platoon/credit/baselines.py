"""Group baselines: how far each rollout's reward is from what its task group expected.

A credit rule maps the rewards of one pool (the rollouts of one task, or the subagents at
one depth of it) to advantages, one per reward. Rules live in a registry so a config can
name one and a plugin can add its own with `@register_credit_rule("name")`; a config may also
name a function by `module:attr`.
"""

import math
from collections.abc import Callable, Sequence

from platoon.credit.exceptions import CreditError
from platoon.naming import unknown_name
from platoon.plugins import PluginError, import_ref

CreditRule = Callable[[Sequence[float]], list[float]]

_RULES: dict[str, CreditRule] = {}


def register_credit_rule(name: str) -> Callable[[CreditRule], CreditRule]:
    """Register `fn(rewards) -> advantages` under `name` so configs can select it."""

    def register(fn: CreditRule) -> CreditRule:
        existing = _RULES.get(name)
        if existing is not None and existing is not fn:
            raise CreditError(f"credit rule {name!r} is already registered")
        _RULES[name] = fn
        return fn

    return register


def get_credit_rule(name: str) -> CreditRule:
    """The rule registered under `name`, or the function `module:attr` names."""
    if name in _RULES:
        return _RULES[name]
    if ":" in name:
        try:
            rule = import_ref(name)
        except PluginError as exc:
            raise CreditError(f"credit rule {name!r}: {exc}") from None
        if not callable(rule):
            raise CreditError(f"credit rule {name!r} is {rule!r}, not a function rewards -> advantages")
        return rule
    raise CreditError(unknown_name("credit rule", name, _RULES))


@register_credit_rule("mean")
def mean_baseline(rewards: Sequence[float]) -> list[float]:
    """r_i - mean(r): the group's average is what was expected."""
    if not rewards:
        return []
    mean = math.fsum(rewards) / len(rewards)
    return [r - mean for r in rewards]


@register_credit_rule("leave_one_out")
def leave_one_out_baseline(rewards: Sequence[float]) -> list[float]:
    """r_i - mean_{j != i}(r_j): unbiased, as r_i does not judge itself. A singleton gets 0."""
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    total = math.fsum(rewards)
    return [r - (total - r) / (n - 1) for r in rewards]


def group_advantages(
    rewards: Sequence[float], rule: CreditRule, *, std_scaling: bool = False, eps: float = 1e-6
) -> list[float]:
    """Apply `rule` to one pool of rewards, optionally dividing by the pool's std + eps.

    The std is the population std of the rewards (as GRPO does), so a pool whose rewards
    are all equal keeps advantages near 0 instead of blowing up.
    """
    advantages = [float(a) for a in rule(rewards)]
    if len(advantages) != len(rewards):
        raise CreditError(f"credit rule returned {len(advantages)} advantages for {len(rewards)} rewards")
    if not all(math.isfinite(a) for a in advantages):
        raise CreditError(f"credit rule returned a non-finite advantage: {advantages}")
    if std_scaling and rewards:
        mean = math.fsum(rewards) / len(rewards)
        std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / len(rewards))
        advantages = [a / (std + eps) for a in advantages]
    return advantages

"""Per-turn credit: each model call answers to the rewards that came after it.

A root agent's turn `k` is its k-th trainable model call; its turn reward `r_k` is the sum of the
rewards that arrived with tool results after that call and before the next (`AgentTrace.
turn_rewards`). Whatever of the episode's reward the turn rewards do not account for (a final
grade, reward rules, a judge) is added to the last turn, so the undiscounted return of the first
turn is always the episode's reward. The return of turn k is

    G_k = r_k + discount * G_{k+1}

and its advantage is taken against the other rollouts of the task group at the same turn: the
group's returns at turn k form one pool for the credit rule (`mean`, `leave_one_out`, optional
std scaling), so a turn is compared with what the group earned from that point on.

Subagents keep outcome credit (`trees`): their calls answer to the episode, or their own grade.
"""

from collections import defaultdict
from collections.abc import Sequence

from platoon.credit.baselines import CreditRule, group_advantages
from platoon.credit.traces import AgentTrace, Rollout

__all__ = ["turn_advantages", "turn_returns"]


def _root(rollout: Rollout) -> AgentTrace | None:
    return next((a for a in rollout.agents if a.parent_id is None), None)


def turn_returns(rollout: Rollout, discount: float = 1.0) -> list[float]:
    """The return of each trainable call of the rollout's root agent (empty without calls)."""
    root = _root(rollout)
    if root is None:
        return []
    n = sum(call.kind != "judge" for call in root.calls)
    if n == 0:
        return []
    rewards = [float(r) for r in root.turn_rewards[:n]] + [0.0] * max(0, n - len(root.turn_rewards))
    rewards[-1] += rollout.reward - sum(rewards)
    returns = [0.0] * n
    following = 0.0
    for k in range(n - 1, -1, -1):
        following = rewards[k] + discount * following
        returns[k] = following
    return returns


def turn_advantages(
    rollouts: Sequence[Rollout],
    rule: CreditRule,
    *,
    discount: float = 1.0,
    std_scaling: bool = False,
    eps: float = 1e-6,
) -> tuple[list[list[float]], bool]:
    """Each rollout's root-call advantages, and whether any turn's pool tells rollouts apart."""
    returns = [turn_returns(rollout, discount) for rollout in rollouts]
    pools: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for i, values in enumerate(returns):
        for k, value in enumerate(values):
            pools[k].append((i, value))
    advantages = [[0.0] * len(values) for values in returns]
    varied = False
    for k, pool in pools.items():
        values = [value for _, value in pool]
        varied = varied or len(set(values)) > 1
        for (i, _), advantage in zip(
            pool, group_advantages(values, rule, std_scaling=std_scaling, eps=eps), strict=True
        ):
            advantages[i][k] = advantage
    return advantages, varied

"""Credit for agent trees: which reward a subagent answers to, and how much each depth weighs.

These are the options the Recursive Agent Optimization paper ablates, each a plain config
value:

- `subagent_reward`: `root` (every agent takes the episode's reward), `own` (a subagent
  takes its own grade, the episode's reward where it has none) or `mix`.
- `depth_weighting`: `none`, `inverse_count` (each depth weighs 1/number of its agents) or
  `discount` (gamma ** depth), renormalised so the token-weighted mean weight is 1.

Baselines. A root agent's advantage is always its rollout's advantage within the task
group. A subagent's advantage is taken against the group baseline *of the same reward
mode*: under `root` that is the rollout's advantage again; under `own` the subagent is
compared with the group's other subagents at the same depth (same rule, same std
scaling). Own grades score subtasks, which are usually easier than the task, so centring
them on the roots' mean (as the predecessor did) would push every subagent's advantage up
or down by the difficulty gap; agents at one depth of one task face comparable subtasks.
`mix` blends the two advantages, alpha * A_own + (1 - alpha) * A_root, which is the mixed
reward minus the mixed baseline and meets `root` at alpha = 0 and `own` at alpha = 1.
"""

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Literal

from platoon.credit.baselines import CreditRule, group_advantages
from platoon.credit.exceptions import CreditError
from platoon.credit.traces import AgentTrace, Rollout

RewardMode = Literal["root", "own", "mix"]
DepthWeighting = Literal["none", "inverse_count", "discount"]


def check_tree(rollout: Rollout) -> None:
    """Raise CreditError unless the rollout's agents form a well-formed tree with finite rewards."""
    where = f"episode {rollout.episode_id!r}"
    if not math.isfinite(rollout.reward):
        raise CreditError(f"{where} has a non-finite reward {rollout.reward}")
    by_id: dict[str, AgentTrace] = {}
    for agent in rollout.agents:
        if agent.agent_id in by_id:
            raise CreditError(f"{where} has two agents with id {agent.agent_id!r}")
        by_id[agent.agent_id] = agent
        if agent.reward is not None and not math.isfinite(agent.reward):
            raise CreditError(f"{where}: agent {agent.agent_id!r} has a non-finite reward {agent.reward}")
    for agent in rollout.agents:
        if agent.parent_id is None:
            expected = 0
        elif agent.parent_id in by_id:
            expected = by_id[agent.parent_id].depth + 1
        else:
            raise CreditError(f"{where}: agent {agent.agent_id!r} has unknown parent {agent.parent_id!r}")
        if agent.depth != expected:
            raise CreditError(
                f"{where}: agent {agent.agent_id!r} has depth {agent.depth}, expected {expected}"
            )


def own_reward(rollout: Rollout, agent: AgentTrace) -> float:
    """The agent's own grade; the episode's reward for a root or an ungraded agent."""
    if agent.parent_id is None or agent.reward is None:
        return rollout.reward
    return agent.reward


def _uses_own(mode: RewardMode, alpha: float) -> bool:
    return mode == "own" or (mode == "mix" and alpha > 0)


def _own_pools(
    rollouts: Sequence[Rollout], policy: str | None = None
) -> dict[int, list[tuple[int, str, float]]]:
    """Subagents by depth across the group: (rollout index, agent id, own reward); only those
    of `policy` when one is given, so each policy's subagents have a baseline of their own."""
    pools: dict[int, list[tuple[int, str, float]]] = defaultdict(list)
    for i, rollout in enumerate(rollouts):
        for agent in rollout.agents:
            if agent.parent_id is not None and (policy is None or agent.policy == policy):
                pools[agent.depth].append((i, agent.agent_id, own_reward(rollout, agent)))
    return pools


def tree_advantages(
    rollouts: Sequence[Rollout],
    rule: CreditRule,
    *,
    mode: RewardMode = "root",
    alpha: float = 0.5,
    std_scaling: bool = False,
    eps: float = 1e-6,
    policy: str | None = None,
) -> list[dict[str, float]]:
    """Every agent's advantage in one task group: for each rollout, agent id -> advantage.
    With `policy`, only that policy's agents, their own-reward baselines pooled among them."""
    if mode not in ("root", "own", "mix"):
        raise CreditError(f"unknown subagent_reward {mode!r} (expected root, own or mix)")
    root_adv = group_advantages([r.reward for r in rollouts], rule, std_scaling=std_scaling, eps=eps)
    uses_own = _uses_own(mode, alpha)
    own_adv: dict[tuple[int, str], float] = {}
    if uses_own:
        for pool in _own_pools(rollouts, policy).values():
            advantages = group_advantages(
                [reward for _, _, reward in pool], rule, std_scaling=std_scaling, eps=eps
            )
            for (i, agent_id, _), advantage in zip(pool, advantages, strict=True):
                own_adv[i, agent_id] = advantage
    result: list[dict[str, float]] = []
    for i, rollout in enumerate(rollouts):
        by_agent = {}
        for agent in rollout.agents:
            if policy is not None and agent.policy != policy:
                continue
            if agent.parent_id is None or not uses_own:
                by_agent[agent.agent_id] = root_adv[i]
            elif mode == "own":
                by_agent[agent.agent_id] = own_adv[i, agent.agent_id]
            else:
                by_agent[agent.agent_id] = alpha * own_adv[i, agent.agent_id] + (1 - alpha) * root_adv[i]
        result.append(by_agent)
    return result


def is_constant_group(
    rollouts: Sequence[Rollout], *, mode: RewardMode = "root", alpha: float = 0.5, policy: str | None = None
) -> bool:
    """True when every baseline pool of the group has all-equal rewards: no agent can be told apart.

    A group whose episodes tie but whose subagents' own grades differ still teaches the
    subagents under `own` and `mix`, so it is not constant there. With `policy`, only the pools
    of that policy's agents count (a policy of `own`-graded subagents ignores the episodes' tie).
    """
    if policy is None:
        answers_to_root = True
    else:
        answers_to_root = any(
            agent.policy == policy and (agent.parent_id is None or mode != "own")
            for rollout in rollouts
            for agent in rollout.agents
        )
    if answers_to_root and len({r.reward for r in rollouts}) > 1:
        return False
    if _uses_own(mode, alpha):
        pools = _own_pools(rollouts, policy).values()
        return all(len({reward for _, _, reward in pool}) <= 1 for pool in pools)
    return True


def depth_weights(
    agents_by_depth: Mapping[int, int],
    tokens_by_depth: Mapping[int, int],
    *,
    method: DepthWeighting = "none",
    gamma: float = 1.0,
) -> dict[int, float]:
    """One advantage multiplier per depth, renormalised so the token-weighted mean is 1.

    `agents_by_depth` counts the agents with trained tokens at each depth of the batch,
    `tokens_by_depth` their trained tokens. With `inverse_count`, w_d = (1/n_d) * T / sum(T_d/n_d):
    each depth then pulls on the gradient as if it had as many agents as any other.
    """
    depths = sorted(d for d, tokens in tokens_by_depth.items() if tokens > 0)
    if method == "none":
        return dict.fromkeys(depths, 1.0)
    if method == "inverse_count":
        if any(agents_by_depth.get(d, 0) <= 0 for d in depths):
            raise CreditError("inverse_count needs an agent count for every depth with trained tokens")
        raw = {d: 1.0 / agents_by_depth[d] for d in depths}
    elif method == "discount":
        raw = {d: gamma**d for d in depths}
    else:
        raise CreditError(f"unknown depth_weighting {method!r} (expected none, inverse_count or discount)")
    total = sum(tokens_by_depth[d] for d in depths)
    weighted = sum(tokens_by_depth[d] * raw[d] for d in depths)
    return {d: raw[d] * total / weighted for d in depths}

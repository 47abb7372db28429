"""The entry point the trainer calls: task groups of graded rollouts in, datums out.

Order of operations, each step a function of its own module:
group baseline (rule, optional std scaling) -> subagent reward mode -> per-turn returns (with
`credit: per_turn`) -> prefix merging -> depth weighting -> normalisation.
"""

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Literal

import msgspec

from platoon.credit.baselines import CreditRule, get_credit_rule
from platoon.credit.datums import Datum, merge_calls, scaled, with_advantage
from platoon.credit.exceptions import CreditError
from platoon.credit.traces import AgentTrace, Rollout
from platoon.credit.trees import (
    DepthWeighting,
    RewardMode,
    check_tree,
    depth_weights,
    is_constant_group,
    own_reward,
    tree_advantages,
)
from platoon.credit.turns import turn_advantages

Normalization = Literal["sum", "token_mean"]
Assignment = Literal["outcome", "per_turn"]


class CreditConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every credit knob as a plain value, so an ablation is a config change.

    - `baseline`: a registered credit rule (`mean`, `leave_one_out`, or a plugin's).
    - `std_scaling`: divide each pool's advantages by its reward std + `std_eps`.
    - `remove_constant_groups`: drop groups in which no agent can be told apart (they
      only add zero-advantage tokens); kept, they train with advantage 0.
    - `subagent_reward`, `mix_alpha`: which reward a subagent answers to (see `trees`).
    - `depth_weighting`, `gamma`: how much each depth of the agent tree weighs.
    - `normalization`: `sum` leaves advantages as they are (Tinker's losses are sums);
      `token_mean` divides them by the batch's trained tokens, so the loss is a token mean.
    - `credit`, `turn_discount`: `outcome` gives every call of an agent its rollout's
      advantage; `per_turn` gives each call of a root agent the advantage of its discounted
      return from that turn on, against the group's returns at the same turn (see `turns`).
    """

    baseline: str = "mean"
    std_scaling: bool = False
    std_eps: float = 1e-6
    remove_constant_groups: bool = True
    subagent_reward: RewardMode = "root"
    mix_alpha: float = 0.5
    depth_weighting: DepthWeighting = "none"
    gamma: float = 0.9
    normalization: Normalization = "sum"
    credit: Assignment = "outcome"
    turn_discount: float = 1.0

    def __post_init__(self) -> None:
        get_credit_rule(self.baseline)  # an unknown rule is refused before any batch is formed
        _choice("credit", self.credit, ("outcome", "per_turn"))
        if not 0.0 <= self.turn_discount <= 1.0:
            raise CreditError(f"turn_discount must be in [0, 1], got {self.turn_discount}")
        _choice("subagent_reward", self.subagent_reward, ("root", "own", "mix"))
        _choice("depth_weighting", self.depth_weighting, ("none", "inverse_count", "discount"))
        _choice("normalization", self.normalization, ("sum", "token_mean"))
        if not 0.0 <= self.mix_alpha <= 1.0:
            raise CreditError(f"mix_alpha must be in [0, 1], got {self.mix_alpha}")
        if not 0.0 < self.gamma <= 1.0:
            raise CreditError(f"gamma must be in (0, 1], got {self.gamma}")
        if not self.std_eps > 0.0:
            raise CreditError(f"std_eps must be > 0, got {self.std_eps}")


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise CreditError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")


class CreditResult(msgspec.Struct, frozen=True, kw_only=True):
    """The batch's datums and what happened on the way (counts, rewards, per-depth weights)."""

    datums: list[Datum]
    stats: dict[str, float]


def assign_credit(
    groups: Sequence[Sequence[Rollout]], cfg: CreditConfig | None = None, *, policy: str | None = None
) -> CreditResult:
    """Turn task groups of graded rollouts into datums with advantages.

    Each inner list is one task's rollouts. Inputs are checked whole before anything is
    computed, so a malformed batch raises CreditError and nothing half-done comes back.

    With `policy`, only the datums of that policy's agents (`AgentTrace.policy`), with baselines,
    depth weights, normalisation and statistics of their own: one policy's batch of a
    several-policy run. Without it, every agent's (one policy: today's batch exactly).
    """

    cfg = cfg or CreditConfig()
    rule = get_credit_rule(cfg.baseline)
    _check_batch(groups)

    removed: Counter[str] = Counter()
    calls = 0
    pending: list[tuple[Datum, float | None]] = []  # None: the datum carries its advantages
    for group in groups:
        if not group:
            removed["empty"] += 1
            continue
        reason, group_datums, group_calls = _group_datums(group, cfg, rule, policy)
        if reason is not None:
            removed[reason] += 1
            continue
        pending += group_datums
        calls += group_calls

    agents_by_depth: Counter[int] = Counter()
    tokens_by_depth: Counter[int] = Counter()
    seen_agents = set()
    for datum, _ in pending:
        tokens_by_depth[datum.depth] += datum.num_trained_tokens
        if (datum.episode_id, datum.agent_id) not in seen_agents:
            seen_agents.add((datum.episode_id, datum.agent_id))
            agents_by_depth[datum.depth] += 1
    weights = depth_weights(agents_by_depth, tokens_by_depth, method=cfg.depth_weighting, gamma=cfg.gamma)
    trained_tokens = sum(tokens_by_depth.values())
    scale = 1.0 / trained_tokens if cfg.normalization == "token_mean" and trained_tokens else 1.0
    datums = [
        scaled(datum, weights[datum.depth] * scale)
        if advantage is None
        else with_advantage(datum, advantage * weights[datum.depth] * scale)
        for datum, advantage in pending
    ]

    rewards = [rollout.reward for group in groups for rollout in group]
    reward_mean = _mean(rewards)
    stats: dict[str, float] = {
        "groups": len(groups),
        "groups_kept": len(groups) - sum(removed.values()),
        "groups_removed_empty": removed["empty"],
        "groups_removed_constant": removed["constant"],
        "groups_removed_no_datums": removed["no_datums"],
        "rollouts": len(rewards),
        "reward_mean": reward_mean,
        "reward_std": math.sqrt(_mean([(r - reward_mean) ** 2 for r in rewards])),
        "calls": calls,
        "datums": len(datums),
        "agents": len(seen_agents),
        "trained_tokens": trained_tokens,
        "input_tokens": sum(len(d.model_input) for d in datums),
        "advantage_abs_mean": math.fsum(abs(d.advantages[i]) for d in datums for i in _sampled(d))
        / max(trained_tokens, 1),
        "policy_version_min": min((d.policy_version for d in datums), default=0),
        "max_depth": max(weights, default=0),
    }
    stats |= _depth_stats(groups, policy, weights, agents_by_depth, tokens_by_depth)
    return CreditResult(datums=datums, stats={key: float(value) for key, value in stats.items()})


def _depth_stats(
    groups: Sequence[Sequence[Rollout]],
    policy: str | None,
    weights: dict[int, float],
    agents_by_depth: Counter[int],
    tokens_by_depth: Counter[int],
) -> dict[str, float]:
    """Per depth: its agents' own reward (a subagent's own grade where it has one: how each
    depth does at its own job), agents, trained tokens and weight."""
    stats: dict[str, float] = {}
    own_rewards: dict[int, list[float]] = defaultdict(list)
    for rollout in (rollout for group in groups for rollout in group):
        for agent in rollout.agents:
            if _mine(agent, policy):
                own_rewards[agent.depth].append(own_reward(rollout, agent))
    for depth, rewards_at_depth in sorted(own_rewards.items()):
        stats[f"depth/{depth}/reward_mean"] = _mean(rewards_at_depth)
    for depth, weight in weights.items():
        stats[f"depth/{depth}/agents"] = agents_by_depth[depth]
        stats[f"depth/{depth}/trained_tokens"] = tokens_by_depth[depth]
        stats[f"depth/{depth}/weight"] = weight
    return stats


def _mine(agent: AgentTrace, policy: str | None) -> bool:
    """Whether `agent`'s datums are the batch's: every agent's, or those of `policy`'s."""
    return policy is None or agent.policy == policy


def _group_datums(
    group: Sequence[Rollout], cfg: CreditConfig, rule: CreditRule, policy: str | None
) -> tuple[str | None, list[tuple[Datum, float | None]], int]:
    """One task group's datums, each with its advantage (None: the datum carries per-turn
    ones), and the model calls they hold; or why the group is left out (`constant`,
    `no_datums`)."""

    per_turn: list[list[float]] | None = None
    constant = is_constant_group(group, mode=cfg.subagent_reward, alpha=cfg.mix_alpha, policy=policy)
    if cfg.credit == "per_turn":
        per_turn, varied = turn_advantages(
            group, rule, discount=cfg.turn_discount, std_scaling=cfg.std_scaling, eps=cfg.std_eps
        )
        roots_mine = any(_mine(a, policy) for r in group for a in r.agents if a.parent_id is None)
        constant = constant and not (varied and roots_mine)
    if cfg.remove_constant_groups and constant:
        return "constant", [], 0
    advantages = tree_advantages(
        group,
        rule,
        mode=cfg.subagent_reward,
        alpha=cfg.mix_alpha,
        std_scaling=cfg.std_scaling,
        eps=cfg.std_eps,
        policy=policy,
    )
    group_datums: list[tuple[Datum, float | None]] = []
    group_calls = 0
    for index, (rollout, by_agent) in enumerate(zip(group, advantages, strict=True)):
        for agent in rollout.agents:
            if not _mine(agent, policy):
                continue
            group_calls += sum(call.kind != "judge" for call in agent.calls)
            turns = per_turn[index] if per_turn is not None and agent.parent_id is None else None
            datums = merge_calls(
                agent.calls,
                episode_id=rollout.episode_id,
                group_id=rollout.group_id,
                agent_id=agent.agent_id,
                depth=agent.depth,
                call_advantages=turns,
            )
            advantage = None if turns is not None else by_agent[agent.agent_id]
            group_datums += [(datum, advantage) for datum in datums]
    if not group_datums:
        return "no_datums", [], 0
    return None, group_datums, group_calls


def _check_batch(groups: Sequence[Sequence[Rollout]]) -> None:
    episodes: set[str] = set()
    for group in groups:
        group_ids = {rollout.group_id for rollout in group}
        if len(group_ids) > 1:
            raise CreditError(f"a task group mixes group ids {sorted(group_ids)}")
        for rollout in group:
            if rollout.episode_id in episodes:
                raise CreditError(f"episode {rollout.episode_id!r} appears twice in the batch")
            episodes.add(rollout.episode_id)
            check_tree(rollout)


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def _sampled(datum: Datum) -> list[int]:
    return [i for i, w in enumerate(datum.weights) if w]

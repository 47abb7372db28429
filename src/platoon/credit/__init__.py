"""Credit assignment: graded rollouts in, Tinker-ready datums with advantages out.

Pure functions, no bus and no I/O. `assign_credit` is what the trainer calls; the pieces
(baselines, tree rewards and depth weights, prefix merging) are public for custom rules
and tests.
"""

from platoon.credit.assign import CreditConfig, CreditResult, assign_credit
from platoon.credit.baselines import (
    CreditRule,
    get_credit_rule,
    group_advantages,
    leave_one_out_baseline,
    mean_baseline,
    register_credit_rule,
)
from platoon.credit.datums import Datum, filter_stale, merge_calls, scaled, to_tinker, with_advantage
from platoon.credit.distill import distill_advantages
from platoon.credit.exceptions import CreditError
from platoon.credit.kl import kl_penalty, reference_targets
from platoon.credit.traces import AgentTrace, Call, Rollout
from platoon.credit.trees import check_tree, depth_weights, is_constant_group, own_reward, tree_advantages
from platoon.credit.turns import turn_advantages, turn_returns

__all__ = [
    "AgentTrace",
    "Call",
    "CreditConfig",
    "CreditError",
    "CreditResult",
    "CreditRule",
    "Datum",
    "Rollout",
    "assign_credit",
    "check_tree",
    "depth_weights",
    "distill_advantages",
    "filter_stale",
    "get_credit_rule",
    "group_advantages",
    "is_constant_group",
    "kl_penalty",
    "leave_one_out_baseline",
    "mean_baseline",
    "merge_calls",
    "own_reward",
    "reference_targets",
    "register_credit_rule",
    "scaled",
    "to_tinker",
    "tree_advantages",
    "turn_advantages",
    "turn_returns",
    "with_advantage",
]

"""The kinds ungraded episodes are counted under, the same in training metrics and eval reports.

An episode that failed (a harness that raised, an environment that failed, a timeout, a
non-finite reward, ...) is never trained on; its `EpisodeGraded` keeps the full reason, and a
step's metrics (`episodes/failed/<kind>`) and an eval report (`failures`) count it by kind.
"""

from __future__ import annotations

__all__ = ["failure_kind"]

# Words of a reason and the kind they mean, in order: an environment's failure, or a harness's
# exception, may mention a timeout, and is counted as the environment's or the harness's.
_KINDS = (
    ("reward rules failed", "reward_rules"),  # first: its reason may quote the environment's
    ("the environment failed", "env_fault"),
    ("sampler failed", "sampler"),  # the policy's sampler (`ModelCallFailed`)
    ("no sign of life from its worker", "worker_lost"),  # a rollout worker's lease expired
    ("non-finite reward", "non_finite_reward"),
    ("carried no reward", "no_reward"),
    ("harness raised", "harness_raised"),
    ("timeout", "timeout"),
    ("cancelled", "cancelled"),
    ("env session", "env_session"),
    ("grading failed", "grading_failed"),
    ("gateway", "gateway"),
)


def failure_kind(reason: str) -> str:
    """The kind an ungraded episode is counted under, from its reason; `other` when none fits."""
    text = reason.lower()
    return next((kind for words, kind in _KINDS if words in text), "other")

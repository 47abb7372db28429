"""Ungraded episodes are counted by the kind of their reason, the same in training and eval."""

import pytest

from platoon.stats.failures import failure_kind


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("the environment failed: tool hang timed out after 120s", "env_fault"),
        ("the environment failed: tool boom failed: RuntimeError: kaboom", "env_fault"),
        ("non-finite reward nan from the environment", "non_finite_reward"),
        ("the tool result that finished the episode carried no reward", "no_reward"),
        ("the episode passed its 15 s timeout", "timeout"),
        ("cancelled", "cancelled"),
        ("the harness raised ValueError: nope", "harness_raised"),
        ("the harness raised ReadTimeout: timeout", "harness_raised"),  # the harness's, not the episode's
        ("the env session failed to open: no image", "env_session"),
        ("grading failed: no env service answered", "grading_failed"),
        ("abandoned: 3 tries", "other"),
    ],
)
def test_each_reason_has_its_kind(reason, kind):
    assert failure_kind(reason) == kind


def test_a_reward_rule_failure_is_its_own_kind_even_when_it_quotes_the_environment():
    reason = "reward rules failed: judge 'j' failed (the environment: the environment failed: timeout)"
    assert failure_kind(reason) == "reward_rules"

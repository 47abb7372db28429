import pytest

from platoon.harness import HarnessError
from platoon.programs import EntrySettings, EpisodeRunner


def entry(options):
    return EntrySettings(
        name="e",
        harness={"platoon-react": 1, "platoon-codeact": 1},
        harness_options=options,
        path="environments.0",
    )


def test_a_mixture_takes_options_per_harness():
    runner = EpisodeRunner(
        [entry({"platoon-react": {"stop_on_text": False}, "platoon-codeact": {"timeout_s": 5}})]
    )
    assert runner.options["e", "platoon-react"].stop_on_text is False
    assert runner.options["e", "platoon-codeact"].timeout_s == 5


def test_per_harness_options_are_checked_with_their_path():
    with pytest.raises(HarnessError, match=r"environments\.0\.harness_options\.platoon-codeact\.timeout_s"):
        EpisodeRunner([entry({"platoon-react": {}, "platoon-codeact": {"timeout_s": "soon"}})])


def test_shared_options_must_suit_every_harness_of_the_mixture():
    with pytest.raises(HarnessError, match=r"environments\.0\.harness_options\.stop_on_text: unknown option"):
        EpisodeRunner([entry({"stop_on_text": False})])

"""Which step sampler weights a trainer may delete (`platoon.train.step_weights`), and a run on
the embedded backend that deletes them while its checkpoints stay whole and resumable."""

import json

import pytest
from learnable import learn_config

from platoon.train.step_weights import StepWeights


def path(version: int) -> str:
    return f"tinker://run/sampler_weights/step-{version:06d}"


def published(weights: StepWeights, *versions: int) -> list[str]:
    deleted = []
    for version in versions:
        weights.published(version, path(version))
        deleted += weights.unused()
    return deleted


def test_the_newest_max_staleness_plus_two_versions_stay():
    assert published(StepWeights(0), 1, 2, 3, 4) == [path(1), path(2)]
    weights = StepWeights(1)
    assert published(weights, 1, 2, 3, 4, 5) == [path(1), path(2)]
    assert sorted(weights.saved) == [3, 4, 5]


def test_an_episode_in_flight_holds_its_version_and_every_newer_one_until_it_ends():
    weights = StepWeights(0)
    weights.requested("old", 2)
    weights.requested("new", 4)
    assert published(weights, 1, 2, 3, 4, 5, 6) == [path(1)]
    weights.ended("new")
    assert weights.unused() == []
    weights.ended("old")
    assert weights.unused() == [path(2), path(3), path(4)]
    weights.ended("never requested")  # an episode another trainer requested: nothing to do
    assert sorted(weights.saved) == [5, 6]


def test_weights_a_checkpoint_points_at_are_never_deleted():
    weights = StepWeights(0)
    for version in (1, 2, 3, 4):
        weights.published(version, path(version))
    assert weights.unused(protected={path(2)}) == [path(1)]
    assert sorted(weights.saved) == [3, 4]


def test_skipped_steps_publish_no_version_and_delete_nothing():
    weights = StepWeights(0)
    assert weights.unused() == []
    assert published(weights, 3) == []


@pytest.mark.slow
@pytest.mark.torch
def test_a_run_keeps_only_the_newest_step_weights_and_its_checkpoints_which_sample_and_resume(
    site, tiny_model
):
    import anyio

    from platoon.api import train
    from platoon.config import validate_config

    def run(steps, *, resume=False):
        config = validate_config(learn_config(tiny_model, steps=steps, save_every=2))
        anyio.run(lambda: train(config, run_dir=run_dir, resume=resume, console=False))
        lines = (run_dir / "checkpoints.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def on_disk(tinker_path):
        run_id, kind, _ = tinker_path.removeprefix("tinker://").split("/")
        return run_dir / "tinker" / run_id / kind

    run_dir = site / "run"
    saved = run(5)
    assert [c["step"] for c in saved] == [2, 4, 5]
    samplers = on_disk(saved[0]["sampler_path"])
    # max_staleness 0: the newest 2 step weights, and every checkpoint's own.
    expected = {"step-000004", "step-000005", "ckpt-000002", "ckpt-000004", "ckpt-000005"}
    assert {p.name for p in samplers.iterdir()} == expected
    assert _samples(tiny_model, run_dir, saved[0]["sampler_path"])  # the oldest checkpoint's weights
    assert _samples(tiny_model, run_dir, saved[0]["sampler_path"].replace("ckpt-000002", "step-000005"))

    saved = run(7, resume=True)
    assert json.loads((run_dir / "lock.json").read_text())["resumed_from_step"] == 5
    assert [c["step"] for c in saved] == [2, 4, 5, 6, 7]
    resumed = on_disk(saved[-1]["sampler_path"])
    assert resumed != samplers  # a resumed run trains a new model: its own directory
    assert {p.name for p in resumed.iterdir()} == {"step-000006", "step-000007", "ckpt-000006", "ckpt-000007"}
    # The first process's step weights went when the run resumed (it samples ckpt-000005 instead);
    # its checkpoints' stay.
    assert {p.name for p in samplers.iterdir()} == {"ckpt-000002", "ckpt-000004", "ckpt-000005"}
    assert json.loads((run_dir / "step_weights.json").read_text()) == [
        saved[-1]["sampler_path"].replace("ckpt-", "step-").replace("000007", f"{v:06d}") for v in (6, 7)
    ]


def _samples(model, run_dir, sampler_path):
    """The tokens a fresh embedded server samples from `sampler_path` (in `run_dir/tinker`)."""
    import anyio
    import tinker

    from platoon.backends.local import running_server_in_thread

    async def sample():
        async with running_server_in_thread(model, checkpoint_dir=run_dir / "tinker", device="cpu") as url:
            client = tinker.ServiceClient(base_url=url, api_key="tml-test")
            try:
                sampler = await anyio.to_thread.run_sync(
                    lambda: client.create_sampling_client(model_path=sampler_path).result()
                )
                params = tinker.SamplingParams(max_tokens=4, temperature=1.0, seed=0)
                result = await anyio.to_thread.run_sync(
                    lambda: sampler.sample(
                        prompt=tinker.ModelInput.from_ints([1, 2, 3]), num_samples=1, sampling_params=params
                    ).result()
                )
            finally:
                await anyio.to_thread.run_sync(lambda: client.close("success").result())
        return result.sequences[0].tokens

    return anyio.run(sample)

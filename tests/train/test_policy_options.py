"""Per-policy options of a several-policy run (RFC 0001), end to end on tiny models: a trained
policy that starts from another run's training state (`policies.<name>.load_path`), and a
frozen policy as a trained one's KL reference (`kl.reference_policy`).

Every run here trains on one self-hosted Tinker-API server (the embedded backend served over
HTTP, as `platoon serve tinker` does), so that one run's tinker:// paths are another's to load,
as they are on hosted Tinker. A policy's weights are compared through the logprobs that a
sampler on them gives one fixed token sequence.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

pytestmark = pytest.mark.torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "planner-executor"
SEQUENCE = list(range(40, 72))  # the token ids every weights comparison scores


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    """One Tinker-API server on the tiny model for every run of the module."""
    pytest.importorskip("peft")
    from anyio.from_thread import start_blocking_portal

    from platoon.backends.local import running_server

    checkpoints = tmp_path_factory.mktemp("tinker")
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(
            running_server(tiny_model, checkpoint_dir=checkpoints, device="cpu")
        ) as url,
    ):
        yield url


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A site profile of the module's own, and the example's harnesses registered."""
    home = tmp_path_factory.mktemp("site")
    site = home / "site.yaml"
    site.write_text(f"runs: {home / 'runs'}\ncache: {home / 'cache'}\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PLATOON_SITE", str(site))
        yield home


def duet(server: str, tiny_model: str, *overrides: str):
    """examples/planner-executor/cpu.yaml on the shared server, every step training both."""
    from platoon.assembly import import_packages
    from platoon.config import load_config

    config = load_config(
        EXAMPLE / "cpu.yaml",
        [
            "train.backend=tinker",
            "train.reproducible=false",  # the embedded backend's switch; a server batches as it likes
            f"train.model_name={tiny_model}",
            f"tinker_base_url={server}",
            "train.batch_size=1",
            "train.max_training_steps=1",
            "train.workflow_config.group_size=4",
            "train.workflow_config.remove_constant_reward_groups=false",
            *overrides,
        ],
    )
    import_packages(config, EXAMPLE)
    return config


def train(config, run_dir: Path) -> None:
    from platoon.api import train

    anyio.run(lambda: train(config, run_dir=run_dir, console=False))


def scored(client, tokens: list[int] = SEQUENCE) -> list[float]:
    """The logprob a sampling client gives each token of `tokens` after the first."""
    import tinker

    return client.compute_logprobs(tinker.ModelInput.from_ints(tokens)).result()[1:]


def logprobs(server: str, tokens: list[int] = SEQUENCE, **weights: str) -> list[float]:
    """What a sampler on `weights` (model_path= or base_model=) gives `tokens`."""
    import tinker

    service = tinker.ServiceClient(base_url=server, api_key="tml-test")
    try:
        return scored(service.create_sampling_client(**weights).result(), tokens)
    finally:
        service.close("success").result()


def close(a: list[float], b: list[float]) -> bool:
    return max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4


@pytest.fixture(scope="module")
def first_run(server, tiny_model, home):
    """A run that trains both policies two steps and saves: its planner's last checkpoint."""
    run_dir = home / "first"
    train(duet(server, tiny_model, "train.max_training_steps=2"), run_dir)
    [*_, last] = (run_dir / "checkpoints" / "planner" / "checkpoints.jsonl").read_text().splitlines()
    return json.loads(last)


def trained_weights(config, run_dir: Path, *, resume: bool = False) -> dict[str, list[float]]:
    """What each trained policy's training client gives SEQUENCE once the run is opened."""
    from platoon.assembly import RunOptions, assemble
    from platoon.train.trainer import Trainer

    async def opened() -> dict[str, list[float]]:
        run = assemble(config, "train", RunOptions(resume=resume), run_dir=run_dir)
        async with run._opened() as opened:
            components = [part.build(opened) for part in run.parts]
            return {
                c.policy: scored(c.client.save_weights_and_get_sampling_client().result())
                for c in components
                if isinstance(c, Trainer)
            }

    return anyio.run(opened)


async def announcements(config, run_dir: Path) -> dict:
    """What the trainer of `config` announces of each policy at its start (`PolicyAnnounced`)."""
    from platoon.assembly import assemble, load_policy, open_policies
    from platoon.assembly.builders import announced
    from platoon.train.policies import policy_stores

    run = assemble(config, "train", run_dir=run_dir)
    loaded = {name: load_policy(p) for name, p in run.settings.policies.items()}
    stores = policy_stores(run_dir, run.settings.trained(), several=True)
    async with open_policies(loaded, run_dir=run_dir, stores=stores) as opened:
        return {name: announced(policy) for name, policy in opened.items()}


def first_call_sampled(server: str, run_dir: Path, policy: str, weights: str) -> bool:
    """Whether `policy`'s first model call of the run (at version 0) was sampled from `weights`
    (a sampler path, or the base model): its logprobs are what those weights give its tokens."""
    from platoon.bus import read_events
    from platoon.bus.events import ModelCallFinished

    call = next(
        e
        for e in read_events(run_dir)
        if isinstance(e, ModelCallFinished) and e.policy == policy and e.policy_version == 0
    )
    which = {"model_path": weights} if weights.startswith("tinker://") else {"base_model": weights}
    again = logprobs(server, call.prompt_tokens + call.completion_tokens, **which)
    return close(again[-len(call.logprobs) :], call.logprobs)


@pytest.mark.slow
def test_a_policy_starts_from_the_training_state_its_load_path_names(server, tiny_model, home, first_run):
    saved = logprobs(server, model_path=first_run["sampler_path"])
    base = logprobs(server, base_model=tiny_model)
    assert not close(saved, base)  # two steps moved the planner's weights
    config = duet(server, tiny_model, f"policies.planner.load_path={first_run['state_path']}")

    # Its training client holds the saved weights; the other policy's, the base model's.
    clients = trained_weights(config, home / "opened")
    assert close(clients["planner"], saved) and close(clients["executor"], base)

    # Rollout workers are told to sample those weights (and the executor its base model).
    announced = anyio.run(lambda: announcements(config, home / "announced"))
    assert close(logprobs(server, model_path=announced["planner"].sampler_path), saved)
    assert (announced["planner"].version, announced["executor"].sampler_path) == (0, "")

    # Its first rollouts sample those weights too (before its first update, at version 0).
    run_dir = home / "loaded"
    train(config, run_dir)
    for policy, expected in (("planner", first_run["sampler_path"]), ("executor", None)):
        assert first_call_sampled(server, run_dir, policy, expected or tiny_model)

    # A resume wins over load_path: the planner goes on from its own checkpoint of this run.
    [checkpoint] = (run_dir / "checkpoints" / "planner" / "checkpoints.jsonl").read_text().splitlines()
    own = logprobs(server, model_path=json.loads(checkpoint)["sampler_path"])
    assert not close(own, saved)
    resumed = trained_weights(config, run_dir, resume=True)
    assert close(resumed["planner"], own)


def test_a_run_of_one_policy_samples_the_state_its_load_path_names_from_its_first_rollout(
    server, tiny_model, home, first_run
):
    """`checkpoint.load_path` (no `policies:`) trained the loaded weights but sampled the base
    model until the first update."""
    import learnable

    from platoon.config import validate_config

    raw = learnable.learn_config(tiny_model, steps=1, backend="tinker", batch_size=1)
    raw |= {"tinker_base_url": server, "checkpoint": {"load_path": first_run["state_path"]}}
    run_dir = home / "one"
    train(validate_config(raw), run_dir)
    assert first_call_sampled(server, run_dir, "default", first_run["sampler_path"])


@pytest.mark.slow
def test_a_frozen_policy_is_the_kl_reference_of_the_trained_policy_that_names_it(
    server, tiny_model, home, first_run
):
    """The planner's KL reference is `anchor`, a frozen policy sampling the first run's planner
    weights; the executor keeps `train.kl`'s, its base model."""
    from platoon.assembly import assemble
    from platoon.train.trainer import Trainer

    config = duet(
        server,
        tiny_model,
        "train.kl.coefficient=0.05",
        "policies.anchor.frozen=true",
        f"policies.anchor.model_path={first_run['sampler_path']}",
        "policies.planner.kl={coefficient: 0.05, reference_policy: anchor}",
    )
    saved = logprobs(server, model_path=first_run["sampler_path"])
    base = logprobs(server, base_model=tiny_model)

    async def references() -> dict[str, list[float]]:
        run = assemble(config, "train", run_dir=home / "kl-opened")
        async with run._opened() as opened:
            components = [part.build(opened) for part in run.parts]
            return {c.policy: scored(c.reference) for c in components if isinstance(c, Trainer)}

    reference = anyio.run(references)
    assert close(reference["planner"], saved) and close(reference["executor"], base)

    # Before either policy's first update, each samples its base model: against the base the
    # KL is nothing; against the anchor's trained weights it is not.
    run_dir = home / "kl"
    train(config, run_dir)
    [step] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert abs(step["executor/kl/mean"]) < 1e-3
    assert abs(step["planner/kl/mean"]) > 100 * max(abs(step["executor/kl/mean"]), 1e-5), step
    print("kl/mean at step 0:", step["planner/kl/mean"], step["executor/kl/mean"])

    # What `platoon train` ends with: a line per policy, with its own reward, version and KL.
    from platoon.stats.summary import train_summary

    lines = {line.split(":")[0]: line for line in train_summary(run_dir).splitlines()}
    for policy in ("planner", "executor"):
        own = step[f"{policy}/reward/mean"]
        assert lines[f"policy  {policy}"] == (
            f"policy  {policy}: reward first 1 step {own:.3f}, last 1 step {own:.3f}  "
            f"({own:.2f} → {own:.2f}), version 1, kl {step[f'{policy}/kl/mean']:.4f}"
        )
    assert "policy  anchor" not in lines  # a frozen policy trains nothing to report

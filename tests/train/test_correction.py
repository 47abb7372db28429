"""Truncated and masked importance sampling (`train.correction`) through the trainer, the real
tinker SDK and the embedded backend: sampler logprobs made to differ from the trainer's on
purpose, and the step's gradient compared with the one the correction should give.

The expected gradient of `-sum w * A * grad p` is that of a cross-entropy step with weights
`w * A`, which the same backend computes directly; the gradient norm the backend reports before
its update tells the two apart to float precision. Each case trains a fresh LoRA of the same
seed, so every step starts from the same weights."""

from __future__ import annotations

import math
import os

import anyio
import pytest

from platoon.bus import Bus
from platoon.bus.events import BatchReady, Datum, DatumsScored, TrainStepFinished
from platoon.config.schema import AdamParams, CorrectionConfig, TrainConfig
from platoon.train.checkpoints import CheckpointStore
from platoon.train.trainer import Trainer, TrainerSettings

pytestmark = [pytest.mark.torch, pytest.mark.anyio]
pytest.importorskip("peft")
tinker = pytest.importorskip("tinker")
os.environ.setdefault("TINKER_TELEMETRY", "0")

TOKENS = list(range(20, 36))  # 15 targets; the last 8 were "sampled"
SAMPLED = range(7, 15)
SHIFTED = {9: 3.0, 12: -3.0}  # the sampler's logprob off by this: ratio e^-3 at target 9, e^3 at 12


@pytest.fixture
def anyio_backend():
    return "asyncio"  # the trainer's wait on SDK futures (see tests/train/test_trainer.py)


@pytest.fixture(scope="module")
def service(tiny_model, tmp_path_factory):
    from anyio.from_thread import start_blocking_portal

    from platoon.backends.local import running_server

    checkpoints = tmp_path_factory.mktemp("checkpoints")
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(
            running_server(tiny_model, checkpoint_dir=checkpoints, device="cpu")
        ) as url,
    ):
        client = tinker.ServiceClient(base_url=url, api_key="tml-test")
        yield client
        client.close("success").result()


def fresh(service, tiny_model):
    return service.create_lora_training_client(base_model=tiny_model, rank=4, seed=3).result()


def trainer_logprobs(client) -> list[float]:
    datum = tinker.Datum(
        model_input=tinker.ModelInput.from_ints(TOKENS[:-1]),
        loss_fn_inputs={"target_tokens": TOKENS[1:], "weights": [0.0] * (len(TOKENS) - 1)},
    )
    return client.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()


def sampled_datum(trainer: list[float]) -> Datum:
    """The trainer's own logprobs as the sampler's, but for the tokens of `SHIFTED`: there the
    sampler gave the token a higher (positive shift: ratio below 1) or lower logprob."""
    n = len(TOKENS) - 1
    weights = [1.0 if i in SAMPLED else 0.0 for i in range(n)]
    return Datum(
        model_input=TOKENS[:-1],
        target_tokens=TOKENS[1:],
        logprobs=[trainer[i] + SHIFTED.get(i, 0.0) if weights[i] else 0.0 for i in range(n)],
        advantages=[w * 0.5 for w in weights],
        weights=weights,
        num_trained_tokens=len(SAMPLED),
    )


def reference_grad_norm(service, tiny_model, token_weights: list[float]) -> float:
    """The gradient norm of `-sum weights * logprob`, as a cross-entropy step computes it."""
    client = fresh(service, tiny_model)
    datum = tinker.Datum(
        model_input=tinker.ModelInput.from_ints(TOKENS[:-1]),
        loss_fn_inputs={"target_tokens": TOKENS[1:], "weights": token_weights},
    )
    forward = client.forward_backward([datum], "cross_entropy")
    optim = client.optim_step(tinker.AdamParams(learning_rate=1e-3))
    forward.result()
    return optim.result().metrics["grad_norm:mean"]


async def trained_step(service, tiny_model, tmp_path, correction, loss_fn="importance_sampling"):
    client = fresh(service, tiny_model)
    datum = sampled_datum(trainer_logprobs(client))
    train = TrainConfig(
        model_name=tiny_model,
        renderer_name="qwen3",
        loss_fn=loss_fn,
        save_every=0,
        optimizer=AdamParams(learning_rate=1e-3),
        correction=correction,
        loss_normalization="sum",
    )
    settings = TrainerSettings(train=train)
    trainer = Trainer(client, settings, CheckpointStore(tmp_path))
    async with Bus() as bus:
        scored: list[DatumsScored] = []
        bus.subscribe(DatumsScored, scored.append)
        async with bus.stream(TrainStepFinished) as steps:
            await trainer.step(bus, BatchReady(step=0, datums=[datum]))
            with anyio.fail_after(10):
                finished = await steps.receive()
    return datum, finished.metrics, scored


def ratios(datum: Datum) -> dict[int, float]:
    return {i: math.exp(-SHIFTED.get(i, 0.0)) for i in SAMPLED}


async def test_without_a_correction_each_token_weighs_its_full_ratio(service, tiny_model, tmp_path):
    datum, metrics, scored = await trained_step(service, tiny_model, tmp_path, None)
    r = ratios(datum)
    expected = reference_grad_norm(service, tiny_model, [0.5 * r.get(i, 0.0) for i in range(len(TOKENS) - 1)])
    assert metrics["train/grad_norm"] == pytest.approx(expected, rel=1e-4)
    assert metrics["ratio/max"] == pytest.approx(math.exp(3.0), rel=1e-4)
    assert metrics["ratio/min"] == pytest.approx(math.exp(-3.0), rel=1e-4)
    assert metrics["mismatch/max_abs"] == pytest.approx(3.0, rel=1e-4)
    assert metrics["mismatch/kl"] > 0.1
    assert len(scored) == 1 and len(scored[0].logprobs[0]) == len(TOKENS) - 1


async def test_truncated_importance_sampling_caps_the_weight_of_a_token(service, tiny_model, tmp_path):
    cfg = CorrectionConfig(mode="truncate", high=2.0)
    datum, metrics, _ = await trained_step(service, tiny_model, tmp_path, cfg)
    r = ratios(datum)
    weights = [0.5 * min(r[i], 2.0) if i in r else 0.0 for i in range(len(TOKENS) - 1)]
    assert metrics["train/grad_norm"] == pytest.approx(
        reference_grad_norm(service, tiny_model, weights), rel=1e-4
    )
    uncapped = [0.5 * r.get(i, 0.0) for i in range(len(TOKENS) - 1)]
    assert metrics["train/grad_norm"] != pytest.approx(
        reference_grad_norm(service, tiny_model, uncapped), rel=1e-2
    )
    assert metrics["correction/truncated_fraction"] == pytest.approx(1 / len(SAMPLED))  # the e^3 one
    assert metrics["mismatch/max_abs"] == pytest.approx(3.0, rel=1e-4)  # measured against the sampler


async def test_masked_importance_sampling_drops_the_tokens_that_stray(service, tiny_model, tmp_path):
    cfg = CorrectionConfig(mode="mask", high=2.0, low=0.5)
    datum, metrics, _ = await trained_step(service, tiny_model, tmp_path, cfg, loss_fn="ppo")
    r = ratios(datum)
    weights = [0.5 * r[i] if i in r and 0.5 <= r[i] <= 2.0 else 0.0 for i in range(len(TOKENS) - 1)]
    assert metrics["train/grad_norm"] == pytest.approx(
        reference_grad_norm(service, tiny_model, weights), rel=1e-4
    )
    assert metrics["correction/masked_fraction"] == pytest.approx(2 / len(SAMPLED))
    # ppo's own ratio is against the trainer's logprobs the forward pass measured: nothing clipped
    assert metrics["ratio/clipped_fraction"] == 0.0

"""stable_reinforce through the real tinker SDK: sampling records, provenance checked token by
token, the loss on the recorded logprobs, and the refusals a bad claim gets."""

import numpy as np
import pytest
import tinker
from tinker import types

pytestmark = pytest.mark.torch

PROMPT = [11, 12, 13, 14, 15, 16]


def _sampled(training, n: int = 2):
    sampler = training.save_weights_and_get_sampling_client(record_stability_info=True).result()
    params = types.SamplingParams(max_tokens=5, stop=[], seed=3)
    return sampler.sample(types.ModelInput.from_ints(PROMPT), n, params).result().sequences


def _datum(seq, advantage: float, tokens=None) -> types.Datum:
    """As the cookbook's rl_loop builds it: the prompt and sampled tokens, shifted by one."""
    sampled = list(tokens or seq.tokens)
    p = len(PROMPT)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(PROMPT + sampled[:-1]),
        loss_fn_inputs={
            "target_tokens": [0] * (p - 1) + sampled,
            "logprobs": [0.0] * (p - 1) + list(seq.logprobs),
            "advantages": [0.0] * (p - 1) + [advantage] * len(sampled),
        },
    )
    return datum.with_provenance(
        model_input=[
            types.PromptProvenanceSpan(sequence_id=seq.sequence_id, length=p),
            types.SampledProvenanceSpan(sequence_id=seq.sequence_id, length=len(sampled) - 1),
        ],
        loss_fn_inputs=[
            types.PromptProvenanceSpan(sequence_id=seq.sequence_id, offset=1, length=p - 1),
            types.SampledProvenanceSpan(sequence_id=seq.sequence_id, length=len(sampled)),
        ],
    )


def test_stable_reinforce_trains_on_the_recorded_logprobs(service, tiny_model):
    training = service.create_lora_training_client(base_model=str(tiny_model), rank=4, seed=2).result()
    seqs = _sampled(training)
    data = [_datum(seqs[0], 1.0), _datum(seqs[1], -1.0)]
    # The learner's logprobs of the same targets, to compute the expected loss from.
    plain = [
        types.Datum(
            model_input=d.model_input, loss_fn_inputs={"target_tokens": d.loss_fn_inputs["target_tokens"]}
        )
        for d in data
    ]
    learner = [
        o["logprobs"].to_numpy() for o in training.forward(plain, "cross_entropy").result().loss_fn_outputs
    ]
    expected = 0.0
    for seq, p, adv in zip(seqs, learner, (1.0, -1.0), strict=True):
        n = len(seq.tokens)
        q = np.asarray(seq.logprobs, dtype=np.float64)
        weight = np.minimum(np.exp(p[-n:] - q), 2.0)
        expected += -(weight * p[-n:] * adv).sum()
    out = training.forward_backward(data, "stable_reinforce").result()
    assert out.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-5)
    training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    # The loss config's cap is honoured: with the weight capped at 0 nothing remains.
    capped = training.forward(data, "stable_reinforce", {"clip_high_threshold": 0.0}).result()
    assert capped.metrics["loss:sum"] == 0.0


def test_a_false_or_foreign_claim_is_refused(service, tiny_model, base_url):
    training = service.create_lora_training_client(base_model=str(tiny_model), rank=4, seed=2).result()
    seq = _sampled(training, n=1)[0]
    tampered = [(t + 1) % 100 for t in seq.tokens]
    with pytest.raises(
        tinker.BadRequestError,
        match=r"model_input: positions 6..10 are not positions 0..4 of sequence .*sampled tokens",
    ):
        training.forward([_datum(seq, 1.0, tokens=tampered)], "stable_reinforce").result()
    derived = _datum(seq, 1.0)
    derived.loss_fn_inputs["sampled"] = types.TensorData(data=[1.0] * 10, dtype="float32", shape=[10])
    with pytest.raises(tinker.BadRequestError, match="derived by the server"):
        training.forward([derived], "stable_reinforce").result()
    # Records belong to the session that sampled them.
    other = tinker.ServiceClient(base_url=base_url, api_key="tml-test")
    try:
        stranger = other.create_lora_training_client(base_model=str(tiny_model), rank=4).result()
        with pytest.raises(tinker.BadRequestError, match="was not recorded in this session"):
            stranger.forward([_datum(seq, 1.0)], "stable_reinforce").result()
        # A sampler that did not record leaves nothing to train on.
        plain = training.save_weights_and_get_sampling_client().result()
        unrecorded = plain.sample(
            types.ModelInput.from_ints(PROMPT), 1, types.SamplingParams(max_tokens=3)
        ).result()
        with pytest.raises(tinker.BadRequestError, match="was not recorded"):
            training.forward([_datum(unrecorded.sequences[0], 1.0)], "stable_reinforce").result()
        # The training client goes on after each refusal.
        assert training.forward([_datum(seq, 1.0)], "stable_reinforce").result().metrics["loss:sum"] != 0
    finally:
        other.close("success").result()

"""`train.reproducible`: the trainer's logprobs of sampled tokens are the sampler's, bit for bit.

The batch-invariant sampler attends row by row in fixed key blocks; the trainer, scoring the
same tokens in one forward, attends the same way (each datum alone), so an importance ratio is
exactly 1 and the sampler-trainer mismatch exactly 0: before any update and after one."""

from pathlib import Path

import pytest
from tinker import types


@pytest.fixture(scope="module")
def base_url(tiny_model: Path, checkpoint_dir: Path):
    from anyio.from_thread import start_blocking_portal

    from platoon.backends.local import running_server

    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(
            running_server(str(tiny_model), checkpoint_dir=checkpoint_dir, device="cpu", batch_invariant=True)
        ) as url,
    ):
        yield url


def scored(training, sequences: list[list[int]]) -> list[list[float]]:
    """The trainer's logprobs of each sequence's targets, all in one forward (left-padded rows)."""
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(sequence[:-1]),
            loss_fn_inputs={"target_tokens": sequence[1:], "weights": [1.0] * (len(sequence) - 1)},
        )
        for sequence in sequences
    ]
    return [o["logprobs"].tolist() for o in training.forward(data, "cross_entropy").result().loss_fn_outputs]


@pytest.mark.slow  # about a second: two samplings and two scorings of 4 sequences
def test_the_trainer_scores_sampled_tokens_exactly_as_the_sampler_drew_them(service, tiny_model):
    training = service.create_lora_training_client(base_model=str(tiny_model), rank=4, seed=1).result()
    prompts = [[5, 9, 14, 3, 27, 8], [40, 41, 2, 7, 7, 19, 33, 4, 12, 6, 90]]  # rows of two lengths
    for max_tokens in (12, 5):  # the base weights, then a trained adapter
        sampler = training.save_weights_and_get_sampling_client().result()
        params = types.SamplingParams(max_tokens=max_tokens, seed=7, temperature=1.0, stop=[])
        drawn = [
            (prompt, sequence)
            for prompt in prompts
            for sequence in sampler.sample(types.ModelInput.from_ints(prompt), 2, params).result().sequences
        ]
        rows = scored(training, [[*prompt, *sequence.tokens] for prompt, sequence in drawn])
        for (prompt, sequence), row in zip(drawn, rows, strict=True):
            assert row[len(prompt) - 1 :] == sequence.logprobs  # float32 both sides: equal to the last bit
        whole = [*prompts[0], *drawn[0][1].tokens]
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(whole[:-1]), loss_fn_inputs={"target_tokens": whole[1:]}
        )
        training.forward_backward([datum], "cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=5e-2)).result()

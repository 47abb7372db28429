"""Training through the real tinker SDK against the embedded server."""

from pathlib import Path

import numpy as np
import pytest
import tinker
import torch
from tinker import types

LR = types.AdamParams(learning_rate=2e-2)


def datum(tokens: list[int], weights: list[float] | None = None) -> types.Datum:
    inputs = {"target_tokens": tokens[1:], "weights": weights or [1.0] * (len(tokens) - 1)}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


BATCH = [datum(list(range(20, 44))), datum([5, 6, 7, 8, 9, 10, 11, 12])]


def train(client, data, loss_fn="cross_entropy", steps=1, config=None, lr=LR.learning_rate):
    for _ in range(steps):
        fwd = client.forward_backward(data, loss_fn, config)
        opt = client.optim_step(types.AdamParams(learning_rate=lr))
        out = fwd.result()
        opt.result()
    return out


def local_dir(checkpoint_dir: Path, tinker_path: str) -> Path:
    run, kind, name = tinker_path.removeprefix("tinker://").split("/")
    return checkpoint_dir / run / kind / name


def torch_logprobs(model_dir: Path, adapter_dir: Path, tokens: list[int]) -> np.ndarray:
    """Target logprobs of `tokens[1:]` computed directly with transformers + peft."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    with torch.no_grad():
        logits = model(torch.tensor([tokens[:-1]])).logits[0].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0].numpy()


def test_cross_entropy_step_lowers_loss(service, tiny_model):
    client = service.create_lora_training_client(base_model=str(tiny_model), rank=8, seed=1).result()
    before = client.forward(BATCH, "cross_entropy").result().metrics["loss:sum"]
    out = train(client, BATCH, steps=3)
    after = client.forward(BATCH, "cross_entropy").result().metrics["loss:sum"]
    assert out.metrics["loss:sum"] > after
    assert after < before - 1.0
    assert [o["logprobs"].shape for o in out.loss_fn_outputs] == [[23], [7]]


def test_forward_logprobs_equal_torch(service, tiny_model, checkpoint_dir):
    client = service.create_lora_training_client(base_model=str(tiny_model), rank=4, seed=2).result()
    train(client, BATCH, steps=2)  # make the LoRA delta non-zero
    path = client.save_weights_for_sampler("fwd-check").result().path
    tokens = [3, 17, 99, 250, 4, 8, 15, 16, 23, 42]
    served = client.forward([datum(tokens)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
    expected = torch_logprobs(tiny_model, local_dir(checkpoint_dir, path), tokens)
    np.testing.assert_allclose(served.to_numpy(), expected, atol=1e-5)


def test_sampled_logprobs_match_the_model(service, tiny_model):
    client = service.create_lora_training_client(base_model=str(tiny_model), rank=4, seed=3).result()
    train(client, BATCH, steps=2)
    sampler = client.save_weights_and_get_sampling_client().result()
    prompt = [11, 12, 13, 14]
    params = types.SamplingParams(max_tokens=12, temperature=1.0, seed=7, stop=[])
    result = sampler.sample(types.ModelInput.from_ints(prompt), 3, params).result()
    assert len(result.sequences) == 3
    for seq in result.sequences:
        assert len(seq.tokens) == 12 and seq.stop_reason == "length"
        full = prompt + list(seq.tokens)
        scored = client.forward([datum(full)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
        np.testing.assert_allclose(seq.logprobs, scored.to_numpy()[len(prompt) - 1 :], atol=1e-4)
        prompt_lp = sampler.compute_logprobs(types.ModelInput.from_ints(full)).result()
        assert prompt_lp[0] is None
        np.testing.assert_allclose(prompt_lp[1:], scored.to_numpy(), atol=1e-4)
    again = sampler.sample(types.ModelInput.from_ints(prompt), 3, params).result()
    assert [s.tokens for s in again.sequences] == [s.tokens for s in result.sequences]  # seeded


@pytest.mark.slow
def test_new_sampler_samples_updated_weights(service, tiny_model):
    client = service.create_lora_training_client(base_model=str(tiny_model), rank=8, seed=4).result()
    prompt, target = [7, 8, 9], [100, 200, 300, 400]
    greedy = types.SamplingParams(max_tokens=4, temperature=0.0, stop=[])
    base = service.create_sampling_client(base_model=str(tiny_model)).result()
    before = base.sample(types.ModelInput.from_ints(prompt), 1, greedy).result().sequences[0].tokens
    assert before != target
    train(client, [datum(prompt + target, [0, 0, 1, 1, 1, 1])], steps=80, lr=1e-2)
    path = client.save_weights_for_sampler("after-training").result().path
    assert path.startswith("tinker://") and path.endswith("/sampler_weights/after-training")
    sampler = service.create_sampling_client(model_path=path).result()
    after = sampler.sample(types.ModelInput.from_ints(prompt), 1, greedy).result().sequences[0].tokens
    assert after == target
    # The base model is untouched.
    assert base.sample(types.ModelInput.from_ints(prompt), 1, greedy).result().sequences[0].tokens == before


def test_state_round_trips_with_and_without_optimizer(service, tiny_model):
    client = service.create_lora_training_client(base_model=str(tiny_model), rank=4, seed=5).result()
    train(client, BATCH, steps=2)
    path = client.save_state("two-steps").result().path
    assert path.endswith("/weights/two-steps")
    saved = client.forward(BATCH, "cross_entropy").result().metrics["loss:sum"]
    train(client, BATCH, steps=1)
    continued = client.forward(BATCH, "cross_entropy").result().metrics["loss:sum"]

    with_opt = service.create_training_client_from_state_with_optimizer(path).result()
    assert with_opt.get_info().lora_rank == 4
    assert with_opt.forward(BATCH, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(
        saved, abs=1e-4
    )
    train(with_opt, BATCH, steps=1)
    assert with_opt.forward(BATCH, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(
        continued, abs=1e-3
    )

    fresh_opt = service.create_training_client_from_state(path).result()
    train(fresh_opt, BATCH, steps=1)
    restarted = fresh_opt.forward(BATCH, "cross_entropy").result().metrics["loss:sum"]
    assert restarted != pytest.approx(continued, abs=1e-3)  # Adam moments were reset

    with pytest.raises(tinker.RequestFailedError, match="already exists"):
        client.save_state("two-steps").result()
    client.save_state("two-steps", overwrite=True).result()


def test_importance_sampling_raises_favoured_token(service, tiny_model):
    client = service.create_lora_training_client(base_model=str(tiny_model), rank=8, seed=6).result()
    prompt, favoured, others = [30, 31, 32], 77, [5, 90, 140, 210, 260, 310, 360]

    def probability(sampler) -> float:
        logprobs = sampler.compute_logprobs(types.ModelInput.from_ints([*prompt, favoured])).result()
        return float(np.exp(logprobs[-1]))

    sampler = client.save_weights_and_get_sampling_client().result()
    start = probability(sampler)
    for _ in range(4):
        data = []
        for token in [favoured, *others]:
            q = sampler.compute_logprobs(types.ModelInput.from_ints([*prompt, token])).result()[-1]
            advantage = (1.0 if token == favoured else 0.0) - 1 / 8
            n = len(prompt)
            data.append(
                types.Datum(
                    model_input=types.ModelInput.from_ints(prompt),
                    loss_fn_inputs={
                        "target_tokens": [*prompt[1:], token],
                        "logprobs": [0.0] * (n - 1) + [q],
                        "advantages": [0.0] * (n - 1) + [advantage],
                    },
                )
            )
        train(client, data, loss_fn="importance_sampling")
        sampler = client.save_weights_and_get_sampling_client().result()
    assert probability(sampler) > 3 * start


def test_rl_losses_follow_the_documented_math(service, tiny_model):
    client = service.create_lora_training_client(base_model=str(tiny_model), rank=4, seed=7).result()
    tokens = [40, 41, 42, 43, 44, 45]
    p = client.forward([datum(tokens)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    q = p + np.array([0.5, -0.5, 0.1, 0.0, -0.1], dtype=np.float32)
    adv = np.array([1.0, -1.0, 2.0, 0.0, 1.0], dtype=np.float32)
    rl = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "logprobs": q.tolist(), "advantages": adv.tolist()},
    )
    r = np.exp(p - q)
    s = np.exp((p - q)[adv != 0].mean())
    expected = {
        "importance_sampling": (None, -(r * adv).sum()),
        "ppo": (
            {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
            -np.minimum(r * adv, np.clip(r, 0.9, 1.1) * adv).sum(),
        ),
        "cispo": (
            {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
            -(np.clip(r, 0.9, 1.1) * p * adv).sum(),
        ),
        "dro": ({"beta": 0.05}, -(p * adv - 0.5 * 0.05 * (p - q) ** 2).sum()),
        # GSPO-token: one ratio, the geometric mean over the tokens with an advantage (no mask sent).
        "gspo": (
            {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
            -np.minimum(s * adv, np.clip(s, 0.9, 1.1) * adv).sum(),
        ),
    }
    for loss_fn, (config, value) in expected.items():
        out = client.forward([rl], loss_fn, config).result()
        assert out.metrics["loss:sum"] == pytest.approx(float(value), rel=1e-4, abs=1e-4), loss_fn
    train(client, [rl], loss_fn="ppo", config={"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})


def test_forward_backward_custom(service, tiny_model):
    client = service.create_lora_training_client(base_model=str(tiny_model), rank=4, seed=8).result()
    before = client.forward(BATCH, "cross_entropy").result().metrics["loss:sum"]

    def doubled_nll(data, logprobs_list):
        loss = sum(-(2.0 * lp).sum() for lp in logprobs_list)
        return loss, {"doubled:sum": loss.item()}

    out = client.forward_backward_custom(BATCH, doubled_nll).result()
    assert out.metrics["doubled:sum"] == pytest.approx(2 * before, rel=1e-4)
    client.optim_step(LR).result()
    assert client.forward(BATCH, "cross_entropy").result().metrics["loss:sum"] < before


def test_parallel_chunks_and_many_datums(service, tiny_model):
    client = service.create_lora_training_client(base_model=str(tiny_model), rank=4, seed=9).result()
    data = [datum([i, i + 1, i + 2, i + 3]) for i in range(40)]
    out = client.forward_backward(data, "cross_entropy").result()
    assert len(out.loss_fn_outputs) == 40
    assert client.optim_step(LR).result().metrics["grad_norm:mean"] > 0


def test_mixed_lengths_are_packed_and_equal_one_datum_at_a_time(service, tiny_model):
    """Short datums share a row with restarting positions; their logprobs, loss and gradients
    equal those of each datum run alone."""
    client = service.create_lora_training_client(base_model=str(tiny_model), rank=4, seed=5).result()
    lengths = [30, 7, 12, 3, 18, 25, 5]
    data = [datum([(5 * i + 3 * j) % 90 + 5 for j in range(n + 1)]) for i, n in enumerate(lengths)]
    packed = client.forward(data, "cross_entropy").result()
    alone = [client.forward([d], "cross_entropy").result() for d in data]
    for together, single in zip(packed.loss_fn_outputs, alone, strict=True):
        np.testing.assert_allclose(
            together["logprobs"].to_numpy(), single.loss_fn_outputs[0]["logprobs"].to_numpy(), atol=2e-5
        )
    assert packed.metrics["loss:sum"] == pytest.approx(sum(s.metrics["loss:sum"] for s in alone), rel=1e-5)

    # The step taken from the packed batch equals the one from gradients accumulated one by one.
    twin = service.create_lora_training_client(base_model=str(tiny_model), rank=4, seed=5).result()
    client.forward_backward(data, "cross_entropy").result()
    packed_norm = client.optim_step(LR).result().metrics["grad_norm:mean"]
    for d in data:
        twin.forward_backward([d], "cross_entropy").result()
    single_norm = twin.optim_step(LR).result().metrics["grad_norm:mean"]
    assert packed_norm == pytest.approx(single_norm, rel=1e-4)
    probe = [datum(list(range(10, 40)))]
    assert client.forward(probe, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(
        twin.forward(probe, "cross_entropy").result().metrics["loss:sum"], rel=1e-4
    )


def test_topk_prompt_and_sample_logprobs(service, tiny_model, checkpoint_dir):
    """The top-k alternatives at every prompt and sampled position are the model's own k most
    likely tokens, best first; the first prompt position has none."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    client = service.create_lora_training_client(base_model=str(tiny_model), rank=4, seed=6).result()
    train(client, BATCH, steps=1)
    path = client.save_weights_for_sampler("topk-check").result().path
    sampler = service.create_sampling_client(model_path=path).result()
    prompt = [11, 12, 13, 14, 15]
    greedy = types.SamplingParams(max_tokens=6, temperature=0.0, stop=[])
    out = sampler.sample(
        types.ModelInput.from_ints(prompt),
        1,
        greedy,
        include_prompt_logprobs=True,
        topk_prompt_logprobs=5,
        topk_sample_logprobs=3,
    ).result()
    seq = out.sequences[0]
    full = prompt + list(seq.tokens)
    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model), local_dir(checkpoint_dir, path)
    ).eval()
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([full[:-1]])).logits[0].float(), -1)
    expected = logprobs.topk(5, -1)

    topk = out.topk_prompt_logprobs
    assert len(topk) == len(prompt) and topk[0] is None
    for position in range(1, len(prompt)):
        assert [t for t, _ in topk[position]] == expected.indices[position - 1].tolist()
        np.testing.assert_allclose([v for _, v in topk[position]], expected.values[position - 1], atol=1e-4)
        assert out.prompt_logprobs[position] == pytest.approx(
            float(logprobs[position - 1, prompt[position]]), abs=1e-4
        )
    assert len(seq.topk_logprobs) == len(seq.tokens)
    for step, (token, alternatives) in enumerate(zip(seq.tokens, seq.topk_logprobs, strict=True)):
        assert len(alternatives) == 3
        assert alternatives[0][0] == token  # greedy takes the most likely token
        assert alternatives[0][1] == pytest.approx(seq.logprobs[step], abs=1e-5)
        np.testing.assert_allclose(
            [v for _, v in alternatives], expected.values[len(prompt) - 1 + step, :3], atol=1e-4
        )


def test_a_shared_prompt_is_prefilled_once_and_samples_the_same(service, tiny_model):
    """Requests that share a prompt reuse its cached prefill (the response says how many
    tokens hit); what they sample and its logprobs equal a fresh prefill's. A checkpoint saved
    again under its name holds new weights, and its cached prompts are not reused."""
    client = service.create_lora_training_client(base_model=str(tiny_model), rank=4, seed=8).result()
    path = client.save_weights_for_sampler("cached").result().path
    sampler = service.create_sampling_client(model_path=path).result()
    prompt = types.ModelInput.from_ints([31, 32, 33, 34, 35, 36])
    greedy = types.SamplingParams(max_tokens=8, temperature=0.0, stop=[])
    first = sampler.sample(prompt, 1, greedy).result()
    group = [sampler.sample(prompt, 1, greedy) for _ in range(4)]
    for future in group:
        again = future.result()
        assert again.prompt_cache_hit_tokens == prompt.length
        assert again.sequences[0].tokens == first.sequences[0].tokens
        np.testing.assert_allclose(again.sequences[0].logprobs, first.sequences[0].logprobs, atol=1e-5)
    scored = sampler.sample(prompt, 1, greedy, include_prompt_logprobs=True).result()
    assert scored.prompt_cache_hit_tokens == 0 and scored.prompt_logprobs[1] is not None

    train(client, [datum([31, 32, 33, 34, 35, 36, 90, 91])], steps=3, lr=5e-2)
    client.save_weights_for_sampler("cached").result()  # the same path, new weights
    fresh = service.create_sampling_client(model_path=path).result().sample(prompt, 1, greedy).result()
    snapshot = client.save_weights_and_get_sampling_client().result().sample(prompt, 1, greedy).result()
    assert fresh.prompt_cache_hit_tokens == 0
    np.testing.assert_allclose(fresh.sequences[0].logprobs, snapshot.sequences[0].logprobs, atol=1e-5)
    assert fresh.sequences[0].logprobs != pytest.approx(first.sequences[0].logprobs, abs=1e-3)


def test_the_next_turn_reuses_the_last_turns_cache(service, tiny_model):
    """A prompt that extends an earlier prompt and its completion (an agent's next turn)
    prefills only what is new; its sampled tokens and logprobs equal an uncached prefill's."""
    client = service.create_lora_training_client(base_model=str(tiny_model), rank=4, seed=2).result()
    path = client.save_weights_for_sampler("turns").result().path
    sampler = service.create_sampling_client(model_path=path).result()
    greedy = types.SamplingParams(max_tokens=6, temperature=0.0, stop=[])
    first_prompt = [41, 42, 43, 44, 45, 46, 47]
    first = sampler.sample(types.ModelInput.from_ints(first_prompt), 1, greedy).result().sequences[0]
    turn = first_prompt + list(first.tokens) + [60, 61, 62]  # the completion, then a tool's reply
    cached = sampler.sample(types.ModelInput.from_ints(turn), 1, greedy).result()
    assert cached.prompt_cache_hit_tokens == len(first_prompt) + len(first.tokens) - 1
    # Asking for prompt logprobs bypasses the cache: a full prefill to compare with.
    full = sampler.sample(types.ModelInput.from_ints(turn), 1, greedy, include_prompt_logprobs=True).result()
    assert full.prompt_cache_hit_tokens == 0
    assert cached.sequences[0].tokens == full.sequences[0].tokens
    np.testing.assert_allclose(cached.sequences[0].logprobs, full.sequences[0].logprobs, atol=1e-5)

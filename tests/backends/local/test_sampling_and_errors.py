"""Sampling stop rules and bad input, through the real tinker SDK."""

import json
import platform

import anyio
import anyio.lowlevel
import httpx
import pytest
import tinker
import torch
from tinker import types

from platoon.backends.local.devices import pick_attention, pick_device, pick_dtype
from platoon.backends.local.engine import Engine
from platoon.backends.local.sampler import SampleParams, Sampler, SampleRequest
from platoon.backends.local.specs import EngineError, WeightsRef

GREEDY = dict(temperature=0.0)
PROMPT = types.ModelInput.from_ints([21, 22, 23, 24])


def datum(tokens, weights=None):
    inputs = {"target_tokens": tokens[1:], "weights": weights or [1.0] * (len(tokens) - 1)}
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


@pytest.fixture
def base_sampler(service, tiny_model):
    return service.create_sampling_client(base_model=str(tiny_model)).result()


def greedy_tokens(sampler, n=12, **params):
    out = sampler.sample(PROMPT, 1, types.SamplingParams(max_tokens=n, **GREEDY, **params)).result()
    return out.sequences[0]


def test_stop_token_is_included_and_ends_the_sequence(base_sampler):
    free = greedy_tokens(base_sampler, stop=[]).tokens
    stop = free[3]
    cut = free.index(stop) + 1
    seq = greedy_tokens(base_sampler, stop=[stop])
    assert seq.tokens == free[:cut] and seq.stop_reason == "stop"
    assert len(seq.logprobs) == len(seq.tokens)


def test_stop_string_is_included(base_sampler, tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    free = greedy_tokens(base_sampler, stop=[]).tokens
    text = tokenizer.decode(free[:5])
    stop = text[-2:] if text[-2:].strip() else text[-3:]
    seq = greedy_tokens(base_sampler, stop=[stop])
    assert seq.stop_reason == "stop"
    assert stop in tokenizer.decode(seq.tokens)
    assert stop not in tokenizer.decode(seq.tokens[:-1])


def test_max_tokens_and_eos(base_sampler, tiny_model):
    seq = greedy_tokens(base_sampler, n=5, stop=[])
    assert len(seq.tokens) == 5 and seq.stop_reason == "length"
    # With stop=None the tokenizer's EOS stops the sequence; the greedy path here never emits it.
    implicit = greedy_tokens(base_sampler, n=5)
    assert implicit.tokens == seq.tokens


def test_bad_training_input_is_a_user_error_and_the_server_keeps_serving(service, tiny_model):
    client = service.create_lora_training_client(base_model=str(tiny_model), rank=4).result()
    good = [datum([1, 2, 3, 4, 5])]
    cases = [
        ([datum([1, 2, 10_000, 4])], "cross_entropy", None, "outside the vocabulary"),
        ([datum([1, 2, 3, 4], weights=[1.0, 1.0])], "cross_entropy", None, "has 2 values for 3 input tokens"),
        (good, "stable_reinforce", None, "needs provenance on every datum"),
        (good, "custom", None, "server-side custom losses"),
        (good, "no_such_loss", None, "unsupported loss_fn 'no_such_loss'"),
        (good, "cross_entropy", {"beta": 1.0}, "does not take loss_fn_config"),
        (good, "importance_sampling", None, "needs loss_fn_inputs"),
    ]
    for data, loss_fn, config, message in cases:
        # Checked whole before it is queued: a 400, not a future that fails later.
        with pytest.raises(tinker.BadRequestError, match=message) as info:
            client.forward_backward(data, loss_fn, config).result()
        assert info.value.status_code == 400 and info.value.body["category"] == "user"
        assert client.forward(good, "cross_entropy").result().metrics["loss:sum"] > 0


def test_unknown_ids_and_paths_are_user_errors(service, tiny_model):
    client = service.create_lora_training_client(base_model=str(tiny_model), rank=4).result()
    real_id = client.model_id
    client.model_id = real_id + "0"
    with pytest.raises(tinker.BadRequestError, match="unknown model_id"):
        client.forward([datum([1, 2, 3])], "cross_entropy").result()
    client.model_id = real_id
    with pytest.raises(tinker.RequestFailedError, match="no checkpoint"):
        service.create_training_client_from_state("tinker://nope/weights/missing").result()
    with pytest.raises(tinker.BadRequestError, match="no checkpoint"):
        service.create_sampling_client(model_path="tinker://nope/sampler_weights/missing").result()
    with pytest.raises(tinker.BadRequestError, match="unknown base_model"):
        service.create_sampling_client(base_model="not/this-model").result()
    sampler = service.create_sampling_client(base_model=str(tiny_model)).result()
    with pytest.raises(tinker.BadRequestError, match="outside the vocabulary"):
        sampler.sample(
            types.ModelInput.from_ints([1, 99_999]), 1, types.SamplingParams(max_tokens=2)
        ).result()
    assert sampler.sample(PROMPT, 1, types.SamplingParams(max_tokens=2)).result().sequences


def test_requests_after_the_session_finished_are_refused(base_url, tiny_model):
    service = tinker.ServiceClient(base_url=base_url, api_key="tml-test")
    client = service.create_lora_training_client(base_model=str(tiny_model), rank=4).result()
    sampler = service.create_sampling_client(base_model=str(tiny_model)).result()
    holder = service.holder
    session_id = holder.get_session_id()

    async def finish() -> None:
        with holder.aclient(tinker.lib.client_connection_pool_type.ClientConnectionPoolType.TRAIN) as http:
            await http.post(
                f"/api/v1/sessions/{session_id}/finish", body={"reason": {"type": "success"}}, cast_to=object
            )

    holder.run_coroutine_threadsafe(finish()).result()
    with pytest.raises(tinker.BadRequestError, match="has finished"):
        client.forward([datum([1, 2, 3])], "cross_entropy").result()
    with pytest.raises(tinker.BadRequestError, match="has finished"):
        sampler.sample(PROMPT, 1, types.SamplingParams(max_tokens=2)).result()
    service.close("success").result()
    # Other sessions are unaffected.
    other = tinker.ServiceClient(base_url=base_url, api_key="tml-test")
    fresh = other.create_sampling_client(base_model=str(tiny_model)).result()
    assert fresh.sample(PROMPT, 1, types.SamplingParams(max_tokens=2)).result().sequences
    other.close("success").result()


def test_capabilities_and_health(service, tiny_model):
    caps = (
        tinker.RestClient(base_url=service._base_url, api_key="tml-test").get_server_capabilities().result()
    )
    assert caps.supported_models[0].model_name == str(tiny_model)
    raw = httpx.get(f"{service._base_url}/api/v1/get_server_capabilities").json()["platoon"]
    assert raw["device"] == "cpu" and raw["dtype"] == "float32" and raw["attention"] == "sdpa"  # as asked


def test_the_device_is_chosen_automatically(monkeypatch):
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_dtype(torch.device("cpu"), None) == torch.float32
    assert pick_dtype(torch.device("cpu"), "bfloat16") == torch.bfloat16
    with pytest.raises(EngineError, match="unknown dtype"):
        pick_dtype(torch.device("cpu"), "int8")
    with pytest.raises(EngineError, match="unknown device"):
        pick_device("quantum")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto") == torch.device("cpu")
    with pytest.raises(EngineError, match="no CUDA device"):
        pick_device("cuda:1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert pick_device("auto") == torch.device("cuda")
    assert pick_dtype(torch.device("cuda"), "auto") == torch.bfloat16
    assert pick_attention(torch.device("cpu")) == "sdpa"


@pytest.mark.anyio
async def test_concurrent_requests_share_decoding_steps(tiny_model, tmp_path):
    engine = Engine(str(tiny_model), checkpoint_dir=tmp_path, device="cpu")
    sampler = Sampler(engine, lambda fn: anyio.to_thread.run_sync(fn))
    params = SampleParams(max_tokens=16, stop_tokens=frozenset())
    results = []

    async def one(i: int) -> None:
        results.append(
            await sampler.sample(SampleRequest([3 + i, 4, 5, 6 + 2 * i], 1, params, False, WeightsRef()))
        )

    async with anyio.create_task_group() as tg:
        tg.start_soon(sampler.run)
        async with anyio.create_task_group() as requests:
            for i in range(8):
                requests.start_soon(one, i)
        tg.cancel_scope.cancel()
    assert all(len(r.sequences[0].tokens) == 16 for r in results)
    assert sampler.steps <= 16 + 2  # 8 requests x 16 tokens in about 16 batched steps, not 128


@pytest.mark.anyio
@pytest.mark.parametrize("batched", [True, False], ids=["as-probed", "row-by-row"])
async def test_a_batch_invariant_sampler_draws_the_same_numbers_alone_and_in_any_batch(
    tiny_model, tmp_path, batched
):
    """`train.reproducible`: a seeded request's tokens and logprobs, to the last bit, do not
    depend on which requests share its batches (of other lengths, arriving while it decodes):
    decoded in one forward where this machine's kernels allow it (the suite's do), else a
    forward per row."""
    import random

    engine = Engine(str(tiny_model), checkpoint_dir=tmp_path, device="cpu")
    sampler = Sampler(engine, lambda fn: anyio.to_thread.run_sync(fn), batch_invariant=True)
    sampler.batch_rows = batched
    targets = [[11, 12, 13, 14, 15], [40, 41, 42]]

    def request(prompt: list[int], seed: int) -> SampleRequest:
        return SampleRequest(prompt, 1, SampleParams(max_tokens=12, seed=seed), False, WeightsRef())

    async with anyio.create_task_group() as tg:
        tg.start_soon(sampler.run)
        alone = [await sampler.sample(request(t, 7 + i)) for i, t in enumerate(targets)]
        crowded = {}

        async def one(key: object, prompt: list[int], seed: int, yields: int) -> None:
            for _ in range(yields):  # arrive while the others decode
                await anyio.lowlevel.checkpoint()
            crowded[key] = await sampler.sample(request(prompt, seed))

        rng = random.Random(0)
        async with anyio.create_task_group() as requests:
            for i, t in enumerate(targets):
                requests.start_soon(one, i, t, 7 + i, 2 + 3 * i)
            for i in range(7):
                prompt = [rng.randrange(20, 200) for _ in range(rng.randrange(2, 12))]
                requests.start_soon(one, f"other{i}", prompt, i, rng.randrange(0, 6))
        tg.cancel_scope.cancel()
    for i, result in enumerate(alone):
        assert crowded[i].sequences[0].tokens == result.sequences[0].tokens
        assert crowded[i].sequences[0].logprobs == result.sequences[0].logprobs  # exactly
    expected = batched and platform.machine() == "x86_64"  # the suite's MKL, one thread
    assert list(sampler.batched_for.values()) == ([expected] if batched else [])


@pytest.mark.anyio
@pytest.mark.skipif(platform.machine() != "x86_64", reason="MKL's kernels, measured on x86-64 only")
async def test_prompts_of_other_lengths_prefilled_in_one_padded_forward_get_the_numbers_they_get_alone(
    tiny_model, tmp_path
):
    """`train.reproducible` with rows decoded in one forward: prompts that arrive together are
    prefilled together, left-padded to the longest (an agent's turns, hundreds of tokens each),
    and each row's tokens, logprobs and prompt logprobs are, to the last bit, those it gets alone."""
    import random

    engine = Engine(str(tiny_model), checkpoint_dir=tmp_path, device="cpu")
    sampler = Sampler(engine, lambda fn: anyio.to_thread.run_sync(fn), batch_invariant=True)
    rng = random.Random(1)
    prompts = [[rng.randrange(20, 200) for _ in range(n)] for n in (300, 287, 260, 299, 41, 38)]

    def request(i: int) -> SampleRequest:
        params = SampleParams(max_tokens=6, seed=i)
        return SampleRequest(prompts[i], 1, params, i in (1, 4), WeightsRef())

    async with anyio.create_task_group() as tg:
        tg.start_soon(sampler.run)
        alone = [await sampler.sample(request(i)) for i in range(len(prompts))]
        steps = sampler.steps
        together: dict[int, object] = {}

        async def one(i: int) -> None:
            together[i] = await sampler.sample(request(i))

        async with anyio.create_task_group() as requests:
            for i in range(len(prompts)):
                requests.start_soon(one, i)
        tg.cancel_scope.cancel()
    assert sampler.rows_batched and sampler.steps - steps < 6 * len(prompts)  # they shared steps
    for i, result in enumerate(alone):
        assert together[i].sequences[0].tokens == result.sequences[0].tokens
        assert together[i].sequences[0].logprobs == result.sequences[0].logprobs  # exactly
        assert together[i].prompt_logprobs == result.prompt_logprobs


@pytest.mark.anyio
@pytest.mark.skipif(platform.machine() != "x86_64", reason="MKL's kernels, measured on x86-64 only")
async def test_a_reproducible_agents_next_turns_reuse_its_cache_and_draw_what_a_full_prefill_draws(
    tiny_model, tmp_path
):
    """`train.reproducible` with rows decoded in one forward: an agent's next turn (its last
    prompt, the completion, a tool's reply) prefills only what it adds, and every token and
    logprob is, to the last bit, what a sampler without a prefix cache draws. Two agents at once,
    their turns across the attention's key blocks."""
    import random

    engine = Engine(str(tiny_model), checkpoint_dir=tmp_path, device="cpu")
    rng = random.Random(4)
    starts = [[rng.randrange(20, 200) for _ in range(n)] for n in (90, 57)]
    replies = [[rng.randrange(20, 200) for _ in range(n)] for n in (25, 40, 3)]

    async def conversations(sampler: Sampler) -> list[list[tuple[object, int]]]:
        """Each agent's turns: (its sequence, the prompt tokens its turn found cached)."""
        turns: list[list[tuple[object, int]]] = [[], []]

        async def agent(i: int) -> None:
            prompt = starts[i]
            for n, reply in enumerate(replies):
                params = SampleParams(max_tokens=7, seed=10 * i + n)
                result = await sampler.sample(SampleRequest(prompt, 1, params, False, WeightsRef()))
                turns[i].append((result.sequences[0], result.cache_hit_tokens))
                prompt = [*prompt, *result.sequences[0].tokens, *reply]

        async with anyio.create_task_group() as tg:
            tg.start_soon(sampler.run)
            async with anyio.create_task_group() as agents:
                for i in range(len(starts)):
                    agents.start_soon(agent, i)
            tg.cancel_scope.cancel()
        return turns

    cached = Sampler(engine, lambda fn: anyio.to_thread.run_sync(fn), batch_invariant=True)
    uncached = Sampler(
        engine, lambda fn: anyio.to_thread.run_sync(fn), batch_invariant=True, prefix_cache_bytes=0
    )
    with_cache, without = await conversations(cached), await conversations(uncached)
    assert cached.rows_batched
    for i, turns in enumerate(with_cache):
        drawn = 0  # the last turn's prompt and completion but its last token (never fed)
        for n, ((sequence, hit), (alone, none)) in enumerate(zip(turns, without[i], strict=True)):
            assert sequence.tokens == alone.tokens and sequence.logprobs == alone.logprobs  # exactly
            assert hit == drawn and none == 0
            prompt = len(starts[i]) + sum(
                len(t.tokens) + len(r) for (t, _), r in zip(turns[:n], replies[:n], strict=True)
            )
            drawn = prompt + len(sequence.tokens) - 1


def test_a_request_refused_at_decoding_does_not_wedge_the_client(service, tiny_model):
    """Refused before it runs, the request still uses up its place in the model's order: the
    client's next forward_backward and optim_step answer instead of waiting for it forever."""
    client = service.create_lora_training_client(base_model=str(tiny_model), rank=4).result()
    good = [datum([1, 2, 3, 4, 5])]
    two_d = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2]),
        loss_fn_inputs={"target_tokens": types.TensorData(data=[2, 3, 4, 5], dtype="int64", shape=[2, 2])},
    )
    with pytest.raises(tinker.APIStatusError, match=r"text|1-D|dimension|shape"):
        client.forward_backward(good, "cross_entropy", {"mode": "fast"}).result(timeout=60)
    with pytest.raises(tinker.APIStatusError):
        client.forward_backward([two_d], "cross_entropy").result(timeout=60)
    out = client.forward_backward(good, "cross_entropy").result(timeout=60)
    assert out.metrics["loss:sum"] > 0
    client.optim_step(types.AdamParams(learning_rate=1e-4)).result(timeout=60)


def test_seeded_rows_draw_from_the_distribution_each_by_its_own_seed():
    """A seeded row's token depends on its seed and its probabilities alone (not on the rows
    beside it), follows those probabilities, and never is a token top-k cut."""
    from platoon.backends.local.sampler import _draw

    logits = torch.log(torch.tensor([0.2, 0.5, 0.0001, 0.2999])).repeat(4000, 1)

    def seeded(n: int) -> torch.Generator:
        return torch.Generator().manual_seed(n)

    params = SampleParams(max_tokens=1, temperature=1.0)
    drawn = _draw(logits, params, [seeded(n) for n in range(4000)])
    share = torch.bincount(drawn, minlength=4).float() / 4000
    assert torch.allclose(share, torch.tensor([0.2, 0.5, 0.0001, 0.2999]), atol=0.025), share
    alone = torch.cat([_draw(logits[:1], params, [seeded(n)]) for n in range(50)])
    assert alone.tolist() == drawn[:50].tolist()  # the same seed, the same token, in any batch
    mixed = _draw(logits[:3], params, [seeded(0), None, seeded(2)])
    assert mixed[[0, 2]].tolist() == drawn[[0, 2]].tolist()
    cut = _draw(
        logits, SampleParams(max_tokens=1, temperature=1.0, top_k=2), [seeded(n) for n in range(4000)]
    )
    assert set(cut.tolist()) == {1, 3}


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the tinker SDK's own loop is asyncio's
async def test_a_prompt_over_the_window_is_refused_in_words_an_agent_can_read(
    base_sampler, tiny_model, anyio_backend
):
    """Through platoon's sampler and the gateway's error: the server's reason, not the SDK's
    internals (`self.model_cls=<class 'tinker.SampleResponse'>` reached agents once)."""
    from platoon.gateway.errors import sampler_error
    from platoon.policy import SampleParams
    from platoon.policy.tinker import TinkerSampler

    window = json.loads((tiny_model / "config.json").read_text())["max_position_embeddings"]
    with pytest.raises(Exception) as caught:
        await TinkerSampler(base_sampler).sample([21] * (window + 10), SampleParams(max_tokens=4))
    error = sampler_error(caught.value)
    assert error.kind == "context_length", error
    text = str(error)
    assert str(window) in text, text  # the window, from the server's own message
    assert not any(word in text for word in ("self.", "model_cls", "request_id", "<class")), text

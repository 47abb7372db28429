"""Batch-invariant batched decoding: rows attended one by one, products of at least 4 rows."""

from __future__ import annotations

import inspect
import itertools
import platform
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from platoon.backends.local.invariant import (
    GROUP_TOKENS,
    KEY_BLOCK,
    MIN_ROWS,
    PADDING_SLACK,
    blocked_attention,
    full_attention_only,
    holds,
    per_row_attention,
    prefill_groups,
    topped_up,
)
from platoon.backends.local.kvcache import cache_of


def cache_arg(model) -> str:  # transformers 5 names it `cache`, 4.x `past_key_values`
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [18]]


@pytest.fixture(scope="module")
def model(tiny_model):
    return AutoModelForCausalLM.from_pretrained(str(tiny_model), attn_implementation="sdpa").eval()


def left_padded(prompts: list[list[int]]) -> dict[str, torch.Tensor]:
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt) :] = torch.tensor(prompt)
        mask[i, width - len(prompt) :] = 1
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


@torch.no_grad()
def test_rows_attended_one_by_one_get_what_each_prompt_gets_alone(model):
    with per_row_attention(model):
        batched = model(**left_padded(PROMPTS), use_cache=False).logits[:, -1]
    assert model.config._attn_implementation == "sdpa"  # switched back
    for i, prompt in enumerate(PROMPTS):
        alone = model(input_ids=torch.tensor([prompt]), use_cache=False).logits[0, -1]
        torch.testing.assert_close(batched[i], alone, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_a_decoding_step_on_a_left_padded_cache_attends_only_to_each_rows_own_keys(model):
    step = left_padded(PROMPTS)
    with per_row_attention(model):
        out = model(**step, use_cache=True)
        mask = torch.cat([step["attention_mask"], torch.ones(len(PROMPTS), 1, dtype=torch.long)], dim=1)
        following = torch.tensor([[30], [31], [32], [33]])
        positions = torch.tensor([[len(p)] for p in PROMPTS])
        decoded = model(
            input_ids=following,
            attention_mask=mask,
            position_ids=positions,
            **{cache_arg(model): cache_of(out)},
            use_cache=True,
        ).logits[:, -1]
    for i, prompt in enumerate(PROMPTS):
        alone = model(input_ids=torch.tensor([[*prompt, 30 + i]]), use_cache=False).logits[0, -1]
        torch.testing.assert_close(decoded[i], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="MKL's kernels, measured on x86-64 only")
def test_one_threads_mkl_products_are_row_invariant_from_four_rows(model):
    """The suite's arithmetic (tests/conftest.py: MKL's AVX2 branch, one thread) passes the probe,
    so the learning tests decode their reproducible rows in one forward."""
    assert torch.get_num_threads() == 1
    assert holds(model, cache_arg(model))


@torch.no_grad()
def test_a_sequence_gets_the_same_numbers_however_it_is_cut_into_forwards(model):
    """Attended in key blocks, a position's keys, values and logits are, to the last bit, the same
    from one prefill as from a prefill, extensions on its cache across block ends and decoded
    tokens: what lets a reproducible sampler reuse a cached prefix. (SDPA's are not.)"""
    generator = torch.Generator().manual_seed(3)
    sequence = torch.randint(model.config.vocab_size, (1, 2 * KEY_BLOCK + 20), generator=generator)
    rows = sequence.expand(MIN_ROWS, -1)  # every product at least MIN_ROWS rows, as the sampler runs them
    cuts = (37, KEY_BLOCK, KEY_BLOCK + 1, 2 * KEY_BLOCK + 3, 2 * KEY_BLOCK + 19, 2 * KEY_BLOCK + 20)
    with per_row_attention(model):
        whole = model(input_ids=rows, use_cache=True)
        cache = None
        pieces = []
        for start, end in itertools.pairwise((0, *cuts)):
            kwargs = {} if cache is None else {cache_arg(model): cache}
            positions = torch.arange(start, end).expand(MIN_ROWS, -1)
            out = model(input_ids=rows[:, start:end], position_ids=positions, use_cache=True, **kwargs)
            cache = cache_of(out)
            pieces.append(out.logits)
    assert torch.equal(torch.cat(pieces, dim=1), whole.logits)
    for cut, held in zip(cache_of(whole).layers, cache.layers, strict=True):
        assert torch.equal(cut.keys, held.keys) and torch.equal(cut.values, held.values)


def test_blocked_attention_is_causal_softmax_attention_with_grouped_heads():
    """Against the textbook formula in float64: queries on top of earlier keys (a cache), four
    query heads sharing each of two key heads, keys across several blocks, a second row behind
    left padding, half precision in."""
    generator = torch.Generator().manual_seed(0)
    keys, queries, dim, pad = 2 * KEY_BLOCK + 9, 70, 16, 5
    query = torch.randn(1, 8, queries, dim, generator=generator)
    key, value = (torch.randn(1, 2, keys, dim, generator=generator) for _ in range(2))
    scores = query.double() @ key.double().repeat_interleave(4, 1).transpose(-1, -2) * 0.3
    hidden = torch.arange(keys)[None] > torch.arange(keys - queries, keys)[:, None]
    expected = scores.masked_fill(hidden, float("-inf")).softmax(-1) @ value.double().repeat_interleave(4, 1)
    out = blocked_attention(query, key, value, None, 0.3)
    assert out.shape == (1, queries, 8, dim) and out.dtype == torch.float32
    torch.testing.assert_close(out.transpose(1, 2).double(), expected, atol=1e-5, rtol=1e-5)
    # Beside a row whose keys start `pad` later (its first queries are padding): the same, exactly.
    padded = [
        torch.cat([t, torch.nn.functional.pad(t[:, :, :-pad], (0, 0, pad, 0))]) for t in (query, key, value)
    ]
    both = blocked_attention(*padded, torch.tensor([0, pad]), 0.3)
    assert torch.equal(both[0], out[0])
    assert torch.equal(both[1, pad:], out[0, : queries - pad])  # its own keys: the same numbers
    half = blocked_attention(query.bfloat16(), key.bfloat16(), value.bfloat16(), None, 0.3)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.transpose(1, 2).double(), expected, atol=0.05, rtol=0.05)


class BatchDependent(torch.nn.Module):
    """A model whose logits move in their last bits with the batch's size, as a kernel chosen by
    the number of rows would make them."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(()))
        self.config = SimpleNamespace(vocab_size=11, _attn_implementation="sdpa")

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        rows, width = input_ids.shape
        logits = torch.ones(rows, width, 11) * (1 + rows * 1e-7)
        return SimpleNamespace(logits=logits)


def test_the_probe_refuses_products_whose_rows_change_with_the_batch():
    assert not holds(BatchDependent(), "cache")


def test_a_model_with_a_sliding_window_is_not_decoded_in_batches():
    windowed = SimpleNamespace(config=SimpleNamespace(layer_types=["full_attention", "sliding_attention"]))
    full = SimpleNamespace(config=SimpleNamespace(layer_types=["full_attention"], sliding_window=None))
    unused = SimpleNamespace(config=SimpleNamespace(sliding_window=4096, use_sliding_window=False))
    mistral = SimpleNamespace(config=SimpleNamespace(sliding_window=4096))
    assert not full_attention_only(windowed) and not full_attention_only(mistral)
    assert full_attention_only(full) and full_attention_only(unused)


def test_a_short_batch_is_topped_up_with_copies_of_its_first_row():
    assert topped_up(1).tolist() == [0] * MIN_ROWS
    assert topped_up(3).tolist() == [0, 1, 2, 0]
    assert topped_up(MIN_ROWS) is None and topped_up(9) is None


@pytest.mark.anyio
async def test_each_kind_of_adapter_is_probed_on_its_own(tiny_model, tmp_path):
    """An adapter adds products of other shapes (rank by width), so its forwards are probed
    apart from the base weights', and two adapters of one rank and targets share a probe."""
    import anyio

    from platoon.backends.local.engine import Engine
    from platoon.backends.local.sampler import SampleParams, Sampler, SampleRequest
    from platoon.backends.local.specs import LoraSpec, WeightsRef

    engine = Engine(str(tiny_model), checkpoint_dir=tmp_path, device="cpu")
    for name, rank in (("a", 4), ("b", 4), ("c", 8)):
        engine.create_model(name, LoraSpec(rank=rank, seed=0))
    sampler = Sampler(engine, lambda fn: anyio.to_thread.run_sync(fn), batch_invariant=True)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sampler.run)
        for weights in (
            WeightsRef(),
            WeightsRef(model_id="a"),
            WeightsRef(model_id="b"),
            WeightsRef(model_id="c"),
        ):
            request = SampleRequest([11, 12, 13], 2, SampleParams(max_tokens=3, seed=1), False, weights)
            assert len((await sampler.sample(request)).sequences) == 2
        tg.cancel_scope.cancel()
    assert [kind and kind[0] for kind in sampler.batched_for] == [None, 4, 8]


def test_a_mask_shared_by_every_row_is_read_for_each():
    from types import SimpleNamespace

    from platoon.backends.local.invariant import rows_attention

    module = SimpleNamespace(num_key_value_groups=1, is_causal=True, training=False)
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(3, 2, n, 8, generator=generator) for n in (1, 5, 5))
    alone, _ = rows_attention(module, query, key, value, None)
    shared, _ = rows_attention(module, query, key, value, torch.ones(1, 1, 1, 5, dtype=torch.bool))
    assert shared.shape == (3, 1, 2, 8) and torch.equal(shared, alone)


def test_prompts_share_a_prefill_by_what_they_add_or_padded_where_rows_attend_alone():
    a, b, c, d = (1,) * 100, (2,) * 96, (3,) * 100, (4,) * 10
    assert prefill_groups([a, b, c, d], {}, invariant=False, rows_batched=False) == [[a, c], [b], [d]]
    assert prefill_groups([a, b, d], {}, invariant=True, rows_batched=False) == [[a], [b], [d]]
    # Longest first; a prompt joins while the group's padding stays within PADDING_SLACK.
    assert prefill_groups([d, b, a, c], {}, invariant=True, rows_batched=True) == [[a, c, b], [d]]
    many = [(5,) * n for n in range(1, 300, 7)]
    for group in prefill_groups(many, {}, invariant=True, rows_batched=True):
        assert len(group) * len(group[0]) <= PADDING_SLACK * sum(map(len, group))
    assert sorted(p for g in prefill_groups(many, {}, True, True) for p in g) == sorted(many)
    # A group's forward stays within GROUP_TOKENS; a longer prompt prefills alone.
    long = [(6,) * (GROUP_TOKENS // 3)] * 5 + [(7,) * (GROUP_TOKENS + 1)]
    assert [len(g) for g in prefill_groups(long, {}, True, True)] == [1, 3, 2]
    # A prompt whose start is cached counts the tokens it adds: an agent's long next turn
    # (88 cached, 8 added) goes with a short new prompt, not with one that adds 100.
    assert prefill_groups([a, b, d], {b: 88}, invariant=True, rows_batched=True) == [[a], [d, b]]
    # Elsewhere a forward shares the number of tokens reused as well as the length.
    assert prefill_groups([a, c, (8,) * 100], {c: 50}, invariant=False, rows_batched=False) == [
        [a, (8,) * 100],
        [c],
    ]

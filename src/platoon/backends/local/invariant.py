"""Batch-invariant sampling (`train.reproducible`): a row's numbers never depend on its batch.

Requests arrive when they arrive, so which rows share a forward differs from run to run; for the
same seed to give the same run, a row's logits must be the same alone and beside any others. A
batched forward breaks that in two places:

- attention, whose reductions over keys run over the batch's padded width: `rows_attention`
  (registered with transformers as `ATTENTION`) attends each row over its own keys alone, in
  fixed blocks of keys (`blocked_attention`), so a row's numbers do not depend either on how its
  sequence was cut into forwards: a prefix cached from an earlier forward is exact;
- matrix products, whose kernels change with the number of rows: MKL multiplies one row with
  one kernel and 4 or more with another, whose rows never depend on each other. So every product
  gets at least `MIN_ROWS` rows: a short batch is topped up with copies of its first row.

Whether the second holds here (the BLAS, its threads, the device) is checked once, on the model,
by `holds`; where it does not (measured: MKL with 2 threads splits 5 to 7 rows between them), the
sampler runs a forward per row instead (`Sampler._decode_each`): the same guarantee, several times slower.
Where it holds, prompts of different lengths also prefill together, left-padded (`prefill_groups`):
a row that attends alone gets the same numbers beside padding as without it; and the sampler's
prefix cache is on (an agent's next turn prefills only what it adds), as `holds` checks too.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence

import torch

ATTENTION = "platoon_rows"
MIN_ROWS = 4
# Keys are attended in blocks of this many, from a row's first: every reduction over keys then
# runs over the same numbers in the same order, however many keys follow (`blocked_attention`).
KEY_BLOCK = 64
# At most this many scores are held at once (a long prefill attends a chunk of queries at a time).
_SCORES = 1 << 22
# Short prompts, batches of every remainder by 4 and 8 rows: about a second on SmolLM2-135M.
_PROBE_LENGTHS = (1, 2, 1, 2, 2, 1)
_PROBE_BATCHES = (5, 6, 7, 9, 13)
# A sequence cut into a prefill, an extension across a key block's end, and a decoded token.
_PROBE_CUTS = (30, KEY_BLOCK + 5, KEY_BLOCK + 6)


def rows_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Causal attention, each row over its own keys (the left padding, where the mask hides a
    row's first keys, is moved out of the way, not masked): `blocked_attention`."""
    for name in ("softcap", "position_bias", "s_aux"):  # what the model adds to its scores
        if kwargs.get(name) is not None:
            raise ValueError(f"reproducible sampling's attention does not take `{name}`")
    starts = None
    if attention_mask is not None:
        attention_mask = attention_mask.expand(query.shape[0], -1, -1, -1)  # one mask may serve all rows
        seen = attention_mask[:, 0, -1]  # the last query sees every key of its row
        if seen.dtype != torch.bool:
            seen = seen == 0  # an additive mask: 0 where a key is seen
        starts = key.shape[2] - seen.sum(-1)
    return blocked_attention(query, key, value, starts, scaling), None


def blocked_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    starts: torch.Tensor | None = None,
    scaling: float | None = None,
) -> torch.Tensor:
    """Causal attention of rows (`query` [rows, heads, q, d], `key` and `value` [rows, kv heads,
    k, d]; a row's keys from its `starts` on, left padding before; its queries the last q
    positions), in float32, as [rows, q, heads, d]. A query's numbers are the same whatever the
    rows beside it, the sequence's length and however it was cut into forwards (a prefill, a
    cached prefix extended, a token decoded), so a cached prefix changes nothing.

    SDPA's reductions over keys run over the call's keys in blocks that depend on their
    number: a query's softmax differs in its last bits between a prefill of 100 keys and one of
    37. Here a row's keys go in fixed blocks of `KEY_BLOCK` from its first: each block's products
    have the same shape (`MIN_ROWS` query rows at least), each block is summed alone, and the
    blocks' sums are added in order (a cumulative sum: left to right). Hidden keys and the blocks
    past a query's last key add exact zeros. Queries go `KEY_BLOCK` at a time, each chunk over
    the blocks its last query sees (a causal prefill's half).
    """
    rows, heads, queries, dim = query.shape
    kv_heads, width = key.shape[1], key.shape[2]
    group = heads // kv_heads  # query heads per key head (grouped-query attention)
    scale = dim**-0.5 if scaling is None else scaling
    device = query.device
    # Each row's keys and values from its first column on, zero-padded (or, past a shorter
    # row's own, anything: never seen) to whole blocks: one copy of each.
    lengths = torch.full((rows,), width, device=device) if starts is None else width - starts
    keys = width if starts is None else width - int(starts.min())  # the longest row's
    padded = -(-keys // KEY_BLOCK) * KEY_BLOCK
    if starts is not None and bool(starts.any()):
        index = (torch.arange(padded, device=device) + starts[:, None]).clamp(max=width - 1)
        index = index[:, None, :, None].expand(rows, kv_heads, padded, dim)
        key, value = key.gather(2, index), value.gather(2, index)
    elif padded > keys:
        key, value = (torch.nn.functional.pad(t, (0, 0, 0, padded - keys)) for t in (key, value))
    key, value = key.float(), value.float()
    out = torch.empty(rows, kv_heads, group, queries, dim, dtype=torch.float32, device=device)
    grouped = query.float().view(rows, kv_heads, group, queries, dim) * scale
    step = max(1, min(KEY_BLOCK, _SCORES // (rows * heads * (keys + KEY_BLOCK))))
    for first in range(0, queries, step):
        last = min(queries, first + step)
        blocks = -(-(keys - queries + last) // KEY_BLOCK)  # enough for the chunk's last query
        k, v = (
            t[:, :, : blocks * KEY_BLOCK].view(rows, kv_heads, blocks, KEY_BLOCK, dim) for t in (key, value)
        )
        q = grouped[:, :, :, first:last].reshape(rows, kv_heads, group * (last - first), dim)
        needed = group * (last - first)
        if needed < MIN_ROWS:  # a product's kernel changes below MIN_ROWS rows
            q = torch.cat([q, q[:, :, :1].expand(rows, kv_heads, MIN_ROWS - needed, dim)], 2)
        scores = torch.matmul(q[:, :, None], k.transpose(-1, -2))  # [rows, kv heads, blocks, q, block]
        # Each query's position in its row (a padding query's, below 0, read as 0: never used).
        offsets = torch.arange(q.shape[2], device=device) % (last - first) + first - queries
        position = (lengths[:, None] + offsets).clamp(min=0)
        keys_at = torch.arange(blocks * KEY_BLOCK, device=device).view(1, 1, blocks, 1, KEY_BLOCK)
        scores.masked_fill_(keys_at > position.view(rows, 1, 1, -1, 1), float("-inf"))
        # the max is a constant of the softmax (detached: the trainer differentiates through here)
        weights = scores.sub_(scores.detach().amax(dim=(2, 4), keepdim=True)).exp_()
        total = weights.sum(-1).cumsum(2)[:, :, -1]  # [rows, kv heads, q]
        mixed = torch.matmul(weights, v).cumsum(2)[:, :, -1]  # [rows, kv heads, q, d]
        chunk = (mixed / total[..., None])[:, :, :needed]
        out[:, :, :, first:last] = chunk.view(rows, kv_heads, group, last - first, dim)
    return out.view(rows, heads, queries, dim).transpose(1, 2).to(query.dtype)


def _register() -> None:
    from transformers import AttentionInterface  # with the model

    AttentionInterface.register(ATTENTION, rows_attention)
    with contextlib.suppress(ImportError):  # transformers < 4.53 builds a 4-d additive mask itself
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionMaskInterface.register(ATTENTION, sdpa_mask)


@contextlib.contextmanager
def per_row_attention(model: torch.nn.Module) -> Iterator[None]:
    """Within: `model` attends row by row. The engine's single worker thread runs every
    forward, so the trainer never sees the switch."""
    config = model.config
    before = config._attn_implementation
    _register()
    config._attn_implementation = ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = before


def full_attention_only(model: torch.nn.Module) -> bool:
    """Whether every layer attends to all earlier keys (no sliding window): the masks
    `rows_attention` reads are then padding and causality alone."""
    config = model.config
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return False
    return getattr(config, "sliding_window", None) is None or not getattr(config, "use_sliding_window", True)


# How much of a padded prefill may be padding: a group's rows x its longest prompt, at most this
# many times its prompts' tokens (padding costs the products' time, though never their numbers).
PADDING_SLACK = 1.25
# A group's rows x its longest prompt, at most (a longer prompt prefills alone, as it did before
# prompts were grouped): the forward's activations grow with it.
GROUP_TOKENS = 16384


def prefill_groups(
    prompts: list[tuple[int, ...]], hits: dict[tuple[int, ...], int], invariant: bool, rows_batched: bool
) -> list[list[tuple[int, ...]]]:
    """The prompts that share a prefill forward, each on top of the first `hits[prompt]` of its
    tokens (from the prefix cache; none when missing): those that add the same tokens on top of
    the same number; for batch-invariant rows, each alone, unless rows attend alone
    (`rows_batched`), when any share one left-padded forward (those that add the most first, each
    group's padding bounded by `PADDING_SLACK` and its size by `GROUP_TOKENS`)."""
    if not invariant:
        same: dict[tuple[int, int], list[tuple[int, ...]]] = {}
        for prompt in prompts:
            same.setdefault((len(prompt), hits.get(prompt, 0)), []).append(prompt)
        return list(same.values())
    if not rows_batched:
        return [[prompt] for prompt in prompts]

    def added(prompt: tuple[int, ...]) -> int:
        return len(prompt) - hits.get(prompt, 0)

    groups: list[list[tuple[int, ...]]] = []
    tokens = 0
    for prompt in sorted(prompts, key=added, reverse=True):
        group = groups[-1] if groups else None
        padded = (len(group) + 1) * added(group[0]) if group else 0
        if group and padded <= GROUP_TOKENS and padded <= PADDING_SLACK * (tokens + added(prompt)):
            group.append(prompt)
            tokens += added(prompt)
        else:
            groups.append([prompt])
            tokens = added(prompt)
    return groups


def left_padded(
    prompts: Sequence[Sequence[int]], device: torch.device, reused: Sequence[int] = ()
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The prompts' ids left-padded to the longest and, where any is shorter or follows tokens
    already in the KV cache (`reused`, each row's count, its cache left-padded to the most), the
    forward's `attention_mask` (the cache's columns, then the ids') and `position_ids` that
    leave the padding out."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long, device=device)
    if all(len(p) == width for p in prompts) and not any(reused):
        return ids, {}
    starts = torch.tensor([width - len(p) for p in prompts], device=device)
    mask = (torch.arange(width, device=device) >= starts[:, None]).long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    if any(reused):
        most = max(reused)
        kept = torch.tensor(reused, device=device)[:, None]
        positions = positions + kept
        mask = torch.cat([(torch.arange(most, device=device) >= most - kept).long(), mask], 1)
    return ids, {"attention_mask": mask, "position_ids": positions}


def topped_up(count: int) -> torch.Tensor | None:
    """The rows to run for a batch of `count`: `count` and copies of row 0 up to `MIN_ROWS`
    (None when the batch is long enough)."""
    if count >= MIN_ROWS:
        return None
    return torch.tensor([*range(count), *[0] * (MIN_ROWS - count)], dtype=torch.long)


@torch.no_grad()
def holds(model: torch.nn.Module, cache_arg: str) -> bool:
    """Whether batched forwards of at least `MIN_ROWS` rows give each row the same logits here,
    whatever rows share the batch (prompts of a few tokens, each alone, with copies of itself,
    and left-padded in batches of several sizes), and whatever forwards a sequence was cut into
    (one prefill, or a prefill, an extension on its cache and a decoded token): compared to the
    last bit. `cache_arg` names the forward's KV cache argument."""
    from transformers import DynamicCache  # with the model

    if not full_attention_only(model):
        return False
    device = next(model.parameters()).device
    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(vocab, (n,), generator=generator).tolist() for n in _PROBE_LENGTHS]

    def logits(rows: list[int]) -> torch.Tensor:  # as the sampler prefills them
        ids, padding = left_padded([prompts[r] for r in rows], device)
        with per_row_attention(model):
            out = model(input_ids=ids, use_cache=False, **padding)
        return out.logits[:, -1].float()

    alone = [logits([r] * MIN_ROWS)[0] for r in range(len(prompts))]
    for size in _PROBE_BATCHES:
        rows = [(size + j) % len(prompts) for j in range(size)]
        batched = logits(rows)
        if not all(torch.equal(batched[i], alone[r]) for i, r in enumerate(rows)):
            return False

    sequence = torch.randint(vocab, (1, _PROBE_CUTS[-1]), generator=generator).to(device)
    cache = DynamicCache()
    cut = torch.empty(0)
    with per_row_attention(model):
        whole = model(input_ids=sequence.expand(MIN_ROWS, -1), use_cache=False).logits[0, -1]
        for start, end in itertools.pairwise((0, *_PROBE_CUTS)):
            positions = torch.arange(start, end, device=device).expand(MIN_ROWS, -1)
            ids = sequence[:, start:end].expand(MIN_ROWS, -1)
            cut = model(input_ids=ids, position_ids=positions, use_cache=True, **{cache_arg: cache}).logits
    return torch.equal(cut[0, -1], whole)

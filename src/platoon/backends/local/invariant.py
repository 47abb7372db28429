"""Batch-invariant sampling (`train.reproducible`): a row's numbers never depend on its batch.

Requests arrive when they arrive, so which rows share a forward differs from run to run; for the
same seed to give the same run, a row's logits must be the same alone and beside any others. A
batched forward breaks that in two places:

- attention, whose reductions over keys run over the batch's padded width: `rows_attention`
  (registered with transformers as `ATTENTION`) attends each row over its own keys alone;
- matrix products, whose kernels change with the number of rows: MKL multiplies one row with
  one kernel and 4 or more with another, whose rows never depend on each other. So every product
  gets at least `MIN_ROWS` rows: a short batch is topped up with copies of its first row.

Whether the second holds here (the BLAS, its threads, the device) is checked once, on the model,
by `holds`; where it does not (measured: MKL with 2 threads splits 5 to 7 rows between them), the
sampler runs a forward per row instead (`Sampler._decode_each`): the same guarantee, several times slower.
Where it holds, prompts of different lengths also prefill together, left-padded (`prefill_groups`):
a row that attends alone gets the same numbers beside padding as without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

ATTENTION = "platoon_rows"
MIN_ROWS = 4
# Short prompts, batches of every remainder by 4 and 8 rows: about a second on SmolLM2-135M.
_PROBE_LENGTHS = (1, 2, 1, 2, 2, 1)
_PROBE_BATCHES = (5, 6, 7, 9, 13)


def rows_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, row by row over each row's own keys: the left padding
    (where the mask hides a row's first keys) is cut off, not masked."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # with the model

    rows, _, queries, keys = query.shape[0], query.shape[1], query.shape[2], key.shape[2]
    starts = [0] * rows
    if attention_mask is not None:
        attention_mask = attention_mask.expand(rows, -1, -1, -1)  # one mask may serve all rows
        seen = attention_mask[:, 0, -1]  # the last query sees every key of its row
        if seen.dtype != torch.bool:
            seen = seen == 0  # an additive mask: 0 where a key is seen
        starts = (keys - seen.sum(-1)).tolist()
    outputs = []
    for i, start in enumerate(starts):
        first = max(0, start - (keys - queries))  # the row's first query that is not padding
        mask = None
        if attention_mask is not None and 1 < queries - first < keys - start:
            mask = attention_mask[i : i + 1, :, first:, start:]  # queries on top of a cache
        out, _ = sdpa_attention_forward(
            module,
            query[i : i + 1, :, first:],
            key[i : i + 1, :, start:],
            value[i : i + 1, :, start:],
            mask,
            **kwargs,
        )
        if first:
            out = torch.nn.functional.pad(out, (0, 0, 0, 0, first, 0))
        outputs.append(out)
    return torch.cat(outputs), None


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
    prompts: list[tuple[int, ...]], invariant: bool, rows_batched: bool
) -> list[list[tuple[int, ...]]]:
    """The prompts that share a prefill forward: those of one length; for batch-invariant rows,
    each alone, unless rows attend alone (`rows_batched`), when prompts of any lengths share one
    left-padded forward (longest first, each group's padding bounded by `PADDING_SLACK` and its
    size by `GROUP_TOKENS`)."""
    if not invariant:
        same: dict[int, list[tuple[int, ...]]] = {}
        for prompt in prompts:
            same.setdefault(len(prompt), []).append(prompt)
        return list(same.values())
    if not rows_batched:
        return [[prompt] for prompt in prompts]
    groups: list[list[tuple[int, ...]]] = []
    tokens = 0
    for prompt in sorted(prompts, key=len, reverse=True):
        group = groups[-1] if groups else None
        padded = (len(group) + 1) * len(group[0]) if group else 0
        if group and padded <= GROUP_TOKENS and padded <= PADDING_SLACK * (tokens + len(prompt)):
            group.append(prompt)
            tokens += len(prompt)
        else:
            groups.append([prompt])
            tokens = len(prompt)
    return groups


def left_padded(
    prompts: Sequence[Sequence[int]], device: torch.device
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The prompts' ids left-padded to the longest and, where any is shorter, the forward's
    `attention_mask` and `position_ids` that leave the padding out."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long, device=device)
    if all(len(p) == width for p in prompts):
        return ids, {}
    starts = torch.tensor([width - len(p) for p in prompts], device=device)
    mask = (torch.arange(width, device=device) >= starts[:, None]).long()
    return ids, {"attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


def topped_up(count: int) -> torch.Tensor | None:
    """The rows to run for a batch of `count`: `count` and copies of row 0 up to `MIN_ROWS`
    (None when the batch is long enough)."""
    if count >= MIN_ROWS:
        return None
    return torch.tensor([*range(count), *[0] * (MIN_ROWS - count)], dtype=torch.long)


@torch.no_grad()
def holds(model: torch.nn.Module) -> bool:
    """Whether batched forwards of at least `MIN_ROWS` rows give each row the same logits here,
    whatever rows share the batch: prompts of a few tokens, each alone (with copies of itself)
    and left-padded in batches of several sizes, compared to the last bit."""
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
    return True

"""The KV cache of a transformers model as tensors: each attention layer's keys and values,
[rows, heads, positions, head_dim], read and replaced whole (rows dropped, rows merged)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from transformers import DynamicCache
    from transformers.cache_utils import CacheLayerMixin
    from transformers.utils import ModelOutput

__all__ = ["cache_of", "kv", "left_pad", "set_kv", "stacked"]


def cache_of(out: ModelOutput) -> DynamicCache:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _attention(layer: object) -> CacheLayerMixin:
    """A layer of a model's KV cache: an attention layer's, of keys and values (every model
    served is a decoder of attention layers)."""
    from transformers.cache_utils import CacheLayerMixin  # transformers loads when a model does

    assert isinstance(layer, CacheLayerMixin), f"not an attention layer's KV cache: {type(layer).__name__}"
    return layer


def kv(layer: object) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values of a filled layer of a KV cache."""
    attention = _attention(layer)
    keys, values = attention.keys, attention.values
    assert keys is not None and values is not None, "a KV cache layer is filled"
    return keys, values


def set_kv(layer: object, keys: torch.Tensor, values: torch.Tensor) -> None:
    attention = _attention(layer)
    attention.keys, attention.values = keys, values


def left_pad(t: torch.Tensor, width: int, dim: int = 2) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim) + [missing, 0]
    return F.pad(t, pad)


def stacked(
    layers: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]] | None],
    lengths: Sequence[int],
    width: int | None = None,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer, the first `lengths[r]` keys and values of each row's `layers[r]` (one row
    each; None for a row that has none, whose length is 0), left-padded to `width` (default:
    the longest) and stacked into one tensor of rows."""
    some = next(row for row in layers if row is not None)
    width = max(lengths) if width is None else width
    blank = some[0][0][:, :, :0]

    def rows(i: int, j: int) -> torch.Tensor:  # layer i's keys (j = 0) or values (j = 1)
        return torch.cat(
            [
                left_pad(row[i][j][:, :, :n] if row else blank, width)
                for row, n in zip(layers, lengths, strict=True)
            ]
        )

    return [(rows(i, 0), rows(i, 1)) for i in range(len(some))]

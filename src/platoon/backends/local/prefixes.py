"""The sampler's prefix cache: the KV caches of recent prompts and finished sequences, so that a
task's group prefills its prompt once and a conversation's next turn only what it adds."""

from __future__ import annotations

from collections import OrderedDict

import msgspec
import torch

__all__ = ["Prefix", "PrefixCache", "Space"]


class Prefix(msgspec.Struct):
    """The KV cache (one row per layer) of a token sequence, and the logits that follow it when
    it was a whole prompt (None for a finished sequence, kept for the next turn that extends it)."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    logits: torch.Tensor | None  # [1, vocab]
    tokens: int

    @property
    def nbytes(self) -> int:
        head = self.logits.nbytes if self.logits is not None else 0
        return head + sum(k.nbytes + v.nbytes for k, v in self.layers)


Space = tuple[object, ...]  # one set of fixed weights: (weights key, generation)


class PrefixCache:
    """KV caches of recent prompts and finished sequences, per set of fixed weights, least
    recently used first out, at most `max_bytes` in all.

    A new prompt takes the longest cached sequence it starts with: all of it when it is the same
    prompt (a task's group), or a prefix (the next turn of a conversation, which extends the last
    prompt and its completion), so only the rest is prefilled. Live training weights
    (`WeightsRef.model_id`) change with every step and are never cached; a checkpoint path saved
    again under its name gets a new generation, so old entries miss.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[Space, tuple[int, ...]], Prefix] = OrderedDict()
        self._lengths: dict[Space, dict[int, int]] = {}  # per space: length -> entries of it
        self._bytes = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, space: Space, prompt: tuple[int, ...]) -> Prefix | None:
        """The longest entry that `prompt` starts with and that leaves something to reuse: the
        whole prompt with its logits, or a shorter sequence (at least one token of it)."""
        for n in sorted(self._lengths.get(space, {}), reverse=True):
            if n > len(prompt):
                continue
            key = (space, prompt if n == len(prompt) else prompt[:n])
            entry = self._entries.get(key)
            if entry is None or (n == len(prompt) and entry.logits is None and n == 1):
                continue
            self._entries.move_to_end(key)
            self.hits += 1
            return entry
        return None

    def put(self, space: Space, tokens: tuple[int, ...], entry: Prefix) -> None:
        """Keep `entry`; one with logits replaces one without for the same tokens, not the reverse."""
        key = (space, tokens)
        old = self._entries.get(key)
        if entry.nbytes > self.max_bytes or (
            old is not None and (old.logits is not None or entry.logits is None)
        ):
            return
        if old is not None:
            self._drop(key)
        self._entries[key] = entry
        self._bytes += entry.nbytes
        lengths = self._lengths.setdefault(space, {})
        lengths[len(tokens)] = lengths.get(len(tokens), 0) + 1
        while self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[Space, tuple[int, ...]]) -> None:
        entry = self._entries.pop(key)
        self._bytes -= entry.nbytes
        lengths = self._lengths[key[0]]
        lengths[len(key[1])] -= 1
        if not lengths[len(key[1])]:
            del lengths[len(key[1])]
            if not lengths:
                del self._lengths[key[0]]

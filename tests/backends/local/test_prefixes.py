"""The sampler's prefix cache: longest match, bytes bound, least recently used out."""

import pytest

torch = pytest.importorskip("torch")

from platoon.backends.local.prefixes import Prefix, PrefixCache  # noqa: E402


def test_the_prefix_cache_keeps_the_longest_match_within_its_bytes():

    def entry(n: int, logits: bool = True) -> Prefix:
        kv = torch.zeros(1, 1, n, 2)  # 8 bytes a token per tensor
        return Prefix(layers=[(kv, kv.clone())], logits=torch.zeros(1, 4) if logits else None, tokens=n)

    cache = PrefixCache(max_bytes=16 * 10 + 16 * 3)
    space = ("key", 0)
    cache.put(space, (1, 2, 3), entry(3))
    cache.put(space, (1, 2, 3, 4, 5, 6), entry(6, logits=False))
    assert cache.longest(space, (1, 2, 3, 4, 5, 6, 7)).tokens == 6
    assert cache.longest(space, (1, 2, 3)).tokens == 3
    assert cache.longest(space, (1, 2, 9)) is None
    assert cache.longest(("other", 0), (1, 2, 3)) is None
    cache.put(space, (7, 8, 9, 10), entry(4))  # over the budget: the least recently used goes
    assert cache.longest(space, (1, 2, 3, 4, 5, 6, 7)).tokens == 3 and len(cache) == 2

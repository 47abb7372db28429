"""The embedded engine's device facts: memory a CPU step freed goes back to the system."""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

from platoon.backends.local.devices import release_freed_memory  # noqa: E402


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim is Linux's")
def test_memory_a_cpu_step_freed_is_handed_back_not_kept_for_the_next_allocation():
    # Many small tensors, as a backward pass leaves: glibc serves them from its heap, and keeps
    # the heap when they are freed (a large one it would have mapped and unmapped on its own).
    chunks = [torch.ones(4096) for _ in range(40_000)]  # 16 KiB each, 640 MiB in all
    del chunks
    kept = _rss()
    release_freed_memory(torch.device("cpu"))
    assert kept - _rss() > 256 * 2**20
    release_freed_memory(torch.device("meta"))  # not the CPU: nothing to do, and no error

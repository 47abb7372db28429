"""The event catalogue's helpers."""

from platoon.bus.events import derive_seed


def test_derived_seeds_leave_room_in_an_int32_and_depend_only_on_their_parts():
    seeds = [derive_seed(7, "train", step, slot) for step in range(50) for slot in range(20)]
    # Every Tinker server takes them: skyrl-tx keeps seed + sample index in an int32.
    assert all(0 <= s < 2**30 for s in seeds)
    assert max(seeds) >= 2**29 and len(set(seeds)) == len(seeds)  # spread over the range, no repeats
    assert derive_seed(7, "train", 3, 4) == derive_seed(7, "train", 3, 4)
    assert derive_seed(7, "train", 3, 4) != derive_seed(7, "train", 4, 3)

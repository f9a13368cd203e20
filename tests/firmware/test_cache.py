"""Data cache: set mapping, LRU/FIFO victims, invalidation, size never exceeded."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cxlssd.firmware.cache import REPLACEMENT_POLICIES, DataCache, assign_last


def cache(policy: str = "lru", pages: int = 8, ways: int = 2) -> DataCache:
    return DataCache(1024, pages, ways, REPLACEMENT_POLICIES.get(policy)(pages))


def test_lru_evicts_least_recently_used_of_the_set() -> None:
    c = cache()  # 4 sets x 2 ways: pages 0, 4, 8 share set 0
    c.insert(0, 1)
    c.insert(4, 2, dirty=True)
    c.policy.hit(c.lookup(0), 3)
    assert c.insert(8, 4) == (4, True)
    assert c.lookup(4) == -1 and c.lookup(0) >= 0 and c.lookup(8) >= 0
    assert c.dirty_evictions == 1


def test_fifo_ignores_hits() -> None:
    c = cache("fifo")
    c.insert(0, 1)
    c.insert(4, 2)
    c.policy.hit(c.lookup(0), 3)
    assert c.insert(8, 4) == (0, False)


def test_invalidate_frees_the_slot() -> None:
    c = cache()
    c.insert(0, 1, dirty=True)
    assert c.invalidate(0) is True
    assert c.invalidate(0) is False
    assert c.occupancy() == 0
    c.insert(4, 2)
    c.insert(8, 3)
    assert c.occupancy() == 2


def test_assign_last_takes_the_last_value() -> None:
    target = np.zeros(4, dtype=np.int64)
    assign_last(target, np.array([1, 2, 1, 1]), np.array([10, 20, 30, 40]))
    assert target.tolist() == [0, 40, 20, 0]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 63), st.integers(0, 2)), max_size=300),
       st.sampled_from(["lru", "fifo"]))
def test_cache_size_never_exceeded_and_maps_stay_consistent(ops, policy) -> None:
    c = cache(policy, pages=8, ways=2)
    for seq, (page, action) in enumerate(ops):
        slot = c.lookup(page)
        if action == 2:
            c.invalidate(page)
        elif slot >= 0:
            c.policy.hit(slot, seq)
        else:
            c.insert(page, seq, dirty=action == 1)
        assert c.occupancy() <= c.n_slots
        held = np.flatnonzero(c.slot_page >= 0)
        assert np.array_equal(c.slot_of_page[c.slot_page[held]], held)
        assert np.count_nonzero(c.slot_of_page >= 0) == held.size
        assert (c.slot_page[held] % c.n_sets == held // c.ways).all()

"""SSD data cache: 4 KiB pages in a set-associative array, replacement pluggable.

Page ``p`` maps to set ``p % n_sets``. The cache only tracks which page is in which
slot, dirtiness and recency (data stays in QEMU's memdev). ``slot_of_page`` is a
dense per-page array so the controller can look a whole batch of requests up at once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import numpy as np

from cxlssd.firmware.registry import Registry

log = logging.getLogger(__name__)


def assign_last(target: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    """``target[index] = values`` where, for repeated indices, the last value wins.

    (numpy does not promise an order for repeated indices in fancy assignment.)
    """
    if index.size == 0:
        return
    _, last_from_end = np.unique(index[::-1], return_index=True)
    pick = index.size - 1 - last_from_end
    target[index[pick]] = values[pick]


class ReplacementPolicy(Protocol):
    """Recency bookkeeping and victim choice of one set-associative cache."""

    def inserted(self, slot: int, seq: int) -> None:
        """Page placed in ``slot`` by request number ``seq``."""
        ...

    def hit(self, slot: int, seq: int) -> None:
        """``slot`` served request number ``seq``."""
        ...

    def hit_batch(self, slots: np.ndarray, seqs: np.ndarray) -> None:
        """Same as :meth:`hit` for each pair, in order (``seqs`` increasing)."""
        ...

    def victim(self, first_slot: int, ways: int) -> int:
        """The slot to evict from the full set ``[first_slot, first_slot + ways)``."""
        ...


REPLACEMENT_POLICIES: Registry[ReplacementPolicy] = Registry(
    "cache replacement policy", "cache.policy"
)


@REPLACEMENT_POLICIES.register("lru")
class LruPolicy:
    """Least recently used: each slot remembers the last request it served."""

    def __init__(self, n_slots: int) -> None:
        self.stamp = np.zeros(n_slots, dtype=np.int64)
        self._stamp = self.stamp.data  # scalar view (cheaper than numpy indexing)

    def inserted(self, slot: int, seq: int) -> None:
        self._stamp[slot] = seq

    def hit(self, slot: int, seq: int) -> None:
        self._stamp[slot] = seq

    def hit_batch(self, slots: np.ndarray, seqs: np.ndarray) -> None:
        assign_last(self.stamp, slots, seqs)

    def victim(self, first_slot: int, ways: int) -> int:
        return first_slot + int(self.stamp[first_slot : first_slot + ways].argmin())


@REPLACEMENT_POLICIES.register("fifo")
class FifoPolicy(LruPolicy):
    """First in, first out: hits do not refresh a page."""

    def hit(self, slot: int, seq: int) -> None:
        pass

    def hit_batch(self, slots: np.ndarray, seqs: np.ndarray) -> None:
        pass


class DataCache:
    """Which device pages sit in the SSD DRAM cache, and where."""

    def __init__(
        self, device_pages: int, capacity_pages: int, ways: int, policy: ReplacementPolicy
    ) -> None:
        self.ways = ways
        self.n_sets = capacity_pages // ways
        self.n_slots = self.n_sets * ways
        self.policy = policy
        self.slot_page = np.full(self.n_slots, -1, dtype=np.int64)
        self.slot_of_page = np.full(device_pages, -1, dtype=np.int32)
        self.dirty = np.zeros(self.n_slots, dtype=bool)
        self.set_fill = [0] * self.n_sets
        self.evictions = 0
        self.dirty_evictions = 0
        # scalar views of the arrays above (cheaper per element than numpy indexing)
        self._slot_page = self.slot_page.data
        self._slot_of_page = self.slot_of_page.data
        self._dirty = self.dirty.data

    @contextlib.contextmanager
    def published(self, path: Path) -> Iterator[None]:
        """Keep which page sits in which slot (``slot_of_page``, int32, -1: not cached) in
        the shared file ``path`` while the context lasts, for the TCG plugin: under
        transparent switching it asks the firmware about reads of pages not cached only
        (docs/host-os.md). The file has an entry per device page of the guest's devices; one
        too small for this cache's device is left saying "not cached" everywhere (the plugin
        then asks about every read). Afterwards the file says so again and the cache keeps
        a private copy."""
        shared = np.memmap(path, dtype=np.int32, mode="r+")
        n = len(self.slot_of_page)
        if len(shared) < n:
            log.warning("cache map %s has %d entries for %d device pages: not published",
                        path, len(shared), n)
        else:
            shared[:n] = self.slot_of_page
            self.slot_of_page = shared[:n]
            self._slot_of_page = self.slot_of_page.data
        try:
            yield
        finally:
            self.slot_of_page = np.array(self.slot_of_page, dtype=np.int32)
            self._slot_of_page = self.slot_of_page.data
            shared[:] = -1
            shared.flush()
            del shared

    def lookup(self, page: int) -> int:
        """The slot holding ``page``, or -1."""
        return int(self.slot_of_page[page])

    def insert(self, page: int, seq: int, dirty: bool = False) -> tuple[int, bool]:
        """Place ``page`` (not cached); returns the evicted page (or -1) and its dirtiness."""
        ways = self.ways
        cache_set = page % self.n_sets
        first = cache_set * ways
        slot_page, slot_of_page, dirty_bits = self._slot_page, self._slot_of_page, self._dirty
        victim_page, victim_dirty = -1, False
        if self.set_fill[cache_set] < ways:
            slot = first + slot_page[first : first + ways].tolist().index(-1)
            self.set_fill[cache_set] += 1
        else:
            slot = self.policy.victim(first, ways)
            victim_page = slot_page[slot]
            victim_dirty = bool(dirty_bits[slot])
            slot_of_page[victim_page] = -1
            self.evictions += 1
            self.dirty_evictions += victim_dirty
        slot_page[slot] = page
        slot_of_page[page] = slot
        dirty_bits[slot] = dirty
        self.policy.inserted(slot, seq)
        return victim_page, victim_dirty

    def invalidate(self, page: int) -> bool:
        """Drop ``page`` if cached (it moved to host DRAM); returns whether it was dirty."""
        slot = int(self.slot_of_page[page])
        if slot < 0:
            return False
        was_dirty = bool(self.dirty[slot])
        self.slot_page[slot] = -1
        self.slot_of_page[page] = -1
        self.dirty[slot] = False
        self.set_fill[slot // self.ways] -= 1
        return was_dirty

    def occupancy(self) -> int:
        return int(np.count_nonzero(self.slot_page >= 0))

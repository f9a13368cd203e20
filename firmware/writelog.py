"""Cacheline write log: the part of the SSD DRAM that absorbs host writes.

Each entry is one 64 B line plus its 8 B address (72 B). The index from line address
to entry is a per-page 64-bit mask (bit ``i`` = line ``i`` of the page is logged): a
rewrite of a logged line overwrites its entry in place. When the number of entries
reaches ``flush_threshold x capacity`` the log flushes *all* its entries in the
background: lines are coalesced by page; a page is read from flash first only when
it is neither fully logged nor in the data cache; then the page is programmed once.
Flushed entries keep their space until the flush's programs are estimated done, so
writes arriving while the log is full stall until then.

``program_interval_ns`` (0: off; the ``flush-throttle`` knob) throttles flushing to
at most one page program per interval: a flush of P pages then holds its entries'
space for at least P x interval after it starts, so the log fills and appends stall.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from cxlssd.firmware.cache import DataCache
from cxlssd.firmware.flash import FlashBackend
from cxlssd.firmware.request import LINES_PER_PAGE

ALL_LINES = (1 << LINES_PER_PAGE) - 1


@dataclass
class LogCounters:
    appends: int = 0  # entries added
    overwrites: int = 0  # writes to a line already logged
    flushes: int = 0
    flushed_entries: int = 0
    flushed_pages: int = 0  # pages programmed by flushes
    flushed_full_pages: int = 0  # ... that were fully logged (no merge read)
    flushed_cached_pages: int = 0  # ... merged with their cached copy (no merge read)
    full_stalls: int = 0  # appends that waited for space
    full_stall_ns: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class WriteLog:
    """Line-granular write log in front of the data cache and the flash."""

    def __init__(
        self,
        device_pages: int,
        capacity_entries: int,
        flush_threshold: float,
        cache: DataCache,
        flash: FlashBackend,
    ) -> None:
        self.capacity = capacity_entries
        self.flush_level = max(1, int(flush_threshold * capacity_entries))
        self.cache = cache
        self.flash = flash
        self.mask = np.zeros(device_pages, dtype=np.uint64)
        self.live = 0  # entries in the index
        self.inflight = 0  # entries of the flush in progress (space not yet reusable)
        self.inflight_done_ns = 0
        self.program_interval_ns = 0
        self.counters = LogCounters()

    def contains(self, page: int, line: int) -> bool:
        return bool(int(self.mask[page]) >> line & 1)

    def _retire(self, time_ns: int) -> None:
        if self.inflight and time_ns >= self.inflight_done_ns:
            self.inflight = 0

    def _make_room(self, entries: int, time_ns: int) -> int:
        """Time at which ``entries`` more entries fit (stalling for a flush if needed)."""
        if entries > self.capacity:  # would wait forever; the profile check prevents it
            raise ValueError(f"{entries} entries can never fit a log of {self.capacity}")
        self._retire(time_ns)
        start = time_ns
        while self.live + self.inflight + entries > self.capacity:
            if not self.inflight:
                self.flush(time_ns)
            time_ns = max(time_ns, self.inflight_done_ns)
            self.inflight = 0
        if time_ns > start:
            self.counters.full_stalls += 1
            self.counters.full_stall_ns += time_ns - start
        return time_ns

    def append(self, page: int, line_mask: int, time_ns: int) -> int:
        """Log the lines ``line_mask`` of ``page`` at ``time_ns``; returns when it was done
        (later than ``time_ns`` only if the log was full)."""
        old = int(self.mask[page])
        new = line_mask & ~old
        added = new.bit_count()
        self.counters.overwrites += line_mask.bit_count() - added
        if not added:
            return time_ns
        time_ns = self._make_room(added, time_ns)
        self.mask[page] = old | new
        self.live += added
        self.counters.appends += added
        if self.live >= self.flush_level:
            self._retire(time_ns)
            if not self.inflight:  # else: flush again once the one in progress is done
                self.flush(time_ns)
        return time_ns

    def flush(self, time_ns: int) -> None:
        """Write every logged page to flash, coalesced, starting at ``time_ns``."""
        pages = np.flatnonzero(self.mask)
        if pages.size == 0:
            return
        masks = self.mask[pages]
        self.mask[pages] = 0
        full = masks == np.uint64(ALL_LINES)
        slots = self.cache.slot_of_page[pages]
        cached = slots >= 0
        done = time_ns
        flash = self.flash
        for page, needs_old in zip(pages.tolist(), (~(full | cached)).tolist(), strict=True):
            if needs_old:
                flash.read(page, time_ns, cause="merge")
            done = max(done, flash.program(page, time_ns))
        if self.program_interval_ns:
            done = max(done, time_ns + int(pages.size) * self.program_interval_ns)
        # cached copies now hold the merged data, which is on flash: they are clean
        self.cache.dirty[slots[cached]] = False
        c = self.counters
        c.flushes += 1
        c.flushed_entries += self.live
        c.flushed_pages += int(pages.size)
        c.flushed_full_pages += int(np.count_nonzero(full))
        c.flushed_cached_pages += int(np.count_nonzero(cached & ~full))
        self.inflight += self.live
        self.inflight_done_ns = max(self.inflight_done_ns, done)
        self.live = 0

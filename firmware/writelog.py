"""Cacheline write log: the part of the SSD DRAM that absorbs host writes (SkyByte).

Each entry is one 64 B line plus its 8 B address (72 B). Every write *appends* an
entry; if the line was logged already, its older entry is invalidated (it still
occupies space until compaction). The index from line address to its valid entry is
a per-page 64-bit mask (bit ``i`` = line ``i`` of the page has a valid entry).

Compaction starts when the entries in use (valid and invalidated) reach
``flush_threshold x capacity`` and runs down to ``compact_to x capacity``: it takes
pages in the order of their oldest entry, merges each page's valid lines into one
page (reading the old page from flash only when it is neither fully logged nor in
the data cache) and programs it once. As in SkyByte's artifact (ftl.cc
``flush_log_region``), the flush goes page by page, waits for each merge read (one
after another) and issues each program without waiting for it: a page's entries are
free again once the flush has gone past it, and an append that finds the log full
stalls until the flush has freed enough. The programs occupy the dies but hold no log
space; a read, the flush's own merge reads included, waits for the program in progress
on its die, not for the ones queued behind it (as the artifact's
``ssd_advance_status``: scheduler.py).

Until the flush has gone past its page, a line being flushed is still read from the
log (:meth:`WriteLog.contains`), as the artifact's index keeps a page's entries until
its flush reaches them.

With the flash's ``idle_at_roi_begin`` the compaction in progress when a ROI begins
ends there (:meth:`WriteLog.end_flush`). With ``flush_at_roi_begin`` a ROI starts
from an empty log: the whole log is compacted when the ROI begins, its merge reads
and programs all issued then (not one page after another), as
SkyByte's artifact starts its measured pass (main.cc ``flush_log_region_warmup`` after
the warm-up pass; ftl.cc ``warmup_write_log`` replays that flush's reads and programs on
the units at time 0 of the measured run).

``program_interval_ns`` (0: off; the ``flush-throttle`` knob) throttles compaction to
at most one page program per interval: the i-th page of a compaction then gives its
entries back no sooner than i x interval after it starts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from cxlssd.firmware.cache import DataCache
from cxlssd.firmware.flash import FlashBackend
from cxlssd.firmware.request import LINES_PER_PAGE

ALL_LINES = (1 << LINES_PER_PAGE) - 1
NEVER = 1 << 62  # no page of a flush left to free


@dataclass
class LogCounters:
    appends: int = 0  # entries written (one per line write)
    invalidations: int = 0  # appends that invalidated an older entry of the same line
    compactions: int = 0
    compacted_entries: int = 0  # entries freed by compactions (valid and invalidated)
    compacted_lines: int = 0  # valid lines merged into pages
    programs: int = 0  # pages programmed by compactions
    merge_reads: int = 0  # ... that needed the old page from flash first
    full_pages: int = 0  # ... that were fully logged (no merge read)
    cached_pages: int = 0  # ... merged with their cached copy (no merge read)
    full_stalls: int = 0  # appends that waited for space
    full_stall_ns: int = 0
    roi_flushes: int = 0  # compactions of the whole log at a ROI's beginning

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class WriteLog:
    """Line-granular, append-only write log in front of the data cache and the flash."""

    def __init__(
        self,
        device_pages: int,
        capacity_entries: int,
        flush_threshold: float,
        cache: DataCache,
        flash: FlashBackend,
        compact_to: float = 0.0,
        flush_at_roi_begin: bool = False,
    ) -> None:
        self.capacity = capacity_entries
        self.flush_at_roi_begin = flush_at_roi_begin
        self.flush_level = max(1, int(flush_threshold * capacity_entries))
        self.low_level = min(int(compact_to * capacity_entries), self.flush_level - 1)
        self.cache = cache
        self.flash = flash
        self.mask = np.zeros(device_pages, dtype=np.uint64)  # valid lines per page
        self.page_entries = np.zeros(device_pages, dtype=np.int64)  # entries in use per page
        self.page_first = np.zeros(device_pages, dtype=np.int64)  # append number of its oldest
        # the lines of the compactions in flight, readable from the log until the flush
        # has gone past their page
        self.flush_mask = np.zeros(device_pages, dtype=np.uint64)
        self.flush_until_ns = np.zeros(device_pages, dtype=np.int64)
        self.used = 0  # entries in use (valid + invalidated), outside a compaction
        self.inflight = 0  # entries of the compaction in progress (space not yet reusable)
        self.inflight_done_ns = 0  # when the last of them is free again
        # the flush in progress, page by page: when each page's entries are free (ascending),
        # the entries freed by then (cumulative), and the next page not yet given back
        self._free_ns = np.zeros(0, dtype=np.int64)
        self._free_cum = np.zeros(0, dtype=np.int64)
        self._next_free = 0
        self.next_free_ns = NEVER  # when that page frees: retire has nothing to do before
        self.appended = 0  # appends so far (orders pages by their oldest entry)
        self.program_interval_ns = 0
        self.counters = LogCounters()

    def contains(self, page: int, line: int, time_ns: int) -> bool:
        """Whether a read of ``line`` of ``page`` at ``time_ns`` finds it in the log."""
        if int(self.mask[page]) >> line & 1:
            return True
        return bool(int(self.flush_mask[page]) >> line & 1) and time_ns < int(self.flush_until_ns[page])

    @property
    def valid(self) -> int:
        """Entries that hold the newest copy of their line."""
        return sum(int(m).bit_count() for m in self.mask[np.flatnonzero(self.mask)])

    def _freed_before(self, index: int) -> int:
        """Entries the flush in progress frees with its pages before ``index``."""
        return int(self._free_cum[index - 1]) if index else 0

    def retire(self, time_ns: int) -> None:
        """Give back the space of the pages the flush in progress has gone through by
        ``time_ns``."""
        if time_ns < self.next_free_ns:  # the common case, kept cheap: called per append
            return
        reached = int(np.searchsorted(self._free_ns, time_ns, side="right"))
        self.inflight -= self._freed_before(reached) - self._freed_before(self._next_free)
        self._next_free = reached
        if time_ns >= self.inflight_done_ns:
            self.inflight = 0
        self.next_free_ns = int(self._free_ns[reached]) if self.inflight else NEVER

    def _make_room(self, entries: int, time_ns: int) -> int:
        """Time at which ``entries`` more entries fit (stalling for the flush if needed)."""
        if entries > self.capacity:  # would wait forever; the profile check prevents it
            raise ValueError(f"{entries} entries can never fit a log of {self.capacity}")
        self.retire(time_ns)
        start = time_ns
        while self.used + self.inflight + entries > self.capacity:
            if not self.inflight:
                self.compact(time_ns, self.used + entries - self.capacity)
                continue
            # wait for the page of the flush that frees enough
            need = self.used + self.inflight + entries - self.capacity
            goal = self._freed_before(self._next_free) + need
            page = min(int(np.searchsorted(self._free_cum, goal, side="left")), self._free_ns.size - 1)
            time_ns = max(time_ns, int(self._free_ns[page]))
            self.retire(time_ns)
        if time_ns > start:
            self.counters.full_stalls += 1
            self.counters.full_stall_ns += time_ns - start
        return time_ns

    def append(self, page: int, line_mask: int, time_ns: int) -> int:
        """Append the lines ``line_mask`` of ``page`` at ``time_ns``; returns when it was
        done (later than ``time_ns`` only if the log was full)."""
        entries = line_mask.bit_count()
        time_ns = self._make_room(entries, time_ns)
        old = int(self.mask[page])
        self.mask[page] = old | line_mask
        if not self.page_entries[page]:
            self.page_first[page] = self.appended
        self.page_entries[page] += entries
        self.appended += entries
        self.used += entries
        self.counters.appends += entries
        self.counters.invalidations += (line_mask & old).bit_count()
        if self.used >= self.flush_level:
            self.retire(time_ns)
            if not self.inflight:  # else: compact once the one in progress is done
                self.compact(time_ns)
        return time_ns

    def roi_begins(self, time_ns: int) -> None:
        """A ROI begins at ``time_ns``: with ``flush_at_roi_begin``, compact every entry
        in use at once (its merge reads and programs issued then, its space free then;
        the ROI's reads wait behind them, as the artifact's measured pass does behind
        its warm-up flush)."""
        if not self.flush_at_roi_begin:
            return
        self.retire(time_ns)
        if self.used:
            self.compact(time_ns, at_least=self.used, at_once=True)
            self.retire(time_ns)
            self.counters.roi_flushes += 1

    def end_flush(self, time_ns: int) -> None:
        """The flash dropped the rest of the compaction in progress at ``time_ns``
        (``flash.idle_at_roi_begin``): its pages are past, their entries free from then,
        as the artifact's flush, which takes no simulated time, leaves no entry in flight
        when its warm-up run ends."""
        np.minimum(self._free_ns, time_ns, out=self._free_ns)
        np.minimum(self.flush_until_ns, time_ns, out=self.flush_until_ns)
        self.inflight_done_ns = min(self.inflight_done_ns, time_ns)
        self.next_free_ns = min(self.next_free_ns, time_ns)
        self.retire(time_ns)

    def quiet_appends(self) -> int:
        """How many single-line appends fit before one starts a compaction or stalls."""
        return max(0, min(self.flush_level - 1 - self.used, self.capacity - self.used - self.inflight))

    def append_batch(self, pages: np.ndarray, lines: np.ndarray) -> None:
        """Append line ``lines[i]`` of ``pages[i]``, in order, as :meth:`append` would one
        by one; the caller knows they are at most :meth:`quiet_appends`."""
        n = int(pages.size)
        unique = np.unique(pages * LINES_PER_PAGE + lines.astype(np.int64))
        upages, ulines = unique >> 6, (unique & (LINES_PER_PAGE - 1)).astype(np.uint64)
        new_lines = int(np.count_nonzero((self.mask[upages] >> ulines) & np.uint64(1) == 0))
        np.bitwise_or.at(self.mask, upages, np.left_shift(np.uint64(1), ulines))
        touched, first, count = np.unique(pages, return_index=True, return_counts=True)
        fresh = self.page_entries[touched] == 0
        self.page_first[touched[fresh]] = self.appended + first[fresh]
        self.page_entries[touched] += count
        self.appended += n
        self.used += n
        self.counters.appends += n
        self.counters.invalidations += n - new_lines

    def _start_flush(self, free_ns: np.ndarray, entries: np.ndarray) -> None:
        """Space in flight: ``entries[i]`` entries free at ``free_ns[i]`` (ascending), with
        what a flush still in progress has not given back."""
        added = int(entries.sum())
        if self.inflight:
            kept = slice(self._next_free, None)
            free_ns = np.concatenate([self._free_ns[kept], free_ns])
            entries = np.concatenate([np.diff(self._free_cum, prepend=0)[kept], entries])
            order = np.argsort(free_ns, kind="stable")
            free_ns, entries = free_ns[order], entries[order]
        self._free_ns = free_ns
        self._free_cum = np.cumsum(entries)
        self._next_free = 0
        self.inflight += added
        self.inflight_done_ns = max(self.inflight_done_ns, int(free_ns[-1]))
        self.next_free_ns = int(free_ns[0])

    def compact(self, time_ns: int, at_least: int = 0, at_once: bool = False) -> None:
        """Merge the oldest pages' lines into flash, starting at ``time_ns``, until the
        log is down to its low-water mark (and at least ``at_least`` entries are freed).
        ``at_once``: every merge read and program is issued at ``time_ns`` and the
        entries are free then, as the artifact books its warm-up's flush at the start
        of its measured run (ftl.cc ``warmup_write_log``: the reads, then the programs,
        all at time 0)."""
        pages = np.flatnonzero(self.page_entries)
        if pages.size == 0:
            return
        goal = max(self.used - self.low_level, at_least)
        if goal < self.used:  # oldest first, until enough entries are freed
            pages = pages[np.argsort(self.page_first[pages], kind="stable")]
            freed = np.cumsum(self.page_entries[pages])
            pages = pages[: int(np.searchsorted(freed, goal)) + 1]
        masks = self.mask[pages]
        page_entries = self.page_entries[pages].copy()
        entries = int(page_entries.sum())
        self.mask[pages] = 0
        self.page_entries[pages] = 0
        full = masks == np.uint64(ALL_LINES)
        slots = self.cache.slot_of_page[pages]
        cached = slots >= 0
        needs_old = ~(full | cached)
        # As SkyByte's flush (artifact ftl.cc flush_log_region): page by page, a merge
        # read waited for, the program issued and not waited for, the log's head moved on:
        # a page's entries are free once the flush has gone past it, whatever its program
        # still takes. (The flush-throttle knob spaces the pages by its interval.)
        done = time_ns
        flash = self.flash
        interval = self.program_interval_ns
        free_ns = np.empty(pages.size, dtype=np.int64)
        for i, (page, merge) in enumerate(zip(pages.tolist(), needs_old.tolist(), strict=True)):
            if merge:
                read_done = flash.read(page, done, cause="merge")
                if not at_once:  # else every read and program is issued at time_ns
                    done = read_done
            flash.program(page, done)
            if interval and not at_once:
                done = max(done, time_ns + (i + 1) * interval)
            free_ns[i] = done
        self._start_flush(free_ns, page_entries)
        self.flush_mask[pages] = masks
        self.flush_until_ns[pages] = free_ns
        # cached copies now hold the merged data, which is on flash: they are clean
        self.cache.dirty[slots[cached]] = False
        c = self.counters
        c.compactions += 1
        c.compacted_entries += entries
        c.compacted_lines += sum(int(m).bit_count() for m in masks.tolist())
        c.programs += int(pages.size)
        c.merge_reads += int(np.count_nonzero(needs_old))
        c.full_pages += int(np.count_nonzero(full))
        c.cached_pages += int(np.count_nonzero(cached & ~full))
        self.used -= entries

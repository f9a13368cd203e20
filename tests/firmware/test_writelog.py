"""Write log: appends with invalidation, compaction per page between water marks, and
when the old page is read."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cxlssd.firmware.cache import REPLACEMENT_POLICIES, DataCache
from cxlssd.firmware.flash import FlashBackend
from cxlssd.firmware.ftl import GC_VICTIM_POLICIES, PageFtl
from cxlssd.firmware.scheduler import FlashTimeline
from cxlssd.firmware.writelog import ALL_LINES, WriteLog

PAGES = 512


def make_log(capacity: int = 16, threshold: float = 0.5, compact_to: float = 0.0,
             flush_at_roi_begin: bool = False) -> WriteLog:
    ftl = PageFtl(PAGES, 4, 16, 0.3, 0.2, GC_VICTIM_POLICIES.get("greedy")())
    flash = FlashBackend(ftl, FlashTimeline(2, 2, 3000, 80000, 1_000_000))
    cache = DataCache(PAGES, 8, 2, REPLACEMENT_POLICIES.get("lru")(8))
    return WriteLog(PAGES, capacity, threshold, cache, flash, compact_to, flush_at_roi_begin)


def test_a_rewrite_appends_and_invalidates_and_compaction_starts_at_the_threshold() -> None:
    log = make_log(capacity=8, threshold=0.5)
    log.append(1, 1 << 0, 0)
    log.append(1, 1 << 0, 10)  # SkyByte: a new entry, the older one invalidated
    assert (log.used, log.valid, log.counters.invalidations) == (2, 1, 1)
    log.append(1, 1 << 1, 20)
    assert log.counters.compactions == 0
    log.append(2, 1 << 5, 30)  # 4 entries in use = 50 % of 8: compaction down to empty
    c = log.counters
    assert (c.compactions, c.compacted_entries, c.compacted_lines, c.programs) == (1, 4, 3, 2)
    assert log.used == 0 and log.inflight == 4 and not log.mask.any()
    assert log.flash.counters.programs_host == 2  # merged per page
    assert log.flash.counters.reads_merge == c.merge_reads == 2  # none full, none cached


def test_compaction_takes_the_oldest_pages_down_to_the_low_water_mark() -> None:
    log = make_log(capacity=16, threshold=0.5, compact_to=0.25)  # from 8 entries down to 4
    for t, page in enumerate([3, 3, 1, 2, 2, 4, 5]):
        log.append(page, 1 << t, t)
    log.append(6, 1, 10)  # 8 entries: compact pages 3 (2 entries), 1, 2 (2): 5 freed
    assert log.counters.programs == 3 and log.used == 3
    assert [p for p in range(8) if log.mask[p]] == [4, 5, 6]


def test_compaction_reads_the_old_page_only_when_neither_full_nor_cached() -> None:
    log = make_log(capacity=256, threshold=1.0)
    log.cache.insert(7, 0)
    log.append(5, ALL_LINES, 0)  # fully logged
    log.append(7, 1, 0)  # cached
    log.append(9, 1, 0)  # neither
    log.compact(100)
    assert log.flash.counters.reads_merge == log.counters.merge_reads == 1
    assert log.counters.full_pages == 1 and log.counters.cached_pages == 1


def test_a_roi_begins_with_an_empty_log_only_when_asked() -> None:
    """flush_at_roi_begin (SkyByte's artifact measures from an empty log): every entry
    in use is compacted when the ROI begins, its programs booked from then on; off, the
    ROI's beginning changes nothing."""
    for flush in (False, True):
        log = make_log(capacity=64, threshold=0.5, flush_at_roi_begin=flush)
        for t, page in enumerate([3, 3, 1, 2, 2]):
            log.append(page, 1 << t, t)
        log.roi_begins(1000)
        c = log.counters
        if not flush:
            assert (log.used, c.compactions, c.roi_flushes, c.programs) == (5, 0, 0, 0)
            continue
        # at once, as the artifact's warm-up flush: the space is free at the ROI's start
        # and the merge reads all start then (pages 1, 2, 3 on three dies: none waits)
        assert (log.used, log.inflight, c.compactions, c.roi_flushes, c.programs) == (0, 0, 1, 1, 3)
        assert log.flash.counters.programs_host == 3 and c.merge_reads == 3
        assert not log.contains(3, 0, 1000)
        timeline = log.flash.timeline
        assert sorted(timeline.fg_busy_ns) == [0, 1000 + 3000, 1000 + 3000, 1000 + 3000]
        log.roi_begins(2000)  # nothing left to flush: no empty compaction
        assert (c.compactions, c.roi_flushes) == (1, 1)


def test_a_compaction_ended_by_an_idle_flash_frees_its_entries_then() -> None:
    """end_flush (flash.idle_at_roi_begin): the flash dropped the rest of the compaction
    in progress, so its entries are free and its lines no longer read from the log."""
    log = make_log(capacity=8, threshold=0.5)
    for t, page in enumerate([1, 2, 3, 4]):
        log.append(page, 1, t)  # 4 entries: a compaction of 4 pages from t=3
    assert log.inflight == 4 and log.inflight_done_ns > 1000
    assert log.contains(4, 0, 1000)  # the flush has not reached page 4 yet
    log.end_flush(1000)
    assert (log.inflight, log.used) == (0, 0)
    assert not any(log.contains(page, 0, 1000) for page in (1, 2, 3, 4))
    assert log.quiet_appends() == 3  # the whole log is free again
    log.end_flush(2000)  # nothing in flight: nothing changes
    assert log.inflight == 0


def test_full_log_stalls_until_the_flush_has_freed_enough() -> None:
    log = make_log(capacity=4, threshold=0.5)
    for page in range(2):
        log.append(page, 1, 0)  # a compaction of 2 entries starts at t=0
    log.append(10, 1, 0)
    log.append(11, 1, 0)  # deferred: a compaction is in flight
    ready = log.append(12, 1, 0)  # 2 in use + 2 in flight = full: stall
    assert 0 < ready < log.inflight_done_ns  # and then the next compaction started
    assert log.counters.full_stalls == 1
    assert log.used + log.inflight <= log.capacity


def test_the_flush_waits_for_its_merge_reads_one_after_another_and_never_for_a_program() -> None:
    """As SkyByte's flush_log_region: space comes back once the flush has read what it
    merges (reads in sequence); the programs keep the dies busy but hold no log space."""
    full = make_log(capacity=256, threshold=1.0)
    for page in (5, 6, 7):
        full.append(page, ALL_LINES, 0)  # fully logged: no merge read
    full.compact(100)
    assert full.inflight_done_ns == 100  # free at once, though 3 programs of 80 us are issued
    assert full.flash.counters.programs_host == 3
    merged = make_log(capacity=256, threshold=1.0)
    for page in (4, 6):  # neither full nor cached: both read from flash first
        merged.append(page, 1, 0)
    merged.compact(100)
    assert merged.counters.merge_reads == 2
    # two 3 us reads, the second issued when the first is out (issued together they
    # would be out at 3 100 ns)
    assert merged.inflight_done_ns >= 100 + 2 * 3000


def test_a_line_being_flushed_is_read_from_the_log_until_the_flush_passes_its_page() -> None:
    """As the artifact's flush_log_region, which drops a page's index entries only when
    it reaches the page: the log still serves the lines the flush has not reached."""
    log = make_log(capacity=256, threshold=1.0)
    for page in (4, 6):
        log.append(page, 1, 0)
    log.compact(100)  # two merge reads in sequence: page 4 is passed first
    first, second = int(log.flush_until_ns[4]), int(log.flush_until_ns[6])
    assert 100 < first < second
    assert log.contains(6, 0, first) and not log.contains(4, 0, first)
    assert log.contains(6, 0, second - 1) and not log.contains(6, 0, second)
    assert not log.contains(6, 1, 0)  # a line never logged


def test_a_merge_read_waits_for_the_program_in_progress_not_for_the_queued_ones() -> None:
    """SkyByte's artifact (ftl.cc ssd_advance_status): a flush's page read takes the die's
    read timeline and the rest of the one program in progress; the programs queued
    behind it wait. Queued behind them (as background work) it would be out at 403 us."""
    log = make_log(capacity=256, threshold=1.0)
    for _ in range(5):
        log.flash.timeline.program(0, 0)  # 400 us of programs on die 0 from t=0
    log.append(4, 1, 0)  # page 4 lives on die 0; one line: the old page is read first
    log.compact(1000)
    assert log.counters.merge_reads == 1
    assert log.inflight_done_ns == 80000 + 3000
    # the programs resume after the read (and the flush's own program joins them)
    assert log.flash.timeline.background(0, 83000, 0) == 83000 + 4 * 80000 + 80000


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 63), st.integers(0, 5000)),
                max_size=400),
       st.integers(2, 40), st.floats(0.1, 1.0), st.floats(0.0, 0.9))
def test_log_never_exceeds_capacity_and_no_line_is_lost(writes, capacity, threshold, low) -> None:
    log = make_log(capacity, threshold, min(low, threshold * 0.99))
    ftl = log.flash.ftl
    written: set[tuple[int, int]] = set()
    now = 0
    for page, line, gap in writes:
        now += gap
        now = log.append(page, 1 << line, now)
        written.add((page, line))
        assert log.used >= 0 and log.used + log.inflight <= log.capacity
        assert log.valid <= log.used == int(log.page_entries.sum())
        assert log.counters.appends == log.counters.compacted_entries + log.used
        # every line written is either in the log or its page is on flash
        for (p, ln) in written:
            assert log.contains(p, ln, now) or ftl.l2p[p] >= 0
    log.compact(now, at_least=log.used)
    assert not np.any(log.mask)
    assert all(ftl.l2p[p] >= 0 for (p, _) in written)

"""Write log: appends, overwrites, flush coalescing and when the old page is read."""

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


def make_log(capacity: int = 16, threshold: float = 0.5) -> WriteLog:
    ftl = PageFtl(PAGES, 4, 16, 0.3, 0.2, GC_VICTIM_POLICIES.get("greedy")())
    flash = FlashBackend(ftl, FlashTimeline(2, 2, 3000, 80000, 1_000_000))
    cache = DataCache(PAGES, 8, 2, REPLACEMENT_POLICIES.get("lru")(8))
    return WriteLog(PAGES, capacity, threshold, cache, flash)


def test_overwrite_in_place_and_flush_at_threshold() -> None:
    log = make_log(capacity=8, threshold=0.5)
    log.append(1, 1 << 0, 0)
    log.append(1, 1 << 0, 10)
    assert (log.live, log.counters.overwrites) == (1, 1)
    log.append(1, 1 << 1, 20)
    log.append(2, 1 << 5, 30)
    assert log.counters.flushes == 0
    log.append(3, 1 << 0, 40)  # 4 entries = 50 % of 8: flush
    c = log.counters
    assert (c.flushes, c.flushed_entries, c.flushed_pages) == (1, 4, 3)
    assert log.live == 0 and log.inflight == 4
    assert log.flash.counters.programs_host == 3  # coalesced by page
    assert log.flash.counters.reads_merge == 3  # none full, none cached


def test_flush_reads_old_page_only_when_neither_full_nor_cached() -> None:
    log = make_log(capacity=256, threshold=1.0)
    log.cache.insert(7, 0)
    log.append(5, ALL_LINES, 0)  # fully logged
    log.append(7, 1, 0)  # cached
    log.append(9, 1, 0)  # neither
    log.flush(100)
    assert log.flash.counters.reads_merge == 1
    assert log.counters.flushed_full_pages == 1 and log.counters.flushed_cached_pages == 1


def test_full_log_stalls_until_the_flush_is_done() -> None:
    log = make_log(capacity=4, threshold=0.5)
    for page in range(2):
        log.append(page, 1, 0)  # flush of 2 entries starts at t=0
    log.append(10, 1, 0)
    log.append(11, 1, 0)  # deferred: a flush is in flight
    ready = log.append(12, 1, 0)  # 2 live + 2 in flight = full: stall
    assert ready == log.inflight_done_ns > 0 or ready > 0
    assert log.counters.full_stalls == 1
    assert log.live + log.inflight <= log.capacity


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 63), st.integers(0, 5000)),
                max_size=400),
       st.integers(2, 40), st.floats(0.1, 1.0))
def test_log_never_exceeds_capacity_and_no_line_is_lost(writes, capacity, threshold) -> None:
    log = make_log(capacity, threshold)
    ftl = log.flash.ftl
    written: dict[tuple[int, int], int] = {}  # line -> host programs count when written
    now = 0
    for page, line, gap in writes:
        now += gap
        now = log.append(page, 1 << line, now)
        written[(page, line)] = 0
        assert log.live >= 0 and log.live + log.inflight <= log.capacity
        assert log.live == sum(int(m).bit_count() for m in log.mask)
        # every line written is either in the log or its page is on flash
        for (p, ln) in written:
            assert log.contains(p, ln) or ftl.l2p[p] >= 0
    log.flush(now)
    assert not np.any(log.mask)
    assert all(ftl.l2p[p] >= 0 for (p, _) in written)

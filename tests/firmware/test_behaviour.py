"""Behavioural tests on synthetic traces, each with its stated expectation."""

from __future__ import annotations

import numpy as np

from cxlssd.firmware.request import Op, Source, make_requests
from cxlssd.firmware.synth import SynthSpec, synthesize


def mixed_small_writes(n: int = 100_000, write_pages: int = 20, seed: int = 3) -> np.ndarray:
    """90 % reads spread over 16 MiB (they thrash a 1 MiB SSD DRAM) and 10 % small
    (64 B) writes to random lines of a 20-page write set."""
    rng = np.random.default_rng(seed)
    write = rng.random(n) < 0.1
    page = np.where(write, rng.integers(0, write_pages, n) * 97 + 7, rng.integers(0, 4096, n))
    addr = page * 4096 + rng.integers(0, 64, n) * 64
    return make_requests(addr, np.where(write, Op.WRITE, Op.READ).astype(np.uint8),
                         np.arange(n) * 50)


def test_write_log_cuts_flash_programs_tenfold(small_controller) -> None:
    """Expectation: base-cssd programs a page for (nearly) every dirty eviction, while
    the write log coalesces the write set's lines between flushes: >= 10x fewer programs."""
    trace = mixed_small_writes()
    programs = {}
    for design in ("base-cssd", "skybyte-w"):
        c = small_controller(design)
        c.process(trace)
        programs[design] = c.flash.counters.programs_host
    assert programs["skybyte-w"] > 0
    assert programs["base-cssd"] >= 10 * programs["skybyte-w"], programs


def test_hot_set_fitting_the_cache_hits_95_percent(small_controller) -> None:
    """Expectation: a 512 KiB hot set (half of the 1 MiB cache) getting 98 % of the
    requests is served from the cache >= 95 % of the time once warm."""
    trace = synthesize(SynthSpec(pattern="hotset", requests=60_000, footprint_bytes=64 << 20,
                                 hot_bytes=512 << 10, hot_fraction=0.98, seed=5))
    out = small_controller("base-cssd").process(trace)
    warm = out[len(out) // 2 :]
    device = np.isin(warm["source"], [Source.CACHE, Source.FLASH])
    hit_rate = np.count_nonzero(warm["source"] == Source.CACHE) / np.count_nonzero(device)
    assert hit_rate >= 0.95, hit_rate


def test_promotion_share_rises_and_threshold_adapts_within_bounds(small_controller) -> None:
    """Expectation: with a hot set, the share of accesses served by promoted pages grows
    from ~0 to most accesses; the threshold moves (raised while the share is low,
    lowered once it is high) and always stays in [1, 7]."""
    trace = synthesize(SynthSpec(pattern="hotset", requests=40_000, footprint_bytes=64 << 20,
                                 hot_bytes=192 << 10, hot_fraction=0.9, seed=7))
    c = small_controller("skybyte-p", migration__window_accesses=200)
    c.process(trace)
    history = c.counter_dict()["migration"]
    shares, thresholds = history["promoted_share_history"], history["threshold_history"]
    assert len(shares) == 200
    assert shares[0] < 0.25 and np.mean(shares[-20:]) > 0.6, shares
    assert all(1 <= t <= 7 for t in thresholds)
    assert len(set(thresholds)) > 1, thresholds


def test_flash_read_burst_queues_per_die(small_controller) -> None:
    """Expectation: 8 misses issued at the same instant to pages on one die finish one
    flash read (3 us) apart; 8 misses spread over 8 dies all take one read's latency."""
    c = small_controller("base-cssd", timebase="issue")
    dies = c.flash.timeline.n_dies  # 8 in the small profile
    out = c.process(make_requests(np.arange(8) * dies * 4096, time_ns=0))
    assert (out["source"] == Source.FLASH).all()
    assert out["latency_ns"][0] == 158 + 3000
    assert (np.diff(out["latency_ns"]) == 3000).all()
    assert c.flash.counters.host_read_queue_ns == 3000 * sum(range(8))
    out = c.process(make_requests((np.arange(8) + 8 * dies) * 4096, time_ns=10**6))
    assert (out["latency_ns"] == 158 + 3000).all()

"""The fast paths (numpy runs, the inline per-request loop) give what ``_step`` gives.

``test_controller.test_batch_path_equals_per_request_path`` covers short random
streams; these cover long streams (window ends, flushes, GC, promotion to a full
host budget), several vCPUs, pluggable policies, and known pitfalls.
"""

from __future__ import annotations

import numpy as np
import pytest

from cxlssd.firmware.cache import REPLACEMENT_POLICIES, LruPolicy
from cxlssd.firmware.migration import MIGRATION_POLICIES
from cxlssd.firmware.request import FLAG_POSTED, Op, Source, make_requests
from cxlssd.firmware.synth import SynthSpec, synthesize

DESIGNS = ["base-cssd", "skybyte-p", "skybyte-c", "skybyte-w", "skybyte-cp", "skybyte-wp",
           "skybyte-full", "dram-only"]


def _both(small_controller, design: str, requests: np.ndarray, pieces: int = 3, **overrides):
    fast = small_controller(design, vectorize=True, **overrides)
    slow = small_controller(design, vectorize=False, **overrides)
    got = np.concatenate([fast.process(p) for p in np.array_split(requests, pieces)])
    want = slow.process(requests)
    return fast, slow, got, want


@pytest.mark.parametrize("design", DESIGNS)
@pytest.mark.parametrize("pattern", ["zipf", "hotset"])
def test_long_streams_fast_equals_reference(small_controller, design, pattern) -> None:
    spec = SynthSpec(pattern=pattern, requests=30_000, footprint_bytes=8 << 20,
                     hot_bytes=512 << 10, vcpus=2, seed=7)
    fast, slow, got, want = _both(small_controller, design, synthesize(spec),
                                  migration__window_accesses=500)
    assert np.array_equal(got, want)
    assert fast.counter_dict() == slow.counter_dict()


@pytest.mark.parametrize("design", ["base-cssd", "skybyte-c", "skybyte-full"])
def test_posted_writes_fast_equals_reference_and_are_never_charged(small_controller, design) -> None:
    """LLC write-backs (FLAG_POSTED) occupy the device but never stall the vCPU."""
    spec = SynthSpec(pattern="zipf", requests=20_000, footprint_bytes=8 << 20, vcpus=2, seed=3)
    requests = synthesize(spec)
    requests["flags"] = np.where(requests["op"] == Op.WRITE, FLAG_POSTED, 0)
    fast, slow, got, want = _both(small_controller, design, requests, migration__window_accesses=500)
    assert np.array_equal(got, want)
    assert fast.counter_dict() == slow.counter_dict()
    reads = requests["op"] == Op.READ
    # one thread per vCPU: a long delay is waited out, then the access re-issued (a hit)
    charged = np.where(want["long_delay"], want["latency_ns"] + slow.latencies.hit_ns, want["latency_ns"])
    assert slow.counters.stall_ns_total == int(charged[reads].sum())
    assert not want["long_delay"][~reads].any()
    assert sum(slow.vcpu_stall_ns(v) for v in range(2)) == slow.counters.stall_ns_total


class _MruPolicy(LruPolicy):
    """Evicts the most recently used page (a policy the inline loop does not know)."""

    def victim(self, first_slot: int, ways: int) -> int:
        return first_slot + int(np.argmax(self.stamp[first_slot : first_slot + ways]))


class _HalfShareThreshold:
    """A per-access migration policy the inline loop does not know: threshold 2 while
    promoted pages serve under half the window's accesses, else 1."""

    window_resets_counts = False
    per_access = True

    def __init__(self, config) -> None:
        self.threshold = 2
        self.window_accesses = config.window_accesses

    def end_window(self, accesses: int, promoted_accesses: int) -> None:
        self.threshold = 2

    def counted_hit(self, promoted_share: float, promoted: bool) -> None:
        self.threshold = 1 if promoted_share >= 0.5 else 2

    def demotion_victim(self, pages, last_access) -> int:
        return int(pages[np.argmin(last_access)])


@pytest.mark.parametrize("policy", ["skybyte", "adaptive", "fixed", "test-half-share"])
@pytest.mark.parametrize("design", ["skybyte-p", "skybyte-full"])
def test_every_migration_policy_fast_equals_reference(small_controller, design, policy) -> None:
    if "test-half-share" not in MIGRATION_POLICIES.names():
        MIGRATION_POLICIES.register("test-half-share")(_HalfShareThreshold)
    spec = SynthSpec(pattern="hotset", requests=30_000, footprint_bytes=8 << 20,
                     hot_bytes=512 << 10, vcpus=2, seed=11)
    fast, slow, got, want = _both(small_controller, design, synthesize(spec),
                                  migration__policy=policy, migration__window_accesses=700,
                                  migration__initial_threshold=3)
    assert np.array_equal(got, want)
    assert fast.counter_dict() == slow.counter_dict()
    assert fast.counters.promotions_applied > 0


@pytest.mark.parametrize("policy", ["fifo", "test-mru"])
def test_other_replacement_policies_fast_equals_reference(small_controller, policy) -> None:
    if "test-mru" not in REPLACEMENT_POLICIES.names():
        REPLACEMENT_POLICIES.register("test-mru")(_MruPolicy)
    spec = SynthSpec(pattern="zipf", requests=20_000, footprint_bytes=8 << 20, seed=3)
    fast, slow, got, want = _both(small_controller, "skybyte-full", synthesize(spec),
                                  cache__policy=policy)
    assert np.array_equal(got, want)
    assert fast.counter_dict() == slow.counter_dict()


def test_read_of_a_line_logged_in_the_same_numpy_run_by_cache_and_log(small_controller) -> None:
    # after warm-up, mostly simple requests (cache hits and appends), served by numpy
    # runs; a read of a line appended earlier in the run is a cache hit when its page is
    # cached (SkyByte's cache-first lookup) and a log hit when it is not (page 100)
    warm = make_requests(np.arange(4) * 4096, time_ns=np.arange(4) * 10_000)
    hits = make_requests(np.arange(2000) % 4 * 4096, time_ns=np.arange(2000) * 1000 + 10**5)
    cached_line, uncached_line = 4096 + 5 * 64, 100 * 4096 + 3 * 64
    addr = np.array([0, cached_line, 8192, cached_line, uncached_line, uncached_line] * 100)
    op = np.array([Op.READ, Op.WRITE, Op.READ, Op.READ, Op.WRITE, Op.READ] * 100, dtype=np.uint8)
    pattern = make_requests(addr, op, np.arange(600) * 1000 + 10**7)
    requests = np.concatenate([warm, hits, pattern])
    _, _, got, want = _both(small_controller, "skybyte-w", requests, pieces=1)
    assert np.array_equal(got, want)
    first = 4 + 2000
    assert got["source"][first + 3] == Source.CACHE
    assert (got["source"][first + 5::6] == Source.LOG).all()


def test_read_of_an_uncached_line_the_flush_has_not_reached_is_a_log_hit(small_controller) -> None:
    """A flush goes page by page (merge reads in sequence); until it reaches a page not in
    the data cache, that page's logged lines are read from the log, then from flash."""
    level = small_controller("skybyte-w").log.flush_level
    # one line of each of many uncached pages (merge reads); the last append starts
    # the compaction, down to empty in page order: page `last` is flushed last
    last = 100 + level - 1
    fill = make_requests(np.arange(100, 100 + level) * 4096 + 3 * 64, Op.WRITE,
                         np.arange(level) * 100 + 10**5)
    reads = make_requests(np.array([last * 4096 + 3 * 64] * 3000),
                          time_ns=np.arange(3000) * 20_000 + 10**6)
    requests = np.concatenate([fill, reads])
    fast, _, got, want = _both(small_controller, "skybyte-w", requests, pieces=1)
    assert np.array_equal(got, want)
    assert fast.log.counters.compactions == 1
    line = got["source"][-3000:]
    assert line[0] == Source.LOG and line[-1] != Source.LOG  # until the flush passed it

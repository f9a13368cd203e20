"""Controller: per-request and batch paths agree; counters add up; live-driver API."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cxlssd.errors import InputError
from cxlssd.firmware.request import FLAG_DIRTY, REQUEST_DTYPE, Op, Source, make_requests

# a tiny device so that short streams miss, evict, flush, promote and demote
TINY = {"ssd_dram__size_bytes": "64KiB", "write_log__size_bytes": "8KiB", "cache__ways": 4,
        "migration__window_accesses": 50, "migration__host_capacity_bytes": "16KiB",
        "migration__initial_threshold": 2}
DESIGNS = ["base-cssd", "skybyte-p", "skybyte-c", "skybyte-w", "skybyte-full", "dram-only"]

streams = st.lists(
    st.tuples(st.integers(0, 40), st.integers(0, 63), st.sampled_from([0, 0, 0, 1, 1, 2, 3]),
              st.integers(0, 2), st.integers(0, 400)),
    min_size=1, max_size=300,
)


def to_requests(stream) -> np.ndarray:
    page, line, op, vcpu, gap = (np.array(x) for x in zip(*stream, strict=True))
    r = make_requests(page * 4096 + line * 64, op.astype(np.uint8), np.cumsum(gap), vcpu)
    r["flags"] = np.where(op == Op.DEMOTED, FLAG_DIRTY, 0)
    return r


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(streams, st.sampled_from(DESIGNS), st.integers(1, 5))
def test_batch_path_equals_per_request_path(small_controller, stream, design, pieces) -> None:
    requests = to_requests(stream)
    fast = small_controller(design, vectorize=True, **TINY)
    slow = small_controller(design, vectorize=False, **TINY)
    got = np.concatenate([fast.process(part) for part in np.array_split(requests, pieces)])
    want = np.concatenate([slow.submit(*(r[f] for f in ("time_ns", "addr", "op", "vcpu",
                                                         "size", "flags")))[None]
                           for r in requests])
    assert np.array_equal(got, want)
    assert fast.counter_dict() == slow.counter_dict()
    check_counters(fast)


def check_counters(controller) -> None:
    d = controller.counter_dict()
    m = d["model"]
    assert sum(m["served"].values()) == m["requests"] == m["reads"] + m["writes"]
    if "flash" in d:
        assert m["cache_hits"] + m["cache_misses"] == m["served"]["cache"] + m["served"]["flash"]
        assert d["flash"]["reads_host"] == m["cache_misses"] == m["served"]["flash"]
        assert d["flash"]["programs_total"] == d["flash"]["programs_host"] + d["flash"]["programs_gc"]
    assert m["promotions_applied"] - m["demotions_applied"] == len(controller.promoted_pages())
    # a long delay with one thread per vCPU is waited out, then re-issued as a hit
    assert m["stall_ns_total"] <= m["latency_ns_total"] + m["long_delays"] * controller.latencies.hit_ns


def test_dram_only_serves_everything_at_host_dram_latency(small_controller) -> None:
    c = small_controller("dram-only")
    out = c.process(make_requests(np.arange(1000) * 4160 % (64 << 20), np.arange(1000) % 2))
    assert (out["latency_ns"] == 46).all() and (out["source"] == Source.DRAM).all()


def test_latencies_of_hit_append_and_miss(small_controller) -> None:
    c = small_controller("skybyte-w")
    miss = c.submit(0, 0x1000)
    assert miss["source"] == Source.FLASH
    # SkyByte's totals: a flash read is the 158 ns path + the array's 3 us
    assert miss["latency_ns"] == 158 + 3000
    assert c.submit(10_000, 0x1040)["latency_ns"] == 158  # same page: cache hit
    assert c.submit(20_000, 0x2000, Op.WRITE)["latency_ns"] == 86  # log append
    read_back = c.submit(30_000, 0x2000)
    assert (read_back["source"], read_back["latency_ns"]) == (Source.LOG, 158)


def test_compute_timebase_adds_each_vcpus_stall(small_controller) -> None:
    c = small_controller("base-cssd")
    out = c.process(make_requests([0, 0, 4096], time_ns=[0, 100, 200], vcpu=[0, 0, 1]))
    assert out["start_ns"].tolist() == [0, 100 + 3158, 200]


def test_a_long_delay_with_one_thread_is_waited_out_then_reissued(small_controller) -> None:
    c = small_controller("skybyte-c")
    r = c.submit(0, 0x5000)
    assert r["long_delay"] and r["ready_ns"] == r["start_ns"] + r["latency_ns"]
    assert c.counters.stall_ns_total == 3158 + 158 and c.counters.long_delays == 1
    assert not c.submit(10_000, 0x5000)["long_delay"]
    assert not small_controller("base-cssd").submit(0, 0x5000)["long_delay"]


def test_promotion_decided_by_firmware_applied_by_host(small_controller) -> None:
    c = small_controller("skybyte-p", migration__auto_apply=False, migration__policy="fixed",
                         migration__initial_threshold=2)
    c.submit(0, 0x3000)  # miss
    c.submit(1, 0x3000)  # hit 1
    decided = c.submit(2, 0x3000)  # hit 2: threshold reached
    assert decided["promote_page"] == 3
    assert c.pending_promotions().tolist() == [3] and len(c.promoted_pages()) == 0
    assert c.submit(3, 0x3000)["source"] == Source.CACHE  # not moved yet
    c.host_promoted(3)
    assert c.promoted_pages().tolist() == [3]
    assert c.submit(4, 0x3000)["source"] == Source.PROMOTED
    # the same through the request stream (a recorded live run replays identically)
    c.process(make_requests([0x3000], Op.DEMOTED, 5))
    assert c.submit(6, 0x3000)["source"] == Source.CACHE or c.promoted_pages().size == 0


def test_host_capacity_forces_demotion(small_controller) -> None:
    c = small_controller("skybyte-p", migration__initial_threshold=1, migration__policy="fixed",
                         migration__host_capacity_bytes="8KiB")
    for page in (1, 2, 3):
        c.submit(0, page * 4096)  # miss
        c.submit(0, page * 4096)  # hit: promote
    assert len(c.promoted_pages()) == 2
    assert c.counters.demotions_applied == 1
    assert c.promoted_pages().tolist() == [2, 3]  # page 1 was least recently used


def test_bad_requests_are_input_errors(small_controller) -> None:
    c = small_controller("base-cssd")
    with pytest.raises(InputError, match="device capacity"):
        c.process(make_requests([1 << 40]))
    crossing = make_requests([0], size=8)
    crossing["addr"] = 60
    with pytest.raises(InputError, match="within one 64 B line"):
        c.process(crossing)
    with pytest.raises(InputError, match="REQUEST_DTYPE"):
        c.process(np.zeros(3, dtype=np.int64))
    assert c.process(np.zeros(0, dtype=REQUEST_DTYPE)).shape == (0,)

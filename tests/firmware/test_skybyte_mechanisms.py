"""SkyByte's mechanisms as evaluated (shared/DESIGN.md section 1, the authors' artifact):
fills in flight, the per-access promotion rule, and threads that switch on long delays."""

from __future__ import annotations

import numpy as np

from cxlssd.firmware.controller import Controller
from cxlssd.firmware.migration import MigrationConfig, SkyByteThreshold
from cxlssd.firmware.replay import replay_threads
from cxlssd.firmware.request import Op, Source, make_requests
from cxlssd.firmware.synth import SynthSpec, synthesize
from tests.firmware.conftest import small_profile


def test_an_access_to_a_page_being_filled_waits_for_the_rest_of_the_fill(small_controller) -> None:
    c = small_controller("base-cssd", timebase="issue")
    miss = c.submit(0, 0x7000)
    assert miss["latency_ns"] == 158 + 3000
    early = c.submit(1000, 0x7040)  # the next line, 1 us later: 2 us of the fill are left
    assert early["source"] == Source.CACHE and early["latency_ns"] == 158 + 2000
    late = c.submit(10_000, 0x7080)
    assert late["latency_ns"] == 158


def test_the_threshold_starts_at_the_top_rises_on_a_low_share_and_drops_on_promotions() -> None:
    policy = SkyByteThreshold(MigrationConfig())
    assert policy.threshold == 7
    policy.threshold = 5
    policy.counted_hit(0.1, False)
    assert policy.threshold == 6
    policy.counted_hit(0.9, False)  # a high share lowers it only on a promoting hit
    assert policy.threshold == 6
    policy.counted_hit(0.9, True)
    assert policy.threshold == 5
    policy.end_window(10_000, 9_000)
    assert policy.threshold == 7


def test_only_data_cache_hits_count_towards_promotion(small_controller) -> None:
    c = small_controller("skybyte-wp", migration__policy="fixed", migration__initial_threshold=2)
    for t in range(10):  # log appends and log hits: never promoted
        c.submit(t * 10_000, 0x9000, Op.WRITE)
        c.submit(t * 10_000 + 5000, 0x9000)
    assert c.counters.promotions_decided == 0
    c.submit(200_000, 0xA000)  # miss, then two data-cache hits: promoted
    c.submit(210_000, 0xA040)
    assert c.submit(220_000, 0xA080)["promote_page"] == 0xA


def test_a_read_of_a_logged_line_on_a_filled_cached_page_is_a_counted_cache_hit(small_controller) -> None:
    """SkyByte's artifact (ftl.cc byte_issue) looks the data cache up before the log's
    index: a read of a logged line whose page is cached and filled is a cache hit, counted
    for promotion; before the fill is done it is a log hit, without waiting for the fill."""
    c = small_controller("skybyte-wp", migration__policy="fixed", migration__initial_threshold=2)
    miss = c.submit(0, 0xC000)  # the fill: done at 3 158 ns
    assert miss["source"] == Source.FLASH
    c.submit(100, 0xC040, Op.WRITE, vcpu=1)  # another vCPU, while vCPU 0 waits for the fill
    during_fill = c.submit(200, 0xC040, vcpu=1)
    assert (during_fill["source"], during_fill["latency_ns"]) == (Source.LOG, 158)
    assert c.submit(10_000, 0xC040)["source"] == Source.CACHE
    second = c.submit(20_000, 0xC040)  # the second counted hit: decided
    assert (second["source"], second["promote_page"]) == (Source.CACHE, 0xC)


def test_a_hit_on_a_page_whose_fill_is_in_flight_waits_and_is_not_counted(small_controller) -> None:
    """The artifact's MSHR hit: it waits for the fill and does not count towards promotion."""
    c = small_controller("skybyte-p", migration__policy="fixed", migration__initial_threshold=2)
    c.submit(0, 0xD000)  # the fill: vCPU 0 waits for it
    in_flight = c.submit(100, 0xD040, vcpu=1)
    assert in_flight["source"] == Source.CACHE and in_flight["latency_ns"] > 158
    assert c.submit(10_000, 0xD040, vcpu=1)["promote_page"] < 0  # the first counted hit
    assert c.submit(20_000, 0xD040, vcpu=1)["promote_page"] == 0xD


def test_a_page_count_lasts_while_the_page_is_cached_not_per_window(small_controller) -> None:
    c = small_controller("skybyte-p", migration__window_accesses=4)
    c.submit(0, 0xB000)
    for t in range(1, 7):  # six hits over several windows: the count goes on
        c.submit(t * 10_000, 0xB000)
    assert int(c.hit_count[0xB]) == 6
    assert c.submit(80_000, 0xB000)["promote_page"] == 0xB  # the seventh: threshold 7


def _replay(design: str, threads: int) -> dict:
    spec = SynthSpec(pattern="zipf", requests=30_000, footprint_bytes=32 << 20, write_fraction=0.3,
                     threads=threads, seed=3)
    profile = small_profile(design, **{"device.capacity_bytes": "64MiB"})
    records = synthesize(spec)
    if threads > 1:
        return replay_threads(profile, records)
    c = Controller.from_profile(profile)
    c.process(records)
    return {"stalls": {"modelled_end_ns": int(max(c.vcpu_stall_ns(0) + records["time_ns"][-1], 0))},
            "counters": c.counter_dict()}


def test_one_thread_gains_nothing_from_context_switching_three_threads_do() -> None:
    single = {d: _replay(d, 1)["stalls"]["modelled_end_ns"] for d in ("base-cssd", "skybyte-c")}
    assert abs(single["skybyte-c"] / single["base-cssd"] - 1) < 0.05
    three = {d: _replay(d, 3) for d in ("base-cssd", "skybyte-c")}
    gain = three["base-cssd"]["stalls"]["modelled_end_ns"] / three["skybyte-c"]["stalls"]["modelled_end_ns"]
    threads = three["skybyte-c"]["counters"]["threads"]
    assert gain > 1.2, (gain, threads)
    long_delays = three["skybyte-c"]["counters"]["model"]["long_delays"]
    assert threads["switches"] == threads["reissues"] == long_delays
    assert three["base-cssd"]["counters"]["threads"]["switches"] == 0


def test_the_write_log_cuts_flash_traffic_on_streaming_writes_without_fetching_pages() -> None:
    """Half the requests stream writes through a 32 MiB output (each page written
    whole, a line at a time, as a sort or a log does), half read 48 MiB at random,
    thrashing the 1 MiB SSD DRAM. base-cssd fetches every written page from flash
    (write-allocate) and programs it when it is evicted dirty; W appends the lines
    with no fetch and programs each fully logged page once, with no merge read."""
    rng = np.random.default_rng(7)
    n = 40_000
    write = np.arange(n) % 2 == 1
    out_line = np.cumsum(write) - 1
    addr = np.where(write, (64 << 20) - (32 << 20) + out_line * 64,
                    rng.integers(0, 48 * 256, n) * 4096 + rng.integers(0, 64, n) * 64)
    records = make_requests(addr, np.where(write, Op.WRITE, Op.READ), np.arange(n) * 50)
    counters = {}
    for design in ("base-cssd", "skybyte-w"):
        c = Controller.from_profile(small_profile(design))
        c.process(records)
        counters[design] = c.counter_dict()
    base, w = counters["base-cssd"]["flash"], counters["skybyte-w"]["flash"]
    log = counters["skybyte-w"]["write_log"]
    written_pages = n // 2 // 64
    assert base["reads_host"] - w["reads_host"] >= 0.8 * written_pages  # no fetch for a write
    assert w["reads_merge"] <= 0.2 * written_pages  # only pages cut by a compaction need one
    assert log["programs"] <= 1.1 * written_pages  # one program per page
    base_ops = base["reads_total"] + base["programs_total"]
    w_ops = w["reads_total"] + w["programs_total"]
    assert base["programs_total"] >= 0.9 * log["programs"] and w_ops < base_ops, (base, w, log)


def test_every_record_carries_its_thread() -> None:
    records = synthesize(SynthSpec(requests=12, threads=3, vcpus=2, gap_ns=10))
    assert records["thread"].tolist() == [0, 0, 1, 1, 2, 2] * 2
    assert records["time_ns"].tolist() == [0] * 6 + [10] * 6
    assert np.all(records["vcpu"] == np.arange(12) % 2)

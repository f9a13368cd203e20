"""The stream server: markers split the stream, ROI results in modelled time,
the same answers from the replay driver."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cxlssd.firmware.controller import Controller
from cxlssd.firmware.profile import load_profile
from cxlssd.firmware.replay import replay_file
from cxlssd.firmware.request import FLAG_POSTED, REQUEST_DTYPE, MarkerCmd, Op, make_requests
from cxlssd.firmware.stream import StreamServer, counter_delta
from cxlssd.firmware.trace import TraceWriter

DRAM_NS = 46  # the dram-only design answers every request at host DRAM latency


def marker(cmd: int, roi: int, time_ns: int, event: int = 0, vcpu: int = 0) -> np.ndarray:
    record = np.zeros(1, dtype=REQUEST_DTYPE)
    record[0] = (time_ns, event << 16 | roi, vcpu, 0, Op.MARKER, cmd, 0)
    return record


def stream() -> np.ndarray:
    """10 reads before the ROI, 100 reads and 50 posted writes in it, 10 after."""
    reads = make_requests(np.arange(160) * 64, Op.READ, time_ns=np.arange(160) * 10)
    reads["op"][110:160] = Op.WRITE
    reads["flags"][110:160] = FLAG_POSTED
    inside = np.concatenate([reads[10:110], reads[110:160]])
    return np.concatenate([
        reads[:10], marker(MarkerCmd.ROI_BEGIN, 7, 100), inside, marker(MarkerCmd.ROI_END, 7, 5000, event=1),
        make_requests(np.arange(10) * 64, time_ns=6000 + np.arange(10)),
    ])


def dram_only() -> Controller:
    return Controller.from_profile(load_profile("dram-only"))


def test_roi_time_is_local_clock_plus_charged_stall() -> None:
    server = StreamServer(dram_only())
    records = stream()
    for piece in np.array_split(records, 7):  # markers anywhere in a chunk, or at its edges
        server.serve(piece)
    assert server.markers == 2 and server.requests == records.shape[0] - 2
    (roi,) = server.results
    # 100 blocking reads in the ROI; the 50 posted writes cost the vCPU nothing.
    assert roi["device_stall_ns"] == 100 * DRAM_NS
    assert roi["local_ns"] == 5000 - 100
    assert roi["modelled_ns"] == roi["local_ns"] + roi["device_stall_ns"]
    assert roi["begin_ns"] == 100 + 10 * DRAM_NS  # the 10 reads before it stalled the vCPU
    assert roi["device"]["model"]["reads"] == 100 and roi["device"]["model"]["writes"] == 50
    assert roi["latency_by_source"] == {
        "read": {"dram": {"requests": 100, "mean_latency_ns": DRAM_NS}},
        "write": {"dram": {"requests": 50, "mean_latency_ns": DRAM_NS}},
    }
    assert "cpu" not in roi  # no plugin counters in a replay


def test_a_roi_begins_with_the_log_flushed_when_the_profile_asks() -> None:
    """write_log.flush_at_roi_begin: the writes before the ROI are compacted when it
    begins, counted in the ROI (as the artifact counts its warm-up flush in the
    measured pass), and the ROI's reads of those pages wait behind the programs."""
    writes = make_requests(np.arange(32) * 4096, Op.WRITE, time_ns=np.arange(32) * 10)
    writes["flags"] = FLAG_POSTED
    reads = make_requests(np.arange(32) * 4096, Op.READ, time_ns=10_000 + np.arange(32) * 10)
    records = np.concatenate([writes, marker(MarkerCmd.ROI_BEGIN, 1, 1000), reads,
                              marker(MarkerCmd.ROI_END, 1, 20_000)])
    rois = {}
    for flush in (False, True):
        profile = load_profile("skybyte-w", {"write_log.flush_at_roi_begin": flush})
        server = StreamServer(Controller.from_profile(profile))
        server.serve(records)
        (rois[flush],) = server.results
    log_off, log_on = (rois[f]["device"]["write_log"] for f in (False, True))
    assert (log_off["roi_flushes"], log_off["compactions"], log_off["programs"]) == (0, 0, 0)
    assert (log_on["roi_flushes"], log_on["compactions"], log_on["programs"]) == (1, 1, 32)
    # off: every read finds its line in the log; on: the pages are on flash, behind programs
    assert rois[True]["device_stall_ns"] > rois[False]["device_stall_ns"]


def test_a_roi_begins_on_an_idle_flash_when_the_profile_asks() -> None:
    """flash.idle_at_roi_begin (the artifact measures in a run of its own): a set-up's
    compaction still running when the ROI begins no longer holds the ROI's reads, and
    with write_log.flush_at_roi_begin the log's own flush is booked on the idle dies."""
    # one line on each of 12 000 pages: a compaction of ~6 400 pages (merge read and
    # program each: ~30 ms of the dies) starts at the log's threshold
    writes = make_requests(np.arange(12_000) * 4096, Op.WRITE, time_ns=np.arange(12_000) * 10)
    writes["flags"] = FLAG_POSTED
    # then reads of other pages, on every die, while it runs
    reads = make_requests((100_000 + np.arange(64) * 7) * 4096, Op.READ,
                          time_ns=200_000 + np.arange(64) * 10)
    records = np.concatenate([writes, marker(MarkerCmd.ROI_BEGIN, 1, 150_000), reads,
                              marker(MarkerCmd.ROI_END, 1, 300_000)])
    rois = {}
    for idle, flush in ((False, False), (True, False), (True, True)):
        profile = load_profile("skybyte-w", {"flash.idle_at_roi_begin": idle,
                                             "write_log.flush_at_roi_begin": flush,
                                             "scale.capacity_divisor": 64})
        server = StreamServer(Controller.from_profile(profile))
        server.serve(records)
        (rois[idle, flush],) = server.results
    busy, idle, flushed = (rois[k]["device"]["flash"] for k in ((False, False), (True, False), (True, True)))
    assert busy["host_read_queue_ns"] > 64 * 10_000  # behind the set-up's programs
    assert (busy["roi_idles"], busy["roi_dropped_ns"]) == (0, 0)
    assert idle["roi_idles"] == 1 and idle["roi_dropped_ns"] > 0
    assert idle["host_read_queue_ns"] == 0 and idle["programs_total"] == 0
    # the entries still in the log, flushed from the ROI's start: the reads wait for them
    assert flushed["programs_total"] > 0 and flushed["host_read_queue_ns"] > 64 * 10_000


def test_unmatched_markers_are_reported_not_fatal() -> None:
    server = StreamServer(dram_only())
    server.serve(np.concatenate([marker(MarkerCmd.ROI_END, 1, 10), marker(MarkerCmd.ROI_BEGIN, 2, 20)]))
    assert server.results == [] and server.unfinished() == [{"roi": 2, "vcpu": 0}]


def test_cpu_counters_come_from_the_lookup_by_event_index() -> None:
    seen: list[int] = []

    def lookup(event: int) -> dict[str, int]:
        seen.append(event)
        return {"insns": 1000 * (event + 1), "llc_misses_dram": 5 * event}

    server = StreamServer(dram_only(), lookup)
    server.serve(stream())
    assert seen == [0, 1]
    assert server.results[0]["cpu"] == {"insns": 1000, "llc_misses_dram": 5}


def test_counter_delta_subtracts_counts_keeps_gauges_drops_ratios() -> None:
    after = {"model": {"reads": 10, "cache_hit_rate": 0.5}, "cache": {"occupied_pages": 7, "evictions": 4}}
    before = {"model": {"reads": 4, "cache_hit_rate": 0.1}, "cache": {"occupied_pages": 3, "evictions": 1}}
    expected = {"model": {"reads": 6}, "cache": {"occupied_pages": 7, "evictions": 3}}
    assert counter_delta(after, before) == expected


def test_a_trace_with_markers_replays_to_the_same_roi_results(tmp_path: Path) -> None:
    records = stream()
    live = StreamServer(Controller.from_profile(load_profile("skybyte-full")))
    live.serve(records)
    path = tmp_path / "marked.trace"
    with TraceWriter(path, {"source": "test"}) as writer:
        writer.write(records)
    replayed = replay_file(path, load_profile("skybyte-full"))
    assert replayed["rois"] == live.results
    assert replayed["counters"] == live.summary()["counters"]

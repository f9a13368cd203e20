"""A live run's trace replayed with its guest threads (``cxlssd replay --as-threads``):
each thread's own compute clock recovered from the vCPU's, the set-up before the ROI,
the ROI's threads scheduled by the replayed design's thread model."""

from __future__ import annotations

import numpy as np
import pytest

from cxlssd.errors import InputError
from cxlssd.firmware.replay import replay_file, replay_guest_threads
from cxlssd.firmware.request import FLAG_HOST, FLAG_QUERY, MarkerCmd, Op, make_requests
from cxlssd.firmware.synth import SynthSpec, synthesize
from cxlssd.firmware.threads import guest_threads
from cxlssd.firmware.trace import TraceWriter
from tests.firmware.conftest import small_profile


def marker(cmd: MarkerCmd, roi: int, time_ns: int) -> np.ndarray:
    record = make_requests([roi], Op.MARKER, time_ns)
    record["flags"], record["size"], record["addr"] = cmd, 0, roi
    return record


def test_each_thread_gets_its_own_compute_clock_and_the_set_up_comes_first() -> None:
    setup = make_requests([0x1000, 0x2000], Op.WRITE, [10, 20])
    roi = make_requests([0x3000, 0x4000, 0x5000, 0x6000, 0x7000], Op.READ, [100, 150, 160, 170, 300])
    roi["thread"] = [5, 6, 6, 5, 6]
    roi["flags"] = [0, FLAG_QUERY, FLAG_HOST, 0, 0]  # a query, a miss host DRAM served
    stream = np.concatenate([setup, marker(MarkerCmd.ROI_BEGIN, 7, 30), roi,
                             marker(MarkerCmd.ROI_END, 7, 310), make_requests([0x8000], Op.READ, 400)])
    before, part, roi_id = guest_threads(stream)
    assert roi_id == 7 and before["addr"].tolist() == [0x1000, 0x2000]
    assert part["addr"].tolist() == [0x3000, 0x4000, 0x6000, 0x7000]  # not the host's, not after the ROI
    assert part["flags"].tolist() == [0, 0, 0, 0]  # the replayed design asks for itself
    # the vCPU's work between requests (100, 50, 20 with the host miss's 10, 130) is the
    # thread's whose request ends it: thread 5 100 then 20 more, thread 6 50 then 130 more
    assert part["time_ns"].tolist() == [100, 50, 120, 180]


def live_stream(threads: int, slice_records: int = 50) -> np.ndarray:
    """A synthetic multi-threaded program as a live run records it on one vCPU: the
    kernel runs each thread for a slice, the vCPU's compute clock counts them all,
    the set-up (one thread) before the ROI."""
    spec = SynthSpec(pattern="uniform", requests=9_000, footprint_bytes=48 << 20, write_fraction=0.1,
                     threads=threads, gap_ns=400, seed=5)
    records = synthesize(spec)
    per_thread = [records[records["thread"] == t] for t in range(threads)]
    order = [r[i:i + slice_records] for i in range(0, len(per_thread[0]), slice_records) for r in per_thread]
    roi = np.concatenate(order)
    roi["time_ns"] = np.cumsum(np.full(len(roi), spec.gap_ns))
    roi["thread"] += 100  # pids
    setup = make_requests(np.arange(2_000) * 4096, Op.WRITE, np.arange(2_000) * 10)
    begin_ns = int(setup["time_ns"][-1])
    roi["time_ns"] += begin_ns
    return np.concatenate([setup, marker(MarkerCmd.ROI_BEGIN, 1, begin_ns), roi,
                           marker(MarkerCmd.ROI_END, 1, int(roi["time_ns"][-1]))])


def roi_ns(design: str, stream: np.ndarray) -> int:
    profile = small_profile(design, **{"device.capacity_bytes": "64MiB"})
    (roi,) = replay_guest_threads(profile, stream)["rois"]
    return int(roi["modelled_ns"])


def test_a_recorded_three_thread_run_gains_from_c_in_replay_a_one_thread_run_does_not() -> None:
    three = live_stream(3)
    _, part, _ = guest_threads(three)
    for thread in (100, 101, 102):  # each thread's clock is its own work: 400 ns a request
        assert np.all(np.diff(part["time_ns"][part["thread"] == thread].astype(np.int64)) == 400)
    gain3 = roi_ns("base-cssd", three) / roi_ns("skybyte-c", three)
    one = live_stream(1)
    gain1 = roi_ns("base-cssd", one) / roi_ns("skybyte-c", one)
    print(f"skybyte-c over base-cssd: 3 threads {gain3:.2f}x, 1 thread {gain1:.2f}x")
    assert gain3 > 1.3 and abs(gain1 - 1) < 0.05


def test_only_a_live_runs_trace_is_replayed_as_threads(tmp_path) -> None:
    path = tmp_path / "synth.trace"
    with TraceWriter(path, {"threads": 3}) as writer:
        writer.write(synthesize(SynthSpec(requests=30, threads=3)))
    with pytest.raises(InputError, match="not a live run's trace"):
        replay_file(path, small_profile("base-cssd"), as_threads=True)

"""Transparent context switching (issue 14): an unmodified pthreads program under a design
that switches on long delays, the guest kernel helper parking its threads. Runs
``randread --threads`` (no runtime calls) on the session's guest; docs/host-os.md has
the mechanism and the measured numbers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cxlssd.host_os.kmod.load import helper_stats
from cxlssd.platform.machine import Platform

pytestmark = pytest.mark.guest

# The acceptance shape: dependent random reads over 64 MiB, 16 MiB of SSD DRAM,
# one vCPU (each read of a vCPU stalls it: the model serialises them, as a chase would).
SSD = ("ssd_dram.size_bytes=16MiB", "write_log.size_bytes=2MiB")
READS = ("--footprint", "64M", "--reads", "6000", "--write-share", "0.1")


def run(platform: Platform, design: str, threads: int) -> dict[str, Any]:
    """The ROI's results of randread in ``threads`` threads under ``design`` (self-checked)."""
    with platform.attach(design, SSD) as session:
        _, out, _ = session.run(["randread", *READS, "--threads", str(threads)], check=True)
    report = json.loads(out)
    assert report["check_ok"] and report["mismatches"] == 0, report
    (roi,) = session.results["rois"]
    return dict(roi)


@pytest.fixture(scope="module")
def runs(default_platform: Platform) -> dict[tuple[str, int], dict[str, Any]]:
    return {(design, threads): run(default_platform, design, threads)
            for design in ("skybyte-c", "base-cssd") for threads in (3, 1)}


def test_three_threads_on_one_vcpu_gain_from_kernel_switching(
    runs: dict[tuple[str, int], dict[str, Any]], default_platform: Platform,
) -> None:
    c3, base3 = runs["skybyte-c", 3], runs["base-cssd", 3]
    os = c3["device"]["os"]
    speedup = base3["modelled_ns"] / c3["modelled_ns"]
    print(f"3 threads: skybyte-c {c3['modelled_ns'] / 1e6:.3f} ms, "
          f"base-cssd {base3['modelled_ns'] / 1e6:.3f} ms ({speedup:.2f}x); {json.dumps(os)}")
    assert speedup >= 1.3
    # every switch is the kernel's, and it hid flash time: resumed with less than the latency left
    assert os["kernel_switches"] > 0 and os["switches"] == 0
    assert os["resumes"] == os["kernel_switches"] and os["hidden_ns"] > 0
    assert os["parked"] == 0  # every parked read was settled by its RESUME
    stats = helper_stats(default_platform.guest())
    assert stats["switching"] == 1 and stats["parks"] >= os["kernel_switches"]


def test_one_thread_has_nothing_to_switch_to(runs: dict[tuple[str, int], dict[str, Any]]) -> None:
    c1, base1 = runs["skybyte-c", 1], runs["base-cssd", 1]
    os = c1["device"]["os"]
    print(f"1 thread: skybyte-c {c1['modelled_ns'] / 1e6:.3f} ms, "
          f"base-cssd {base1['modelled_ns'] / 1e6:.3f} ms; {json.dumps(os)}")
    # (the last long read may still be unsettled when the ROI ends)
    assert os["kernel_switches"] == 0 and os["long_delays"] > 0 and os["ignored"] >= os["long_delays"] - 1
    # no gain: the long reads are charged in full; what C adds is the doorbell's interrupt
    assert c1["modelled_ns"] >= 0.99 * base1["modelled_ns"]

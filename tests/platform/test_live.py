"""The firmware attached live (issue 4 acceptance), on the session's real guest:
calibration of the modelled clock against the configured latencies, determinism,
replay equivalence, and what happens when the firmware process dies.

Every measurement runs the guest runtime's ``chase`` (guest/runtime/chase.c), a
pointer chase with an ROI around its measured pass, under ``Platform.attach``;
the instruction counts that must not depend on the host run ``shapes``
(guest/runtime/shapes.c, issue 15).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from cxlssd.errors import ConfigError, FirmwareError, GuestError, PlacementError
from cxlssd.firmware.controller import Controller
from cxlssd.firmware.knobs import FlashLatency, LatencySpike
from cxlssd.firmware.profile import Profile, load_profile
from cxlssd.firmware.replay import replay_file, with_recorded_device
from cxlssd.firmware.request import Op
from cxlssd.guest.runtime.install import with_guest_env
from cxlssd.lifecycle import ProcessId
from cxlssd.platform.config import load_config
from cxlssd.platform.inject import inject
from cxlssd.platform.machine import Platform

pytestmark = pytest.mark.guest

TOLERANCE = 0.05  # calibration: within 5 % of the configured latency
DETERMINISM = 0.005  # the same run twice: within 0.5 %


def run_chase(
    platform: Platform, design: str, *chase_args: str, overrides: tuple[str, ...] = (),
    record: Path | None = None,
) -> tuple[dict[str, Any], dict[str, Any], Profile]:
    """Run chase under ``design`` (on the movable DRAM node for dram-only, the CXL node otherwise);
    returns chase's report, the run's results and the resolved profile."""
    with platform.attach(design, overrides, record) as session:
        _, out, _ = session.run(["chase", *chase_args], check=True)
    report = json.loads(out)
    assert report["cycle_ok"] and report["chase_ok"], report
    assert len(session.results["rois"]) == 1, session.results["rois"]
    return report, session.results, session.profile


def ns_per_access(report: dict[str, Any], results: dict[str, Any]) -> float:
    return float(results["rois"][0]["modelled_ns"]) / report["steps"]


def assert_close(measured: float, expected: float, what: str) -> None:
    print(f"{what}: {measured:.1f} ns per access, configured {expected:.1f} ns "
          f"({measured / expected - 1:+.2%})")
    assert abs(measured / expected - 1) <= TOLERANCE, what


def served(results: dict[str, Any]) -> dict[str, int]:
    return dict(results["rois"][0]["device"]["model"]["served"])


# 32 MiB of 64-byte slots: 16x the 2 MiB LLC, far below the SSD data cache.
HITS = ("--bytes", "32M", "--stride", "64", "--warm", "1")


@pytest.fixture(scope="module")
def cache_hit_runs(default_platform: Platform, tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """The cache-hit chase twice under base-cssd (the second recorded)."""
    trace = tmp_path_factory.mktemp("live") / "hits.trace"
    first = run_chase(default_platform, "base-cssd", *HITS)
    second = run_chase(default_platform, "base-cssd", *HITS, record=trace)
    return [first, second, trace]


def test_cxl_node_all_data_cache_hits_at_the_configured_latency(cache_hit_runs: list[Any]) -> None:
    report, results, profile = cache_hit_runs[0]
    controller = Controller.from_profile(profile)
    assert served(results)["cache"] >= 0.99 * report["steps"]
    hit_ns = controller.latencies.hit_ns
    assert_close(ns_per_access(report, results), hit_ns, "CXL node, data-cache hits")
    roi = results["rois"][0]
    assert roi["cpu"]["device_reads"] >= 0.99 * report["steps"] and roi["cpu"]["device_dropped"] == 0
    assert roi["latency_by_source"]["read"]["cache"]["mean_latency_ns"] == hit_ns


def test_the_same_run_twice_gives_the_same_modelled_time(cache_hit_runs: list[Any]) -> None:
    first, second = cache_hit_runs[0][1]["rois"][0], cache_hit_runs[1][1]["rois"][0]
    drift = abs(second["modelled_ns"] / first["modelled_ns"] - 1)
    print(f"modelled ROI time {first['modelled_ns']} ns then {second['modelled_ns']} ns ({drift:.4%})")
    assert drift <= DETERMINISM


# 8 MiB of lines through 8 MiB of SSD DRAM: which pages conflict in the set-associative data
# cache (and go to flash) depends on their physical addresses. Before the placement was reset,
# a 16 MiB chase through 16 MiB read flash 11 times in one run and 878 in the next (4.8 %);
# this chase without the reset: 13, 154 and 146 flash reads, 21.010 / 21.396 / 21.409 ms.
CONFLICTS = ("--bytes", "8M", "--stride", "64", "--warm", "1")
CONFLICT_SSD = ("ssd_dram.size_bytes=8MiB",)
# A guest timer interrupt more or less in the ROI (~3.5 k instructions, and the LLC lines its
# handler evicts) is all that may differ: measured 21 010 442 / 21 010 441 ns.
TIMER_TICK_SPREAD = 1e-3


def test_a_run_on_the_cxl_node_gets_the_same_pages_and_time_every_time(default_platform: Platform) -> None:
    runs = [run_chase(default_platform, "base-cssd", *CONFLICTS, overrides=CONFLICT_SSD)[1] for _ in range(2)]
    first, second = (run["rois"][0] for run in runs)
    print(f"modelled {first['modelled_ns']} / {second['modelled_ns']} ns, flash reads "
          f"{first['device']['flash']['reads_total']} / {second['device']['flash']['reads_total']}")
    assert [run["placement"] for run in runs] == ["reset", "reset"]
    assert first["device"]["flash"]["reads_total"] > 0  # the pages do conflict
    assert abs(first["device"]["flash"]["reads_total"] - second["device"]["flash"]["reads_total"]) <= 2
    assert second["modelled_ns"] == pytest.approx(first["modelled_ns"], rel=TIMER_TICK_SPREAD)


# 16 MiB chased through the 2 MiB LLC: which lines conflict in the physically indexed LLC
# depends on the pages' frames. On node 0, whose placement cannot be reset, two runs of this
# chase differed by 0.075 %; on the movable DRAM node, reset: 12 495 242 / 12 495 243 ns.
DRAM_CONFLICTS = ("--bytes", "16M", "--stride", "64", "--warm", "1")
# a timer tick more or less is ~1e-4 of this ROI; on a host loaded by a demo and another
# CI one run took 8 661 ns more (7e-4; not identified: likely an interrupt host timing placed)
DRAM_SPREAD = 1e-3


def test_a_dram_only_run_gets_the_same_pages_and_time_every_time(default_platform: Platform) -> None:
    runs = [run_chase(default_platform, "dram-only", *DRAM_CONFLICTS)[1] for _ in range(2)]
    first, second = (run["rois"][0] for run in runs)
    print(f"dram-only: modelled {first['modelled_ns']} / {second['modelled_ns']} ns")
    assert [run["placement"] for run in runs] == ["reset", "reset"]
    assert first["cpu"]["llc_misses_dram"] > 0  # the lines do conflict
    assert second["modelled_ns"] == pytest.approx(first["modelled_ns"], rel=DRAM_SPREAD)


def test_resetting_the_placement_of_a_node_without_memory_says_so(default_platform: Platform) -> None:
    with pytest.raises(PlacementError, match="node 99 has no memory blocks"):
        default_platform.reset_placement([99])


def test_replaying_the_recorded_run_gives_the_live_answers(cache_hit_runs: list[Any]) -> None:
    _, results, profile = cache_hit_runs[1]
    trace: Path = cache_hit_runs[2]
    replayed = replay_file(trace, profile)
    assert replayed["counters"] == results["counters"]
    assert replayed["stalls"] == results["stalls"]
    live_roi = {k: v for k, v in results["rois"][0].items() if k != "cpu"}
    assert replayed["rois"] == [live_roi]


def test_a_recording_replayed_by_its_design_name_gets_the_live_device(cache_hit_runs: list[Any]) -> None:
    """`cxlssd replay TRACE --design base-cssd` resolves the design's profile, whose device
    (8 GiB) is not the CXL window the live firmware sized its flash by: the recording
    carries the window's capacity and the replay takes it."""
    profile: Profile = cache_hit_runs[1][2]
    trace: Path = cache_hit_runs[2]
    assert load_profile("base-cssd").tree != profile.tree
    assert load_profile("base-cssd", with_recorded_device(trace, [])).tree == profile.tree


def test_cxl_node_all_flash_reads_at_the_configured_latency(default_platform: Platform) -> None:
    """A 4 MiB data cache, 64 MiB of pages visited cyclically (one line per
    page): every measured access misses the cache and reads flash."""
    report, results, profile = run_chase(
        default_platform, "base-cssd", "--bytes", "64M", "--stride", "4096", "--warm", "2",
        overrides=("ssd_dram.size_bytes=4MiB",),
    )
    controller = Controller.from_profile(profile)
    assert served(results)["flash"] >= 0.99 * report["steps"]
    # What the model charges one flash read on an idle device, asked of the model itself.
    expected = int(controller.submit(0, 0)["latency_ns"])
    assert_close(ns_per_access(report, results), expected, "CXL node, flash reads")


def test_dram_node_at_the_dram_latency(default_platform: Platform) -> None:
    report, results, profile = run_chase(default_platform, "dram-only", *HITS)
    controller = Controller.from_profile(profile)
    roi = results["rois"][0]
    assert roi["device"]["model"]["requests"] == 0 and roi["cpu"]["llc_misses_dram"] >= 0.95 * report["steps"]
    assert_close(ns_per_access(report, results), controller.latencies.host_dram_ns, "DRAM node")


def test_write_backs_are_log_appends_at_the_log_latency(default_platform: Platform) -> None:
    report, results, profile = run_chase(
        default_platform, "skybyte-w", "--bytes", "8M", "--stride", "64", "--warm", "1", "--write"
    )
    controller = Controller.from_profile(profile)
    roi = results["rois"][0]
    writes = roi["latency_by_source"]["write"]
    append_ns = controller.latencies.log_append_ns
    print(f"write-backs in the ROI: {writes}")
    assert set(writes) == {"log"} and writes["log"]["requests"] >= 0.5 * report["steps"]
    assert abs(writes["log"]["mean_latency_ns"] / append_ns - 1) <= TOLERANCE
    # Posted: the write-backs' latency is not on the vCPU's clock. (Each line is loaded
    # before it is stored, so store misses, which wait for their append, are rare.)
    reads_ns = sum(v["requests"] * v["mean_latency_ns"] for v in roi["latency_by_source"]["read"].values())
    assert 0 <= roi["device_stall_ns"] - reads_ns <= 0.01 * writes["log"]["requests"] * append_ns


def test_store_misses_go_to_the_log_without_a_fetch_in_w_designs(default_platform: Platform) -> None:
    """SkyByte's W designs: an LLC store miss is a log append (86 ns, the CPU waits for
    it) with no read of the line; base-cssd reads the line for ownership first."""
    stores = ("--bytes", "16M", "--stride", "64", "--warm", "1", "--stores")
    overrides = ("ssd_dram.size_bytes=64MiB", "write_log.size_bytes=8MiB")
    report, results, profile = run_chase(default_platform, "skybyte-w", *stores, overrides=overrides)
    roi = results["rois"][0]
    model = roi["device"]["model"]
    appends = Controller.from_profile(profile).latencies.log_append_ns
    assert model["writes"] >= 0.95 * report["steps"] and model["reads"] <= 0.01 * report["steps"], model
    # the device's part of each step: one append (the loop's own instructions come on top)
    assert_close(roi["device_stall_ns"] / report["steps"], appends, "store misses into the write log")
    report, results, _ = run_chase(default_platform, "base-cssd", *stores, overrides=overrides)
    model = results["rois"][0]["device"]["model"]
    assert model["reads"] >= 0.95 * report["steps"], model  # reads for ownership


def test_a_roi_can_begin_on_an_empty_llc(default_platform: Platform) -> None:
    """cpu.llc_cold_at_roi_begin (SkyByte's measured run starts MacSim's caches cold):
    512 KiB of slots, written in the warm pass, fit the 2 MiB LLC, so the ROI finds them
    there; with the key on, the ROI begins on an empty LLC and misses on every line, and
    the dirty lines are dropped, as the artifact's warm-up trace never writes back its
    last ones: no write-back in the ROI or before it."""
    chase = ("--bytes", "512K", "--stride", "64", "--warm", "1", "--write")
    warm = run_chase(default_platform, "base-cssd", *chase)[1]
    cold = run_chase(default_platform, "base-cssd", *chase, overrides=("cpu.llc_cold_at_roi_begin=true",))[1]
    lines = 512 * 1024 // 64
    warm_model, cold_model = (r["rois"][0]["device"]["model"] for r in (warm, cold))
    print(f"ROI device reads: warm LLC {warm_model['reads']}, cold {cold_model['reads']} of {lines} lines")
    assert warm_model["reads"] <= 0.05 * lines and cold_model["reads"] >= 0.95 * lines
    assert cold_model["writes"] <= 0.05 * lines
    # outside the ROI: the warm run writes back what stays dirty, the cold one not the dropped lines
    warm_outside, cold_outside = (r["counters"]["model"]["writes"] - m["writes"]
                                  for r, m in ((warm, warm_model), (cold, cold_model)))
    assert cold_outside <= warm_outside, (cold_outside, warm_outside)
    assert cold["rois"][0]["modelled_ns"] > warm["rois"][0]["modelled_ns"] + 0.9 * lines * 100


def test_streaming_over_more_than_the_ssd_dram_pays_one_fill_and_63_hits_per_page(
    default_platform: Platform,
) -> None:
    stream = ("--bytes", "64M", "--stride", "64", "--warm", "1", "--sequential")
    report, results, profile = run_chase(default_platform, "base-cssd", *stream,
                                         overrides=("ssd_dram.size_bytes=16MiB",))
    latencies = Controller.from_profile(profile).latencies
    by_source = served(results)
    pages = report["steps"] // 64
    assert abs(by_source["flash"] - pages) <= 0.01 * pages, by_source
    assert abs(by_source["cache"] - 63 * pages) <= 0.01 * 63 * pages, by_source
    fill = results["rois"][0]["latency_by_source"]["read"]["flash"]["mean_latency_ns"]
    assert abs(fill / (latencies.hit_ns + 3000) - 1) <= TOLERANCE, fill
    per_page_ns = fill + 63 * latencies.hit_ns
    assert_close(ns_per_access(report, results), per_page_ns / 64, "a stream: fill + 63 hits")


def test_firmware_knobs_change_the_modelled_latency_at_run_time(default_platform: Platform) -> None:
    """A flash-latency knob sent while the firmware runs makes every flash read of
    the ROI take the new time; without an attached firmware the knob is refused."""
    platform = default_platform
    with pytest.raises(ConfigError, match="no firmware is attached"):
        inject(platform, FlashLatency(read_ns=20_000))
    overrides = ("ssd_dram.size_bytes=16MiB",)
    with platform.attach("base-cssd", overrides) as session:
        inject(platform, FlashLatency(read_ns=20_000))
        _, out, _ = session.run(["chase", "--bytes", "64M", "--stride", "4096", "--warm", "2"], check=True)
    report, results = json.loads(out), session.results
    assert [k["kind"] for k in results["knobs"]] == ["flash-latency"]
    assert served(results)["flash"] >= 0.99 * report["steps"]
    slow = Controller.from_profile(load_profile("base-cssd", [*session.overrides, "flash.read_ns=20000"]))
    assert_close(ns_per_access(report, results), int(slow.submit(0, 0)["latency_ns"]), "flash reads at 20 us")


def test_a_latency_spike_ends_and_latency_returns_to_normal(default_platform: Platform) -> None:
    """+1 us on every access for 20 ms of modelled time: the firmware logs its start
    and its end 20 ms later, and the ROI (after the spike) is back at the
    configured latency."""
    platform = default_platform
    with platform.attach("base-cssd") as session:
        inject(platform, LatencySpike(extra_ns=1_000, duration_ms=20))
        _, out, _ = session.run(["chase", *HITS], check=True)
    report, results = json.loads(out), session.results
    _, start, end = results["knobs"]
    assert (start["kind"], end["kind"]) == ("latency-spike-start", "latency-spike-end")
    assert end["at_ns"] - start["at_ns"] >= 20_000_000 and end["requests_during"] > 10_000
    controller = Controller.from_profile(session.profile)
    hit_ns = controller.latencies.hit_ns
    print(f"spike: {start} -> {end}")
    assert results["rois"][0]["begin_ns"] > end["at_ns"]
    assert_close(ns_per_access(report, results), hit_ns, "data-cache hits after the spike")


# Runs in the guest: reads the modelled clock around ROI 9, prints both readings.
CLOCK_SCRIPT = """
import cxlssd_guest as c
c.load()
buf = bytearray(4 << 20)
t0 = c.clock_ns()
with c.roi(9):
    buf[::64] = b"\\x01" * (len(buf) // 64)
t1 = c.clock_ns()
print(t0, t1)
"""


def test_the_guest_reads_its_modelled_clock(default_platform: Platform) -> None:
    """Two clock reads around an ROI differ by at least the ROI's modelled time
    (and not by much more: a few Python calls); dormant, the clock reads 0."""
    platform = default_platform
    argv = with_guest_env(["numactl", f"--membind={platform.devices[0].node}", "python3", "-c", CLOCK_SCRIPT])
    with platform.attach("base-cssd") as session:
        _, out, _ = platform.guest().run(argv, check=True, watch=session.check)
    t0, t1 = (int(v) for v in out.split())
    roi_ns = session.results["rois"][0]["modelled_ns"]
    print(f"guest clock {t0} -> {t1} ns: {t1 - t0} ns around an ROI of {roi_ns} ns")
    assert 0 < t0 < t1 and roi_ns <= t1 - t0 <= 1.5 * roi_ns + 2_000_000
    _, out, _ = platform.guest().run(argv, check=True)
    assert out.split() == [b"0", b"0"]


def test_a_killed_firmware_stops_the_run_with_a_clear_error(default_platform: Platform, cli: Any) -> None:
    """`./cxlssd inject --instance NAME firmware-kill` mid-run: the run stops within
    seconds with an error naming the cause, the guest keeps running, nothing is
    left behind, and the next run attaches a new firmware normally."""
    platform = default_platform
    guest = platform.guest()
    injected: list[Any] = []
    started = [0.0]

    def kill_firmware() -> None:
        time.sleep(3.0)
        started[0] = time.monotonic()
        injected.append(cli("inject", "--instance", platform.name, "firmware-kill"))

    killer = threading.Thread(target=kill_firmware, daemon=True)
    with pytest.raises(FirmwareError) as caught, platform.attach("base-cssd") as session:
        pid = session.firmware.pid
        killer.start()
        session.run(["chase", "--bytes", "64M", "--warm", "4"])
    detected_s = time.monotonic() - started[0]  # the inject command's own start-up included
    killer.join()
    assert injected[0].returncode == 0 and json.loads(injected[0].stdout)["arguments"] == {"pid": pid}
    message = str(caught.value)
    print(f"detected {detected_s:.2f} s after the inject command started: {message.splitlines()[0]}")
    assert re.search(r"firmware process \(design base-cssd, pid \d+\) killed by SIGKILL", message)
    assert detected_s < 10.0
    assert not Path(f"/proc/{pid}").exists()
    assert not platform.plugin_counters().active  # back to sleep
    assert not (platform.plugin_files().ring.parent / "firmware.json").exists()
    again = cli("inject", "--instance", platform.name, "firmware-kill")
    assert again.returncode == 2 and "no firmware is attached" in again.stderr
    guest.run(["pkill", "-x", "chase"])  # the guest's command outlived its SSH channel
    assert guest.run(["true"])[0] == 0  # the guest was never hung
    _, results, _ = run_chase(platform, "base-cssd", "--bytes", "1M")  # a new firmware works
    assert results["rois"][0]["cpu"]["device_dropped"] == 0


@pytest.mark.slow
def test_qemu_dying_under_a_run_stops_it_and_leaves_nothing() -> None:
    """SIGKILL to QEMU mid-run (its own guest): the run stops with an error naming
    QEMU, the firmware process is stopped, the instance's files are removed."""
    with Platform(load_config()) as platform:
        with pytest.raises(GuestError, match=r"QEMU killed by SIGKILL while running"), \
                platform.attach("base-cssd") as session:
            firmware_pid = session.firmware.pid
            qemu = ProcessId.read(platform.plugin_files().ring.parent / "qemu.pid")
            assert qemu is not None
            qemu_pid = qemu.pid
            threading.Timer(3.0, os.kill, (qemu_pid, signal.SIGKILL)).start()
            session.run(["chase", "--bytes", "64M"])
        assert not Path(f"/proc/{firmware_pid}").exists()
        rundir = platform.rundir
    assert rundir is not None and not rundir.exists()


def test_guest_exec_design_prints_roi_results_and_records_a_trace(
    cli: Any, tmp_path: Path
) -> None:
    """The CLI end to end: its own guest, the firmware attached, ROI table printed."""
    results, trace = tmp_path / "results.json", tmp_path / "run.trace"
    # capacities / 32: the 4 MiB written at start-up leaves the 1.75 MiB log for flash and
    # the data cache, whose hits count towards promotion (log hits do not)
    done = cli("guest", "exec", "--design", "skybyte-full", "--set", "scale.capacity_divisor=32",
               "--results", str(results), "--record", str(trace), "--", "chase", "--bytes", "4M")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "== design skybyte-full: 1 regions of interest (modelled time)" in done.stdout
    data = json.loads(results.read_text())
    assert data["exit_status"] == 0 and data["rois"][0]["roi"] == 1 and data["rois"][0]["modelled_ns"] > 0
    from cxlssd.firmware.trace import TraceReader

    records = TraceReader(trace).read_all()
    markers = records["flags"][records["op"] == Op.MARKER]
    assert ((markers == 1) | (markers == 2)).sum() == 2  # the ROI's begin and end
    assert (markers == 7).sum() == data["counters"]["model"]["promotions_applied"] > 0  # the daemon's


def test_guest_exec_rejects_bad_design_options_before_booting(cli: Any) -> None:
    started = time.monotonic()
    unknown = cli("guest", "exec", "--design", "no-such-design", "--", "true")
    assert unknown.returncode == 2 and "no-such-design" in unknown.stderr
    orphan = cli("guest", "exec", "--record", "x.trace", "--", "true")
    assert orphan.returncode == 2 and "need --design" in orphan.stderr
    assert time.monotonic() - started < 30  # no guest was booted


# -- modelled time does not depend on the host (issue 15) ------------------------------

SAME_COUNT = 0.02  # ROI instructions: node 0 against the CXL node, idle against loaded host
# What one interrupt inside an ROI may add: a timer tick costs ~3 500 instructions in
# ``shapes``' string ROIs, with the timer or RCU softirq ~5 500. The guest's clock (-icount)
# advances one nanosecond per TCG iteration, so a bytewise-string ROI spans 2.3 ms of guest
# time for ~70 000 instructions: it sees a 4 ms tick or none, by its phase. Allowed: one
# interrupt's instructions for each interrupt (or page fault) one run's ROI saw more, and
# one. An ROI in which another task preempted the program also holds that task's work:
# RCU's kthread (a few hundred instructions), vmstat's per-second fold (by ftrace 10 000-
# 16 000 with its tick), and once in CI a task that ran 2.75 M instructions (2.8 ms) in
# node 0's ``byte`` ROI (3 switches). ``shapes`` reports the guest time it did not run
# (``others_ns``: one instruction a nanosecond with -icount shift=0), allowed as is, and
# PREEMPTION_INSNS for each context switch the more preempted run's ROI saw.
EVENT_INSNS = 10_000
PREEMPTION_INSNS = 40_000


class Shapes(NamedTuple):
    counts: dict[str, int]  # instructions in each shape's ROI, by shape name
    report: dict[str, dict[str, int]]  # what ``shapes`` says of each: steps, bytes, ticks, ...


def run_shapes(platform: Platform, design: str) -> Shapes:
    """A run of ``shapes`` (guest/runtime/shapes.c) under ``design``."""
    with platform.attach(design) as session:
        _, out, _ = session.run(["shapes"], check=True)
    report = json.loads(out)
    insns = {roi["roi"]: roi["cpu"]["insns"] for roi in session.results["rois"]}
    counts = {name: insns[shape["roi"]] for name, shape in report["shapes"].items()}
    print(f"{design}: {counts}; guest saw {report['shapes']}")
    for name, shape in report["shapes"].items():
        assert counts[name] >= shape["insns_per_step"] * shape["steps"], name
    return Shapes(counts, report["shapes"])


def interrupts_and_faults(shape: dict[str, int]) -> int:
    """The interrupts (timer ticks included) and page faults a shape's ROI saw."""
    return shape["interrupts"] + shape["faults"]


def guest_work_insns(interrupts: int, context_switches: int, others_ns: int) -> int:
    """What the guest kernel and other tasks may add to an ROI: an interrupt's worth for
    each of ``interrupts`` and one more, a preemption's for each context switch, and what
    other tasks ran (``others_ns`` of guest time, an instruction a nanosecond)."""
    return EVENT_INSNS * (interrupts + 1) + PREEMPTION_INSNS * context_switches + others_ns


def assert_same_counts(shapes: Shapes, reference: Shapes, what: str) -> None:
    """Every shape counts what it counts in ``reference``, but for the interrupts one saw
    more and the other tasks that preempted it."""
    off = {name: shapes.counts[name] / reference.counts[name] - 1 for name in reference.counts}
    print(f"{what}: " + ", ".join(f"{name} {delta:+.2%}" for name, delta in off.items()))
    for name, count in reference.counts.items():
        runs = (shapes.report[name], reference.report[name])
        seen_more = abs(interrupts_and_faults(runs[0]) - interrupts_and_faults(runs[1]))
        switches = max(run["context_switches"] for run in runs)
        others_ns = max(run["others_ns"] for run in runs)
        allowed = SAME_COUNT * count + guest_work_insns(seen_more, switches, others_ns)
        assert abs(shapes.counts[name] - count) <= allowed, (what, name)


def assert_strings_charged_by_bytes(shapes: Shapes, what: str) -> None:
    """A string shape counts its loop, 1 per op and 1 per ``string_bytes_per_insn`` bytes
    stored a step, and at most an interrupt's instructions more per interrupt or fault it
    saw, and one, and a preemption's per context switch."""
    per_insn = load_config().cpu.string_bytes_per_insn
    for name in ("movsb", "movsq", "stosb"):
        shape = shapes.report[name]
        expected = shape["steps"] * (shape["insns_per_step"] + 1 + shape["string_bytes_per_step"] // per_insn)
        print(f"{what} {name}: {shapes.counts[name]} instructions, {expected} expected")
        assert expected <= shapes.counts[name], (what, name)
        guest_work = guest_work_insns(
            interrupts_and_faults(shape), shape["context_switches"], shape["others_ns"]
        )
        assert shapes.counts[name] <= expected * (1 + SAME_COUNT) + guest_work, (what, name)


@pytest.fixture(scope="module")
def node0_shapes(default_platform: Platform) -> Shapes:
    return run_shapes(default_platform, "dram-only")


def test_roi_instructions_are_the_same_on_node0_and_on_the_cxl_node(
    default_platform: Platform, node0_shapes: Shapes
) -> None:
    """Each CXL access costs microseconds of host time (MMIO under TCG); with the guest's
    clocks on host time its timer work grew the CXL node's ROIs by 7-33 % against node
    0's 1-2 % (docs/live.md). With them on instructions (-icount, the default) every
    access shape counts the same on both nodes. TCG runs a REP MOVS/STOS one element
    per iteration, where a core with fast strings moves a 4 KiB page in ~130 cycles, not
    4 096 (or 512 for MOVSQ): an op counts one instruction plus one per
    ``cpu.string_bytes_per_insn`` bytes it stores, whatever its element size, on both
    nodes (docs/plugin.md, "Local modelled clock")."""
    cxl = run_shapes(default_platform, "base-cssd")
    assert_same_counts(cxl, node0_shapes, "CXL node against node 0")
    assert_strings_charged_by_bytes(node0_shapes, "node 0")
    assert_strings_charged_by_bytes(cxl, "CXL node")


def test_roi_instructions_do_not_change_when_the_host_is_loaded(
    default_platform: Platform, node0_shapes: Shapes
) -> None:
    """Two busy loops on the host (its two cores) slow the emulation down; the CXL node's
    ROIs still count what node 0's count on an idle host."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        loaded = run_shapes(default_platform, "base-cssd")
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert_same_counts(loaded, node0_shapes, "CXL node on a loaded host against node 0")

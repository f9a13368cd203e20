"""The offloading workload (guest/workloads/offload.c, docs/offload.md): MLP training with every
tensor in CXL memory, with and without the lifetime-aware prefetch/offload helper. On the host
(no guest: the binary runs and self-checks, its usage errors), and in the session's guest under
base-cssd and dram-only: the helper really moves pages (the guest's and the firmware's counts),
training gives the same bits wherever its pages are, and the helper makes an iteration faster
under base-cssd."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cxlssd.guest.runtime.build import ensure_runtime
from cxlssd.platform.machine import Platform

RUN_TIMEOUT_S = 60
# The experiments' SSD DRAM (experiments/offload.yaml): the tensors fit in it, so the device
# serves them from its DRAM (~200 ns a line) and the helper's gain is reuse from host DRAM.
SSD = ("ssd_dram.size_bytes=16MiB", "write_log.size_bytes=2MiB")
# Two layers of the default width: each weight matrix (2.25 MiB) is larger than the 2 MiB LLC,
# so every pass over it misses (measured: ~35 s for a base-cssd run, ~10 s under dram-only).
SMALL = ("--layers", "2")
# Tensors on the host: a few KiB, for the host-only checks.
TINY = ("--layers", "3", "--width", "64", "--batch", "8", "--iterations", "3")
# A budget that holds one weight matrix of SMALL and the activations, not both matrices.
TIGHT_BUDGET_BYTES = 3 << 20


@pytest.fixture(scope="module")
def runtime() -> Path:
    return ensure_runtime()


def host_run(
    runtime: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(runtime / "bin" / "offload"), *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, env=env)


def host_report(runtime: Path, *args: str) -> dict[str, Any]:
    result = host_run(runtime, *args)
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    assert report["workload"] == "offload" and report["check_ok"] is True
    return report


# -- on the host (no guest) ------------------------------------------------------------------


@pytest.mark.parametrize("args", [(), TINY], ids=["default", "tiny"])
def test_the_binary_trains_and_self_checks_on_the_host(runtime: Path, args: tuple[str, ...]) -> None:
    none = host_report(runtime, *args)
    lifetime = host_report(runtime, *args, "--policy", "lifetime")
    asynchronous = host_report(runtime, *args, "--policy", "lifetime", "--transfer", "async", "--hints", "on")
    split = host_report(runtime, *args, "--policy", "static")
    layers = none["params"]["layers"]
    assert none["ops"] == 2 * layers + 1 and none["tensors"] == 6 * layers + 2
    assert none["loss_last"] < none["loss_first"] and none["mismatched_tensors"] == 0
    # no live run: no modelled clock
    assert none["iteration_ns_mean"] is None and none["iteration_ns_max"] is None
    # the weights, biases, activations and their gradients are used by two ops or more; the
    # labels and the weight and bias gradients by one (accessed in place)
    assert none["movable_tensors"] == 4 * layers + 1
    # the host has no CXL region: the helper's promotions fail, nothing moves, same training
    assert lifetime["placement_failures"] > 0 and lifetime["bytes_promoted"] == 0
    assert asynchronous["placement_failures"] > 0 and split["placement_failures"] > 0
    assert lifetime["checksum"] == none["checksum"] == asynchronous["checksum"] == split["checksum"]
    # the host's memory is node 0: the gradients are in DRAM already, so no scratch
    assert lifetime["params"]["scratch"] == "on" and lifetime["scratch_bytes"] == lifetime["scratch_ops"] == 0


def test_the_checksum_follows_the_seed_and_a_fault_fails_the_check(runtime: Path) -> None:
    assert host_report(runtime, *TINY)["checksum"] == host_report(runtime, *TINY)["checksum"]
    assert host_report(runtime, *TINY, "--seed", "2")["checksum"] != host_report(runtime, *TINY)["checksum"]
    faulty = host_run(runtime, *TINY, env={**os.environ, "CXLSSD_WORKLOAD_FAULT": "1"})
    assert faulty.returncode == 1
    report = json.loads(faulty.stdout)
    assert report["check_ok"] is False and report["mismatched_tensors"] == 1


def test_the_footprint_picks_the_width(runtime: Path) -> None:
    report = host_report(runtime, "--footprint", "2M", "--iterations", "1")
    assert report["params"]["width"] % 16 == 0 and report["tensor_bytes"] <= 2 << 20
    wider = host_run(runtime, "--width", str(report["params"]["width"] + 16), "--iterations", "1")
    assert json.loads(wider.stdout)["tensor_bytes"] > 2 << 20


@pytest.mark.parametrize(("args", "message"), [
    (["--width", "100"], "--width 100: must be a multiple of 16"),
    (["--batch", "6"], "--batch 6: must be a multiple of 4"),
    (["--policy", "eager"], "--policy: 'eager' is not one of none, static, lifetime"),
    (["--lookahead", "0"], "--lookahead 0: must be 1..33"),
    (["--footprint", "64K"], "--footprint 65536 is too small"),
    (["--width", "64", "--footprint", "1M"], "--footprint and --width are exclusive"),
    (["--lr", "0"], "--lr 0: must be strictly between 0 and 10"),
    (["--scratch", "maybe"], "--scratch: 'maybe' is not one of off, on"),
])
def test_bad_arguments_exit_2_with_usage(runtime: Path, args: list[str], message: str) -> None:
    result = host_run(runtime, *args)
    assert result.returncode == 2 and result.stdout == ""
    assert message in result.stderr and "usage: offload " in result.stderr


# -- in the guest ------------------------------------------------------------------------------


def guest_run(platform: Platform, design: str, *args: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """offload SMALL under ``design``: (its report, the ROI's results)."""
    with platform.attach(design, SSD) as session:
        status, out, err = session.run(["offload", *SMALL, *args])
    assert status == 0, err.decode(errors="replace")
    report: dict[str, Any] = json.loads(out)
    (roi,) = session.results["rois"]
    return report, roi


@pytest.fixture(scope="module")
def guest_runs(default_platform: Platform) -> dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]]:
    """The configurations: all on CXL-SSD; with the helper (moves only, the gradients in place:
    synchronous, and with the transfer engine and hints); with the helper's scratch for the
    gradients; all on DRAM (the ideal); the helper under dram-only with a budget that forces
    evictions."""
    return {
        ("base-cssd", "none"): guest_run(default_platform, "base-cssd"),
        ("base-cssd", "lifetime"): guest_run(default_platform, "base-cssd", "--policy", "lifetime",
                                             "--scratch", "off"),
        ("base-cssd", "async"): guest_run(default_platform, "base-cssd", "--policy", "lifetime",
                                          "--transfer", "async", "--hints", "on", "--scratch", "off"),
        ("base-cssd", "scratch"): guest_run(default_platform, "base-cssd", "--policy", "lifetime"),
        ("dram-only", "none"): guest_run(default_platform, "dram-only"),
        ("dram-only", "lifetime"): guest_run(default_platform, "dram-only", "--policy", "lifetime",
                                             "--dram-budget", str(TIGHT_BUDGET_BYTES)),
    }


@pytest.mark.guest
def test_training_self_checks_and_is_the_same_wherever_the_pages_are(
    guest_runs: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    checksums = set()
    for (design, policy), (report, roi) in guest_runs.items():
        assert report["check_ok"] and report["mismatched_tensors"] == 0, (design, policy, report)
        assert report["loss_last"] < report["loss_first"]
        checksums.add(report["checksum"])
        # each measured iteration timed by the modelled clock: together they are the ROI
        mean, low, high = report["iteration_ns_mean"], report["iteration_ns_min"], report["iteration_ns_max"]
        assert 0 < low <= mean <= high
        assert mean * report["params"]["iterations"] == pytest.approx(roi["modelled_ns"], rel=0.01)
    assert len(checksums) == 1  # the same bits on the device, in DRAM, moved back and forth


@pytest.mark.guest
def test_training_counts_the_same_instructions_on_the_device_and_in_dram(
    guest_runs: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    """The same work without the helper counts the same instructions wherever the tensors
    are (issue 15; before the guest's clocks followed its instructions, base-cssd counted
    984 M instructions where dram-only counted 175 M)."""
    device, dram = (guest_runs[design, "none"][1]["cpu"]["insns"] for design in ("base-cssd", "dram-only"))
    print(f"ROI instructions: base-cssd {device / 1e6:.2f} M, dram-only {dram / 1e6:.2f} M "
          f"({device / dram - 1:+.2%})")
    assert device == pytest.approx(dram, rel=0.02)


@pytest.mark.guest
def test_the_lifetime_policy_moves_pages_through_the_host_os_interface(
    guest_runs: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    report, roi = guest_runs["base-cssd", "lifetime"]
    model = roi["device"]["model"]
    print(f"base-cssd lifetime: {report['bytes_promoted'] >> 20} MiB promoted, "
          f"{report['bytes_demoted'] >> 20} MiB demoted; firmware: {model['promotions_applied']} promotions, "
          f"{model['demotions_applied']} demotions applied, promoted share {roi['promoted_share']:.3f}")
    assert report["bytes_promoted"] > 0 and report["bytes_demoted"] > 0 and report["placement_failures"] == 0
    assert report["peak_promoted_bytes"] <= report["params"]["dram_budget"]
    # the firmware applied the pages the workload reported (fewer than it moved: docs/offload.md,
    # a page that lands on a device page freed by a promotion still in force is not counted)
    assert 0 < model["promotions_applied"] <= report["bytes_promoted"] // 4096
    assert 0 < model["demotions_applied"] <= report["bytes_demoted"] // 4096
    assert roi["promoted_share"] > 0.3  # many of the LLC misses were served by host DRAM
    none, _ = guest_runs["base-cssd", "none"]
    assert none["bytes_promoted"] == 0 and none["promotions"] == 0


@pytest.mark.guest
def test_the_budget_holds_by_evicting_the_tensor_needed_last(
    guest_runs: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    """Under dram-only the tensors are in DRAM already: the helper keeps its books (budget,
    evictions) but moves nothing."""
    report, roi = guest_runs["dram-only", "lifetime"]
    assert 0 < report["peak_promoted_bytes"] <= TIGHT_BUDGET_BYTES
    # the first layer's weights make room for the second's in every forward pass
    assert report["evictions"] >= report["params"]["iterations"]
    assert report["bytes_promoted"] == report["bytes_demoted"] == 0
    assert roi["device"]["model"]["promotions_applied"] == 0


@pytest.mark.guest
def test_the_lifetime_policy_is_faster_than_none_under_base_cssd(
    guest_runs: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    times = {key: report["iteration_ns_mean"] for key, (report, _) in guest_runs.items()}
    ideal = times["dram-only", "none"]
    none, lifetime = times["base-cssd", "none"], times["base-cssd", "lifetime"]
    print(f"per iteration: dram-only {ideal / 1e6:.1f} ms, base-cssd {none / 1e6:.1f} ms "
          f"({ideal / none:.1%} of ideal), base-cssd lifetime {lifetime / 1e6:.1f} ms "
          f"({ideal / lifetime:.1%} of ideal)")
    assert ideal < lifetime < none
    # measured: ~2.4 with the earlier parameters; 1.38 with SkyByte's evaluated ones and
    # the instruction clock (109.2 against 78.9 ms an iteration; dram-only 41.8); 1.46 with
    # string copies charged by their bytes (109.2 against 74.8; dram-only 41.1)
    assert none / lifetime > 1.2
    # also in the device's own stall, which the instruction count does not touch (docs/offload.md)
    stall = {key: roi["device_stall_ns"] for key, (_, roi) in guest_runs.items()}
    assert stall["base-cssd", "lifetime"] < 0.7 * stall["base-cssd", "none"]
    # the helper's own cost under dram-only (system calls, no moves) is small
    assert times["dram-only", "lifetime"] == pytest.approx(ideal, rel=0.05)


@pytest.mark.guest
def test_the_scratch_gives_the_gradients_host_dram_within_the_budget(
    guest_runs: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    """--scratch on (the default): every backward op writes its weight and bias gradients in
    one node-0 buffer booked against the budget while the op runs, instead of on the device."""
    report, roi = guest_runs["base-cssd", "scratch"]
    moves_only, moves_only_roi = guest_runs["base-cssd", "lifetime"]
    params = report["params"]
    print(f"scratch: {report['iteration_ns_mean'] / 1e6:.1f} ms an iteration "
          f"(without {moves_only['iteration_ns_mean'] / 1e6:.1f}), device stall "
          f"{roi['device_stall_ns'] / 1e6:.1f} ms (without {moves_only_roi['device_stall_ns'] / 1e6:.1f}), "
          f"{report['scratch_ops']} ops with it, {report['scratch_fallbacks']} without")
    assert params["scratch"] == "on"
    # dW and db, each in whole pages
    assert report["scratch_bytes"] == sum(-(-size // 4096) * 4096 for size in (4 * params["width"] ** 2,
                                                                                4 * params["width"]))
    # the budget (16 MiB) has room for it in every backward op of the measured iterations
    assert report["scratch_ops"] == params["layers"] * params["iterations"]
    assert report["scratch_fallbacks"] == 0
    assert report["peak_promoted_bytes"] <= params["dram_budget"]
    assert roi["device_stall_ns"] < moves_only_roi["device_stall_ns"]
    assert report["iteration_ns_mean"] < moves_only["iteration_ns_mean"]
    # under dram-only the gradients are in node 0 already: no scratch, the ideal stays the plain run
    assert guest_runs["dram-only", "lifetime"][0]["scratch_bytes"] == 0


@pytest.mark.guest
def test_the_transfer_engine_overlaps_the_moves_and_the_hints_reach_the_firmware(
    guest_runs: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    """The same moves bracketed for the device's transfer engine (firmware/hints.py): the guest's
    copies leave the vCPU's clock, the engine's transfers overlap the ops, hints name pages."""
    (sync, sync_roi), (report, roi) = guest_runs["base-cssd", "lifetime"], guest_runs["base-cssd", "async"]
    transfers = roi["device"]["transfers"]
    ms = {key: transfers[key] / 1e6 for key in ("busy_ns", "wait_ns", "guest_copy_ns")}
    print(f"async: {report['iteration_ns_mean'] / 1e6:.1f} ms an iteration "
          f"(sync {sync['iteration_ns_mean'] / 1e6:.1f}); {transfers['transfers']} transfers, "
          f"{transfers['bytes'] >> 20} MiB, engine busy {ms['busy_ns']:.2f} ms, "
          f"waited {ms['wait_ns']:.2f} ms; "
          f"guest copies taken back {ms['guest_copy_ns']:.1f} ms; "
          f"hints: {transfers['hint_markers']} markers, "
          f"{transfers['need_prefetched']} pages prefetched, {transfers['dead_dropped']} dropped")
    assert report["params"]["transfer"] == "async"
    assert report["transfers"] > 0 and report["transfer_waits"] > 0
    assert report["bytes_promoted"] > 0 and report["placement_failures"] == 0
    # every move of the ROI went through the engine, in the guest's count and the firmware's
    assert transfers["bytes"] == report["bytes_promoted"] + report["bytes_demoted"]
    assert transfers["promotions"] == report["promotions"]
    assert transfers["waits"] == report["transfer_waits"]
    # the overlap: the vCPU waited for less than the engine worked, and for less than the copies cost
    assert transfers["wait_ns"] < transfers["busy_ns"] < transfers["guest_copy_ns"]
    assert report["hints_need"] > 0 and report["hints_dead"] > 0 and transfers["hint_markers"] > 0
    assert report["iteration_ns_mean"] < sync["iteration_ns_mean"]
    assert roi["modelled_ns"] < sync_roi["modelled_ns"]

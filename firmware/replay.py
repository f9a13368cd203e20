"""Replay driver: feed a request trace through a controller and summarise the answers.

The replay driver is the batch user of :meth:`Controller.process`; the live driver
(fed by the QEMU plugin's ring) calls the same method with ring chunks, so a trace
recorded from a live run replays to the same answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cxlssd.errors import InputError
from cxlssd.firmware.context_switch import NeverSwitch
from cxlssd.firmware.controller import Controller
from cxlssd.firmware.live_switching import LiveContextSwitch, guest_driven
from cxlssd.firmware.profile import Profile, load_profile
from cxlssd.firmware.stream import StreamServer
from cxlssd.firmware.synth import SynthSpec, generate, synthesize
from cxlssd.firmware.threads import ThreadedReplay, guest_threads
from cxlssd.firmware.trace import TraceReader


def with_recorded_device(path: str | Path, overrides: Sequence[str]) -> list[str]:
    """``overrides`` with, first, the device a live recording's guest saw: the logical
    capacity the live firmware took from the CXL window (``device.capacity_bytes``,
    which sizes the flash and so when GC starts). A design's profile has its own (8 GiB),
    so a replay without this does not equal the live run once the run collects garbage;
    an override of the key given by the caller still wins (it comes later)."""
    profile = TraceReader(path).metadata.get("profile")
    device = profile.get("device") if isinstance(profile, dict) else None
    capacity = device.get("capacity_bytes") if isinstance(device, dict) else None
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
        return list(overrides)
    return [f"device.capacity_bytes={capacity}", *overrides]


def replay(
    controller: Controller, chunks: Iterable[np.ndarray], switching: LiveContextSwitch | None = None
) -> dict[str, Any]:
    """Serve every chunk; returns counters, stall totals, latency percentiles and
    the results of the ROIs marked in the stream."""
    server = StreamServer(controller, switching=switching)
    server.serve_all(chunks)
    return server.summary()


def replay_threads(profile: Profile, requests: np.ndarray, vectorize: bool = True) -> dict[str, Any]:
    """Replay a trace with several threads per vCPU: :mod:`.threads` schedules them."""
    controller = Controller.from_profile(profile, timebase="issue", vectorize=vectorize)
    threaded = ThreadedReplay(controller, profile["context_switch.scheduler"])
    threaded.run(requests)
    return threaded.summary()


def replay_guest_threads(profile: Profile, requests: np.ndarray, vectorize: bool = True) -> dict[str, Any]:
    """Replay a live run's trace with its guest threads scheduled by ``profile``'s
    thread model (:func:`.threads.guest_threads`): the set-up as the guest issued it,
    then the first ROI's threads; ``rois`` has that ROI's modelled time."""
    setup, roi_requests, roi = guest_threads(requests)
    # The set-up on the batch path (one thread: nothing to switch to, so no switching);
    # then the thread model keeps the clocks (issue timebase) from where it ended.
    controller = Controller.from_profile(profile, timebase="compute", vectorize=vectorize)
    policy, controller.context_switch = controller.context_switch, NeverSwitch()
    controller.process(setup)
    begin_ns = max((int(setup["time_ns"][setup["vcpu"] == v][-1]) + controller.vcpu_stall_ns(v)
                    for v in np.unique(setup["vcpu"]).tolist()), default=0)
    controller.context_switch, controller.compute_timebase = policy, False
    threaded = ThreadedReplay(controller, profile["context_switch.scheduler"])
    end_ns = max(threaded.run(roi_requests, start_ns=begin_ns).values(), default=begin_ns)
    result = threaded.summary()
    result["rois"] = [{"roi": roi, "begin_ns": begin_ns, "end_ns": end_ns, "modelled_ns": end_ns - begin_ns,
                       "threads": int(np.unique(roi_requests[["vcpu", "thread"]]).size)}]
    return result


def replay_file(
    path: str | Path, profile: Profile, vectorize: bool = True, as_threads: bool = False
) -> dict[str, Any]:
    """Replay trace file ``path`` on ``profile``; the result includes the full profile.
    ``as_threads``: a live run's trace through the thread model, its guest threads
    scheduled by the replayed design (:func:`.threads.guest_threads`), instead of as
    the guest ran it."""
    reader = TraceReader(path)
    if as_threads:
        if not reader.metadata.get("guest_driven"):
            raise InputError(f"{path} is not a live run's trace (`cxlssd guest exec --design D --record "
                             "FILE -- ...` makes one): a synthetic trace's threads replay as threads "
                             "without --as-threads")
        result = replay_guest_threads(profile, reader.read_all(), vectorize)
    elif not reader.metadata.get("guest_driven") and int(reader.metadata.get("threads", 1)) > 1:
        result = replay_threads(profile, reader.read_all(), vectorize)
    else:
        controller = Controller.from_profile(profile, timebase=reader.timebase, vectorize=vectorize)
        # a live run's trace: the guest switched and promoted, the replay settles the same way
        switching = guest_driven(controller) if reader.metadata.get("guest_driven") else None
        result = replay(controller, reader.chunks(), switching)
    return {
        "design": profile.name,
        "profile": profile.tree,
        "trace": {
            "path": str(path),
            "records": reader.records,
            "timebase": reader.timebase,
            "metadata": reader.metadata,
        },
        **result,
    }


def summary_lines(result: dict[str, Any]) -> list[str]:
    """Human-readable summary of a :func:`replay_file` result."""
    counters = result["counters"]
    model = counters["model"]
    lines = [
        f"design {result['design']}: {model['requests']} requests "
        f"({model['reads']} reads, {model['writes']} writes)",
        "served by: " + ", ".join(f"{k} {v}" for k, v in model["served"].items() if v),
        f"cache hit rate {model['cache_hit_rate']:.4f}, mean latency "
        f"{model['mean_latency_ns']:.1f} ns, latency percentiles (ns): "
        + ", ".join(f"{k} {v}" for k, v in result["latency_percentiles_ns"].items()),
        f"modelled stall total {result['stalls']['stall_ns_total']} ns "
        f"(latency total {result['stalls']['latency_ns_total']} ns, "
        f"{model['long_delays']} long delays)",
    ]
    if "flash" in counters:
        f = counters["flash"]
        lines.append(
            f"flash: reads host {f['reads_host']} merge {f['reads_merge']} gc {f['reads_gc']}; "
            f"programs host {f['programs_host']} gc {f['programs_gc']}; erases {f['erases_gc']}; "
            f"write amplification {f['write_amplification']:.3f} (FTL), "
            f"{f['device_write_amplification']:.3f} (device bytes)"
        )
    if "write_log" in counters:
        w = counters["write_log"]
        lines.append(
            f"write log: {w['appends']} appends, {w['invalidations']} invalidations, "
            f"{w['compactions']} compactions ({w['programs']} page programs, {w['merge_reads']} "
            f"merge reads), {w['full_stalls']} full stalls"
        )
    for roi in result.get("rois", []):
        if "threads" in roi:  # replay_guest_threads's
            lines.append(f"ROI {roi['roi']} ({roi['threads']} guest threads, scheduled by the design): "
                         f"{roi['modelled_ns'] / 1e6:.3f} ms modelled")
            continue
        model = roi["device"]["model"]
        lines.append(
            f"ROI {roi['roi']} (vCPU {roi['vcpu']}): {roi['modelled_ns'] / 1e6:.3f} ms modelled "
            f"({roi['device_stall_ns'] / 1e6:.3f} ms device stall), {model['reads']} reads, "
            f"{model['writes']} writes"
        )
    if "migration" in counters:
        m = counters["migration"]
        lines.append(
            f"migration: {model['promotions_applied']} promotions, "
            f"{model['demotions_applied']} demotions, threshold now {m['threshold']}"
        )
    return lines


def compare_designs(spec: SynthSpec, designs: Sequence[str]) -> list[dict[str, Any]]:
    """Replay one synthetic stream under each design; one row per design with its
    modelled time, speedup over the first design and fraction of ``dram-only`` (if
    among the designs), and flash traffic."""
    rows = []
    for design in designs:
        profile = load_profile(design)
        if spec.threads > 1:
            result = replay_threads(profile, synthesize(spec))
        else:
            result = replay(Controller.from_profile(profile), generate(spec))
        flash = result["counters"].get("flash", {})
        rows.append({
            "design": design,
            "modelled_ns": result["stalls"]["modelled_end_ns"],
            "flash_reads": flash.get("reads_total", 0),
            "flash_programs": flash.get("programs_total", 0),
        })
    first = rows[0]["modelled_ns"]
    ideal = next((r["modelled_ns"] for r in rows if r["design"] == "dram-only"), None)
    for row in rows:
        row["speedup"] = first / row["modelled_ns"]
        row["fraction_of_dram_only"] = ideal / row["modelled_ns"] if ideal else None
    return rows

"""Measure the skid of the guest kernel helper (issue 14): guest instructions between a long
access and the guest kernel's reaction to the firmware's "long delay" answer.

Boots the default platform with an extra ``ivshmem-doorbell`` device (served by
:class:`~cxlssd.host_os.kmod.doorbell.DoorbellServer`), loads the helper
(``host_os/kmod/cxlssd_helper.c``) and runs ``skidprobe`` (``host_os/kmod/skidprobe.c``)
under ``skybyte-c``: random one-line long-delay queries over a footprint 8x the SSD
DRAM (most are flash reads, answered "long"). The plugin holds the vCPU until the
firmware has answered in the pv slot, so the answer is there when the access retires;
what is measured is how the kernel learns of it:

- ``timer``: the helper's pinned hrtimer polls the slot every ``poll_ns`` of guest time
  (under -icount shift=0, 1 ns per instruction): skid in [0, poll_ns] + the interrupt's
  entry, set by the guest's execution alone;
- ``doorbell``: a host thread watches the pv page (as the firmware would ring on its
  answer) and rings the doorbell's eventfd; QEMU's main loop raises the MSI-X vector;
  skid = the guest instructions executed meanwhile in host time.

The skid is the guest TSC at the kernel's reaction minus the TSC right after the load;
under -icount shift=0 the TSC counts instructions (checked by ``skidprobe spin``: a
loop of 2 instructions per iteration). The timer's cost is measured the same way: the
extra ticks a fixed loop takes with the timer on.

Run (one guest; ~10 min on a 2-core host)::

    python -P -m cxlssd.experiments.kmod_skid [--samples 300] [--poll-ns 5000,20000,100000]
        [--repeat 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import mmap
import os
import statistics
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from cxlssd.abi.protocol import PV_BYTES, PV_HEADER_DTYPE, PV_SLOT_DTYPE, word
from cxlssd.guest.image import ensure_image
from cxlssd.host_os.kmod.build import ensure_module
from cxlssd.host_os.kmod.doorbell import DoorbellServer
from cxlssd.host_os.kmod.load import GUEST_DIR, helper_stats, load_helper, unload_helper
from cxlssd.platform.config import load_config
from cxlssd.platform.machine import Platform

log = logging.getLogger(__name__)

PROBE = f"{GUEST_DIR}/skidprobe"
# The SSD DRAM scaled down so that the footprint is 8x the data cache (tests/platform/test_os_codesign.py).
SMALL_SSD = ("ssd_dram.size_bytes=2MiB", "write_log.size_bytes=256KiB")
FOOTPRINT_BYTES = 16 << 20
SPIN_CHECK_ITERATIONS = 5_000_000
DOORBELL_SPIN_ITERATIONS = 2_000_000  # 4 M instructions: longer than any skid seen
PROBE_TIMEOUT_S = 1800.0
DEFAULT_PERIODS = "5000,20000,100000"
PLUGIN_DOORBELL_ENV = "CXLSSD_PLUGIN_DOORBELL_FD"
PLUGIN_SETTLE_ENV = "CXLSSD_PLUGIN_DOORBELL_SETTLE_NS"
_QUERY_LONG, _QUERY_TICKET = word(PV_SLOT_DTYPE, "query_long"), word(PV_SLOT_DTYPE, "query_ticket")


class PvWatcher:
    """Rings the doorbell when vCPU 0's pv slot shows a new long-delay answer (host side)."""

    def __init__(self, pv_path: Path, server: DoorbellServer) -> None:
        self._pv_path = pv_path
        self._server = server
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pv-watcher", daemon=True)
        self.rings = 0

    def _watch(self) -> None:
        with open(self._pv_path, "r+b") as file:
            page = mmap.mmap(file.fileno(), PV_BYTES)
        try:
            words = np.frombuffer(page, np.uint64)
            first = PV_HEADER_DTYPE.itemsize // 8  # vCPU 0's slot
            last = int(words[first + _QUERY_TICKET])
            while not self._stop.is_set():
                ticket = int(words[first + _QUERY_TICKET])
                if ticket != last:
                    last = ticket
                    if words[first + _QUERY_LONG]:
                        self._server.ring()
                        self.rings += 1
            del words
        finally:
            page.close()

    def __enter__(self) -> PvWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def summary(values: list[int]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "min": ordered[0],
        "p10": ordered[len(ordered) // 10],
        "median": statistics.median(ordered),
        "p90": ordered[len(ordered) * 9 // 10],
        "max": ordered[-1],
        "mean": statistics.fmean(ordered),
    }


def run_probe(platform: Platform, argv: list[str], design: str | None) -> dict[str, Any]:
    if design is None:
        _, out, _ = platform.guest().run(argv, check=True, timeout_s=PROBE_TIMEOUT_S)
    else:
        with platform.attach(design, SMALL_SSD) as session:
            _, out, _ = session.run(argv, check=True, timeout_s=PROBE_TIMEOUT_S)
    result: dict[str, Any] = json.loads(out)
    return result


def spin_ticks_per_insn(platform: Platform) -> float:
    result = run_probe(platform, [PROBE, "spin", str(SPIN_CHECK_ITERATIONS)], None)
    return float(result["ticks"]) / (2 * SPIN_CHECK_ITERATIONS)


def timer_run(platform: Platform, tree: Path, poll_ns: int, skid_argv: list[str], suffix: list[str],
              seed: int, ticks_no_helper: float) -> dict[str, Any]:
    load_helper(platform.guest(), tree, poll_ns=poll_ns)
    ticks = spin_ticks_per_insn(platform)
    spin = max(2 * poll_ns, 10_000)  # iterations of 2 instructions: 4x the period
    started = time.monotonic()
    probe = run_probe(platform, [*skid_argv, str(spin), str(seed), *suffix], "skybyte-c")
    stats = helper_stats(platform.guest())
    unload_helper(platform.guest())
    return {"path": "timer", "poll_ns": poll_ns, "ticks_per_insn": ticks,
            "timer_cost_share": ticks / ticks_no_helper - 1, "long": probe["long"], "short": probe["short"],
            "unmatched": probe["unmatched"], "late": probe["late"], "skid": summary(probe["timer_skid"]),
            "query_ticks": summary(probe["query_ticks"]), "helper": stats,
            "wall_s": time.monotonic() - started}


def doorbell_run(platform: Platform, tree: Path, server: DoorbellServer, skid_argv: list[str],
                 suffix: list[str], seed: int, by_plugin: bool) -> dict[str, Any]:
    load_helper(platform.guest(), tree, poll_ns=0)
    started = time.monotonic()
    rings = -1  # counted by the plugin (its exit line in qemu.log)
    if by_plugin:
        probe = run_probe(platform, [*skid_argv, str(DOORBELL_SPIN_ITERATIONS), str(seed), *suffix],
                          "skybyte-c")
    else:
        with PvWatcher(platform.plugin_files().pv, server) as watcher:
            probe = run_probe(platform, [*skid_argv, str(DOORBELL_SPIN_ITERATIONS), str(seed), *suffix],
                              "skybyte-c")
        rings = watcher.rings
    stats = helper_stats(platform.guest())
    unload_helper(platform.guest())
    path = "doorbell-plugin" if by_plugin else "doorbell-watcher"
    # (ticks from before the access to after it, skid) per sample: whether the program ran on
    # after the access before the interrupt (then the ticks lack the handler's instructions).
    pairs = Counter((query, skid) for query, _, skid in probe["per_sample"])
    return {"path": path, "rings": rings, "long": probe["long"], "short": probe["short"],
            "query_ticks_and_skid": [[query, skid, n] for (query, skid), n in pairs.most_common(8)],
            "unmatched": probe["unmatched"], "late": probe["late"], "skid": summary(probe["doorbell_skid"]),
            "query_ticks": summary(probe["query_ticks"]), "helper": stats,
            "wall_s": time.monotonic() - started}


def switch_run(platform: Platform, tree: Path, park_ns: int, samples: int, seed: int) -> dict[str, Any]:
    """The switch's cost (plugin-rung doorbell only): the helper parks the thread whose
    access rang for ``park_ns`` of guest time; a second thread of the probe runs meanwhile."""
    load_helper(platform.guest(), tree, poll_ns=0, park_ns=park_ns)
    probe = run_probe(platform, [PROBE, "switch", str(FOOTPRINT_BYTES), str(samples), str(seed)], "skybyte-c")
    stats = helper_stats(platform.guest())
    unload_helper(platform.guest())
    parks = probe["parks"]
    columns = ("access_to_irq", "irq_to_park", "park_to_other_thread", "park_to_resumed")
    return {"path": "switch", "park_ns": park_ns, "long": probe["long"], "parked": len(parks),
            "other_thread_gaps": probe["gaps"], "helper": stats,
            **{name: summary([row[i] for row in parks if row[i]]) for i, name in enumerate(columns)}}


def measure(samples: int, poll_list_ns: list[int], repeat: int, doorbell: bool,
            plugin_doorbell: bool, straight: bool = False, switch_park_ns: int = 0) -> dict[str, Any]:
    """Timer runs for each period and a doorbell run (rung by a host watcher of the pv
    page), ``repeat`` times; with ``plugin_doorbell`` the plugin rings the doorbell
    itself and waits until QEMU took the ring (the prototype in cxlssd_plugin.c)."""
    config = load_config()
    image = ensure_image()
    tree = ensure_module(image.kernel)
    conditions = {"samples": samples, "footprint_bytes": FOOTPRINT_BYTES, "design": "skybyte-c",
                  "overrides": list(SMALL_SSD), "guest_clock": config.guest.clock,
                  "kernel": (tree / "release").read_text().strip(), "plugin_doorbell": plugin_doorbell,
                  "straight_insns_after_access": 200 if straight else 0,
                  "settle_ns": int(os.environ.get(PLUGIN_SETTLE_ENV, "0"))}
    results: dict[str, Any] = {"conditions": conditions, "runs": []}
    skid_argv = [PROBE, "skid", str(FOOTPRINT_BYTES), str(samples)]
    suffix = ["straight"] if straight else []
    with DoorbellServer() as server:
        pass_fds: tuple[int, ...] = ()
        if plugin_doorbell:  # QEMU inherits the eventfd; the plugin finds it in its environment
            os.environ[PLUGIN_DOORBELL_ENV] = str(server.eventfd())
            pass_fds = (server.eventfd(),)
        try:
            # The platform installs and loads the helper (no timer) before the guest is ready.
            platform = Platform(config, extra_qemu_args=server.qemu_args(), pass_fds=pass_fds,
                                kernel_helper_poll_ns=0)
            with platform:
                measure_on(platform, tree, server, results, skid_argv, suffix, poll_list_ns, repeat,
                           doorbell, plugin_doorbell, switch_park_ns, samples)
        finally:
            os.environ.pop(PLUGIN_DOORBELL_ENV, None)
    return results


def measure_on(platform: Platform, tree: Path, server: DoorbellServer, results: dict[str, Any],
               skid_argv: list[str], suffix: list[str], poll_list_ns: list[int], repeat: int,
               doorbell: bool, plugin_doorbell: bool, switch_park_ns: int = 0, samples: int = 0) -> None:
    unload_helper(platform.guest())
    ticks_no_helper = results["ticks_per_insn_no_helper"] = spin_ticks_per_insn(platform)
    for round_index in range(repeat):
        for poll_ns in poll_list_ns:
            run = timer_run(platform, tree, poll_ns, skid_argv, suffix, round_index + 1, ticks_no_helper)
            log.info("timer %d ns: skid %s", poll_ns, run["skid"])
            results["runs"].append({"round": round_index, **run})
        if switch_park_ns and plugin_doorbell:
            run = switch_run(platform, tree, switch_park_ns, samples, round_index + 1)
            log.info("switch: %s", run)
            results["runs"].append({"round": round_index, **run})
        elif doorbell or plugin_doorbell:
            run = doorbell_run(platform, tree, server, skid_argv, suffix, round_index + 1, plugin_doorbell)
            log.info("doorbell: skid %s", run["skid"])
            results["runs"].append({"round": round_index, **run})
    _, dmesg, _ = platform.guest().run(["sh", "-c", "dmesg | grep -i cxlssd_helper"], timeout_s=60)
    results["dmesg"] = dmesg.decode(errors="replace").splitlines()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--poll-ns", help="timer periods, comma-separated (default 5000,20000,100000; "
                        "none with --plugin-doorbell)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-doorbell", action="store_true", help="the timer path only")
    parser.add_argument("--plugin-doorbell", action="store_true",
                        help="the plugin rings the doorbell and waits until QEMU took it (no timer runs "
                             "unless --poll-ns is given)")
    parser.add_argument("--settle-ns", type=int, default=0,
                        help="with --plugin-doorbell: host ns the plugin keeps holding the vCPU after QEMU "
                             "took the ring")
    parser.add_argument("--switch-park-ns", type=int, default=0,
                        help="with --plugin-doorbell: measure what a switch costs instead, the helper "
                             "parking the thread for this many ns of guest time")
    parser.add_argument("--straight", action="store_true",
                        help="200 instructions follow the access in its basic block (a reaction one "
                             "translation block late shows as +200)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    poll_ns = args.poll_ns if args.poll_ns is not None else "" if args.plugin_doorbell else DEFAULT_PERIODS
    periods_ns = [int(v) for v in poll_ns.split(",") if v]
    if args.settle_ns:
        os.environ[PLUGIN_SETTLE_ENV] = str(args.settle_ns)
    results = measure(args.samples, periods_ns, args.repeat, not args.no_doorbell, args.plugin_doorbell,
                      args.straight, args.switch_park_ns)
    text = json.dumps(results, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

"""Measure the skid of the guest kernel helper (issue 14): guest instructions between a long
access and the guest kernel's reaction to the firmware's "long delay" answer, and what a
kernel switch costs.

Boots the default platform (its ``ivshmem-doorbell`` device and the helper,
``host_os/kmod/cxlssd_helper.c``, are part of it) and runs ``skidprobe``
(``host_os/kmod/skidprobe.c``) under ``skybyte-c``: random one-line plain loads over a
footprint 8x the SSD DRAM (most are flash reads, answered "long"). Under a design that
switches every device read is a query: the plugin holds the vCPU until the firmware has
answered in the pv slot, so the answer is there when the access retires; what is measured
is how the kernel learns of it:

- ``doorbell``: the plugin rings the doorbell on a long answer and holds the vCPU until
  QEMU's main loop took the ring (the platform's path);
- ``timer`` (``--poll-ns``): the helper's pinned hrtimer polls the slot every ``poll_ns``
  of guest time (under -icount shift=0, 1 ns per instruction): skid in [0, poll_ns] + the
  interrupt's entry, set by the guest's execution alone; its cost is the extra ticks a
  fixed loop takes with the timer on;
- ``--switch``: the switch itself (``skidprobe switch``: a second thread of the probe
  spins on the TSC, so the gap in its readings shows when it got the CPU).

The skid is the guest TSC at the kernel's reaction minus the TSC right before the load;
under -icount shift=0 the TSC counts instructions (checked by ``skidprobe spin``: a
loop of 2 instructions per iteration).

Run (one guest; 5-10 min on a 2-core host)::

    python -m cxlssd.experiments.kmod_skid [--samples 300] [--poll-ns 5000,20000,100000]
        [--switch] [--straight] [--repeat 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

from cxlssd.errors import ConfigError
from cxlssd.guest.image import ensure_image
from cxlssd.guest.runtime.install import GUEST_RUNTIME_DIR
from cxlssd.host_os.kmod.build import ensure_module
from cxlssd.host_os.kmod.load import helper_stats, load_helper, unload_helper
from cxlssd.platform.config import load_config
from cxlssd.platform.machine import Platform

log = logging.getLogger(__name__)

PROBE = f"{GUEST_RUNTIME_DIR}/bin/skidprobe"  # built with the guest runtime (libcxlssd maps the pv page)
# The SSD DRAM scaled down so that the footprint is 8x the data cache (tests/platform/test_os_codesign.py).
SMALL_SSD = ("ssd_dram.size_bytes=2MiB", "write_log.size_bytes=256KiB")
FOOTPRINT_BYTES = 16 << 20
SPIN_CHECK_ITERATIONS = 5_000_000
DOORBELL_SPIN_ITERATIONS = 2_000_000  # 4 M instructions: longer than any skid seen
PROBE_TIMEOUT_S = 1800.0
DEFAULT_PERIODS = "5000,20000,100000"


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


def doorbell_run(platform: Platform, tree: Path, skid_argv: list[str], suffix: list[str],
                 seed: int) -> dict[str, Any]:
    load_helper(platform.guest(), tree)
    started = time.monotonic()
    probe = run_probe(platform, [*skid_argv, str(DOORBELL_SPIN_ITERATIONS), str(seed), *suffix], "skybyte-c")
    stats = helper_stats(platform.guest())
    # (ticks from before the access to after it, skid) per sample: whether the program ran on
    # after the access before the interrupt (then the ticks lack the handler's instructions).
    pairs = Counter((query, skid) for query, _, skid in probe["per_sample"])
    return {"path": "doorbell", "long": probe["long"], "short": probe["short"],
            "query_ticks_and_skid": [[query, skid, n] for (query, skid), n in pairs.most_common(8)],
            "unmatched": probe["unmatched"], "late": probe["late"], "skid": summary(probe["doorbell_skid"]),
            "query_ticks": summary(probe["query_ticks"]), "helper": stats,
            "wall_s": time.monotonic() - started}


def switch_run(platform: Platform, tree: Path, samples: int, seed: int) -> dict[str, Any]:
    """The switch's cost: the helper parks the thread whose read was long (another thread
    of the probe spins meanwhile, so it always can)."""
    load_helper(platform.guest(), tree)
    probe = run_probe(platform, [PROBE, "switch", str(FOOTPRINT_BYTES), str(samples), str(seed)], "skybyte-c")
    stats = helper_stats(platform.guest())
    parks = probe["parks"]
    columns = ("access_to_irq", "irq_to_park", "park_to_other_thread", "park_to_resumed")
    return {"path": "switch", "long": probe["long"], "parked": len(parks),
            "other_thread_gaps": probe["gaps"], "helper": stats,
            **{name: summary([row[i] for row in parks if row[i]]) for i, name in enumerate(columns)}}


def measure(samples: int, poll_list_ns: list[int], repeat: int, straight: bool = False,
            switch: bool = False) -> dict[str, Any]:
    """Timer runs for each period and a doorbell run (or a switch run), ``repeat`` times."""
    config = load_config()
    if not config.guest.kernel_helper:
        raise ConfigError(f"{config.source}: guest.kernel_helper is off: the skid needs the helper")
    image = ensure_image()
    tree = ensure_module(image.kernel)
    conditions = {"samples": samples, "footprint_bytes": FOOTPRINT_BYTES, "design": "skybyte-c",
                  "overrides": list(SMALL_SSD), "guest_clock": config.guest.clock,
                  "kernel": (tree / "release").read_text().strip(),
                  "straight_insns_after_access": 200 if straight else 0}
    results: dict[str, Any] = {"conditions": conditions, "runs": []}
    skid_argv = [PROBE, "skid", str(FOOTPRINT_BYTES), str(samples)]
    suffix = ["straight"] if straight else []
    with Platform(config) as platform:
        unload_helper(platform.guest())
        ticks_no_helper = results["ticks_per_insn_no_helper"] = spin_ticks_per_insn(platform)
        for round_index in range(repeat):
            for poll_ns in poll_list_ns:
                run = timer_run(platform, tree, poll_ns, skid_argv, suffix, round_index + 1, ticks_no_helper)
                log.info("timer %d ns: skid %s", poll_ns, run["skid"])
                results["runs"].append({"round": round_index, **run})
            if switch:
                run = switch_run(platform, tree, samples, round_index + 1)
                log.info("switch: %s", run)
            else:
                run = doorbell_run(platform, tree, skid_argv, suffix, round_index + 1)
                log.info("doorbell: skid %s", run["skid"])
            results["runs"].append({"round": round_index, **run})
        _, dmesg, _ = platform.guest().run(["sh", "-c", "dmesg | grep -i cxlssd_helper"], timeout_s=60)
        results["dmesg"] = dmesg.decode(errors="replace").splitlines()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--poll-ns", default="", help="timer periods to measure too, comma-separated "
                        "(e.g. 5000,20000,100000)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--switch", action="store_true",
                        help="measure what a kernel switch costs instead of the doorbell's skid")
    parser.add_argument("--straight", action="store_true",
                        help="200 instructions follow the access in its basic block (a reaction one "
                             "translation block late shows as +200)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    periods_ns = [int(v) for v in args.poll_ns.split(",") if v]
    results = measure(args.samples, periods_ns, args.repeat, args.straight, args.switch)
    text = json.dumps(results, indent=1)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

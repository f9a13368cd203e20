"""Benchmark: how much the TCG plugin slows the guest (emulator wall-clock).

Boots the default platform once per mode and runs the same guest workloads in
each, timing them inside the guest. Modes:

- ``plain``: no plugin;
- ``count``: the plugin counting only (``llc=0``, no ring: the first plugin);
- ``live``: the plugin with its LLC model and the request ring, drained by the
  live firmware (``firmware/live.py``) in this process.

Workloads:

- ``python-loop``: an interpreter loop (ordinary code: many RAM loads/stores);
- ``dram-stride``: one store and one load per 64-byte line of 64 MiB on node 0;
- ``cxl-stride``: the same over 4 MiB on the CXL node (every access is MMIO in QEMU).

Prints boot time and each workload's time side by side, the plugin's counters
over the workloads, and for ``live`` the device requests the firmware drained
per second and its busy share. These are emulator wall-clock numbers, only
meant to measure the plugin's overhead; they are never platform results.

Run: ``python -P -m cxlssd.experiments.bench_plugin [--repeat N] [--modes plain,count,live]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from cxlssd.firmware.controller import Controller
from cxlssd.firmware.live import LiveDriver
from cxlssd.firmware.profile import load_profile
from cxlssd.paths import runtime_root
from cxlssd.platform.config import load_config
from cxlssd.platform.machine import Platform
from cxlssd.platform.plugin.build import ensure_plugin
from cxlssd.platform.plugin.counters import PluginCounters

# Runs in the guest: argv = workload name, repeats. Prints the best time in seconds.
GUEST_SCRIPT = r"""
import sys, time
name, repeats = sys.argv[1], int(sys.argv[2])
if name == "python-loop":
    def work():
        total = 0
        for i in range(300_000):
            total += i & 7
        return total
else:
    # Standard library only: the loop itself, not an import, is what is timed.
    size = (64 << 20) if name == "dram-stride" else (4 << 20)
    buf = bytearray(size)  # zero-filled: every page faulted in before timing
    ones = b"" * (size // 64)
    def work():
        buf[::64] = ones
        return sum(buf[::64])
best = float("inf")
for _ in range(repeats):
    start = time.perf_counter()
    work()
    best = min(best, time.perf_counter() - start)
print(best)
"""
WORKLOADS = ("python-loop", "dram-stride", "cxl-stride")
MODES = ("plain", "count", "live")
DESIGN = "skybyte-full"


def run_workloads(platform: Platform, repeat: int) -> dict[str, float]:
    times = {}
    cxl_node = platform.devices[0].node
    for name in WORKLOADS:
        node = cxl_node if name == "cxl-stride" else 0
        _, out, _ = platform.guest().run(
            ["numactl", f"--membind={node}", "python3", "-c", GUEST_SCRIPT, name, str(repeat)],
            check=True,
        )
        times[name] = float(out)
    return times


def measure(mode: str, repeat: int) -> dict[str, object]:
    platform = Platform(load_config())
    shm = runtime_root() / platform.name / "plugin.counters"
    ring = shm.with_name("plugin.ring")
    if mode == "count":
        platform.extra_qemu_args = ["-plugin", f"{ensure_plugin()},shm={shm},llc=0"]
    elif mode == "live":
        platform.extra_qemu_args = ["-plugin", f"{ensure_plugin()},shm={shm},ring={ring}"]
    with platform:
        result: dict[str, object] = {"boot_s": platform.boot_seconds}
        if mode == "plain":
            result["times_s"] = run_workloads(platform, repeat)
            return result
        with PluginCounters(shm) as counters:
            driver = None
            if mode == "live":
                controller = Controller.from_profile(load_profile(DESIGN), timebase="compute")
                driver = LiveDriver(ring, controller)
                driver.start()
            try:
                device = platform.devices[0]
                counters.publish_window(device.hpa_base, device.size_bytes, device.dpa_base)
                before = counters.snapshot()
                result["times_s"] = run_workloads(platform, repeat)
                delta = counters.snapshot() - before
            finally:
                if driver is not None:
                    driver.stop()
        result["counters"] = {
            "insns": delta.insns,
            "mem_accesses": delta.mem_accesses,
            "cxl_loads": delta.cxl_loads,
            "cxl_stores": delta.cxl_stores,
            "cxl_lines_touched": delta.windows[0].lines_touched,
            **{name: delta.total(name) for name in ("llc_misses_cxl", "device_reads", "device_writes",
                                                    "device_dropped")},
        }
        if driver is not None:
            stats = driver.stats()
            result["firmware"] = {
                **stats,
                "busy_share": stats["busy_s"] / stats["elapsed_s"] if stats["elapsed_s"] else 0.0,
            }
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per workload (best is kept)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {MODES}")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes: choose from {MODES}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = {mode: measure(mode, args.repeat) for mode in modes}
    base = modes[0]
    print(f"\nTCG plugin overhead (emulator wall-clock, not a platform result; x = vs {base})")
    print(f"{'':14}" + "".join(f" {m:>18}" for m in modes))
    rows: list[tuple[str, list[float]]] = [("boot", [float(results[m]["boot_s"]) for m in modes])]  # type: ignore[arg-type]
    rows += [(n, [float(results[m]["times_s"][n]) for m in modes]) for n in WORKLOADS]  # type: ignore[index]
    for name, values in rows:
        print(f"{name:14}" + "".join(f" {v:9.3f}s {v / values[0]:6.2f}x" for v in values))
    for mode in modes:
        if "counters" in results[mode]:
            print(f"{mode} plugin counters over the three workloads: {results[mode]['counters']}")
        if "firmware" in results[mode]:
            print(f"{mode} firmware: {results[mode]['firmware']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

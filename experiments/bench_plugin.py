"""Benchmark: how much the TCG plugin slows the guest (emulator wall-clock).

Boots the default platform twice, without and with the plugin, and runs the
same guest workloads in each, timing them inside the guest:

- ``python-loop``: an interpreter loop (ordinary code: many RAM loads/stores);
- ``dram-stride``: one store and one load per 64-byte line of 64 MiB on node 0;
- ``cxl-stride``: the same over 4 MiB on the CXL node (every access is MMIO in QEMU).

Prints boot time and each workload's time side by side, and the plugin's
counters for the CXL workload. These are emulator wall-clock numbers, only
meant to measure the plugin's overhead; they are never platform results.

Run: ``python -P -m cxlssd.experiments.bench_plugin [--repeat N]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

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


def measure(with_plugin: bool, repeat: int) -> dict[str, object]:
    platform = Platform(load_config())
    shm = runtime_root() / platform.name / "plugin.counters"
    if with_plugin:
        platform.extra_qemu_args = ["-plugin", f"{ensure_plugin()},shm={shm}"]
    with platform:
        result: dict[str, object] = {"boot_s": platform.boot_seconds}
        if not with_plugin:
            result["times_s"] = run_workloads(platform, repeat)
            return result
        with PluginCounters(shm) as counters:
            device = platform.devices[0]
            counters.publish_window(device.hpa_base, device.size_bytes)
            before = counters.snapshot()
            result["times_s"] = run_workloads(platform, repeat)
            delta = counters.snapshot() - before
        result["counters"] = {
            "insns": delta.insns,
            "mem_accesses": delta.mem_accesses,
            "cxl_loads": delta.cxl_loads,
            "cxl_stores": delta.cxl_stores,
            "cxl_lines_touched": delta.windows[0].lines_touched,
        }
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per workload (best is kept)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    plain = measure(False, args.repeat)
    plugged = measure(True, args.repeat)
    print("\nTCG plugin overhead (emulator wall-clock, not a platform result)")
    print(f"{'':14} {'plain TCG':>11} {'with plugin':>12} {'slowdown':>9}")
    rows = [("boot", plain["boot_s"], plugged["boot_s"])]
    rows += [(n, plain["times_s"][n], plugged["times_s"][n]) for n in WORKLOADS]  # type: ignore[index]
    for name, a, b in rows:
        print(f"{name:14} {a:10.3f}s {b:11.3f}s {b / a:8.2f}x")  # type: ignore[operator]
    print(f"plugin counters over the three workloads: {plugged['counters']}")
    if args.json:
        args.json.write_text(json.dumps({"plain": plain, "plugin": plugged}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

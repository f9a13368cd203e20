"""Benchmark: how much the TCG plugin and the live firmware slow the guest (emulator wall-clock).

Boots the default platform once per mode and runs the same guest workloads in
each, timing them inside the guest. Modes:

- ``plain``: no plugin;
- ``dormant``: the plugin loaded as every platform loads it, not attached
  (instructions and ROI markers only);
- ``live``: ``skybyte-full`` attached (``Platform.attach``): the plugin active
  (LLC model, clock, request ring) and the firmware process serving the ring.

Workloads:

- ``python-loop``: an interpreter loop (ordinary code: many RAM loads/stores);
- ``dram-stride``: one store and one load per 64-byte line of 64 MiB on node 0;
- ``cxl-stride``: the same over 4 MiB on the CXL node (every access is MMIO in
  QEMU): the memory-bound workload on node 1 of issue 4's 5x target.

Prints boot time and each workload's time side by side with its ratio to the
first mode, and for ``live`` the device requests the firmware served per second
of the run and its busy share. These are emulator wall-clock numbers, only
meant to measure overhead; they are never platform results.

Run: ``./cxlssd bench-plugin [--repeat N] [--modes plain,dormant,live] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

from cxlssd.errors import ConfigError
from cxlssd.platform.config import load_config
from cxlssd.platform.live import LiveSession
from cxlssd.platform.machine import Platform

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
MODES = ("plain", "dormant", "live")
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
    with Platform(load_config(), plugin=mode != "plain") as platform:
        result: dict[str, object] = {"boot_s": platform.boot_seconds}
        session: contextlib.AbstractContextManager[LiveSession | None] = (
            platform.attach(DESIGN) if mode == "live" else contextlib.nullcontext()
        )
        with session as live:
            result["times_s"] = run_workloads(platform, repeat)
        if live is not None:
            driver = live.results["driver"]
            model = live.results["counters"]["model"]
            result["firmware"] = {
                "requests": model["requests"],
                "requests_per_s": model["requests"] / driver["elapsed_s"],
                "busy_share": driver["busy_s"] / driver["elapsed_s"],
                "requests_per_busy_s": driver["requests_per_busy_s"],
            }
        return result


def _rows(results: dict[str, dict[str, object]], modes: list[str]) -> Iterator[tuple[str, list[float]]]:
    yield "boot", [float(results[m]["boot_s"]) for m in modes]  # type: ignore[arg-type]
    for name in WORKLOADS:
        yield name, [float(results[m]["times_s"][name]) for m in modes]  # type: ignore[index]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=3, help="runs per workload (best is kept)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {MODES}")
    parser.add_argument("--json", type=Path, help="also write the results here")


def run(args: argparse.Namespace) -> int:
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        raise ConfigError(f"--modes {args.modes!r}: choose from {', '.join(MODES)}")
    results = {mode: measure(mode, args.repeat) for mode in modes}
    base = modes[0]
    print(f"\nTCG plugin overhead (emulator wall-clock, not a platform result; x = vs {base})")
    print(f"{'':14}" + "".join(f" {m:>18}" for m in modes))
    for name, values in _rows(results, modes):
        print(f"{name:14}" + "".join(f" {v:9.3f}s {v / values[0]:6.2f}x" for v in values))
    for mode in modes:
        if "firmware" in results[mode]:
            print(f"{mode} firmware: {results[mode]['firmware']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

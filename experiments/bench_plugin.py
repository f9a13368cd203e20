"""Benchmark: how much the TCG plugin and the live firmware slow the guest (emulator wall-clock).

Boots the default platform once per mode and runs the same guest workloads in
each, timed on the host: the guest's own clocks follow its instructions
(``guest.clock: instructions``, QEMU's -icount), so they cannot time emulation.
A workload's time is that of a command running it ``1 + repeat`` times less that
of one running it once, over ``repeat`` (the command's start-up and SSH cancel),
in the QEMU process's CPU time (user + system: what emulation costs, and far less
disturbed than wall-clock by other jobs on the shared cores) and in wall-clock.
Modes:

- ``plain``: no plugin;
- ``dormant``: the plugin loaded as every platform loads it, not attached
  (instructions and ROI markers only);
- ``live``: ``skybyte-full`` attached (``Platform.attach``): the plugin active
  (LLC model, clock, request ring) and the firmware process serving the ring;
- ``live-host-clock``: the same with the guest's clocks on host time
  (``guest.clock: host``, no -icount): what ``live`` cost before issue 15.

Workloads:

- ``python-loop``: an interpreter loop (ordinary code: many RAM loads/stores);
- ``dram-stride``: one store and one load per 64-byte line of 64 MiB on node 0;
- ``cxl-stride``: the same over 4 MiB on the CXL node (every access is MMIO in
  QEMU): the memory-bound workload on node 1 of issue 4's 5x target.

Prints boot time and each workload's time side by side with its ratio to the
first mode, and for ``live`` the device requests the firmware served per second
of the run and its busy share. These are emulator wall-clock numbers, only
meant to measure overhead; they are never platform results.

Run: ``./cxlssd bench-plugin [--repeat N] [--modes plain,dormant,live,live-host-clock] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from cxlssd.errors import ConfigError
from cxlssd.platform.config import load_config
from cxlssd.platform.live import LiveSession
from cxlssd.platform.machine import Platform

# Runs in the guest: argv = workload name, times to run it.
GUEST_SCRIPT = r"""
import sys
name, times = sys.argv[1], int(sys.argv[2])
if name == "python-loop":
    def work():
        total = 0
        for i in range(1_000_000):
            total += i & 7
        return total
else:
    # Standard library only: the loop itself, not an import, is what is timed.
    size = (64 << 20) if name == "dram-stride" else (4 << 20)
    # Passes enough that the work outweighs the buffer's set-up (zero-filling 4 MiB
    # of the CXL window takes QEMU's MMIO path byte by byte), which the difference of
    # two runs cancels only if it is small against the work.
    passes = 8 if name == "dram-stride" else 32
    buf = bytearray(size)  # zero-filled: every page faulted in before timing
    ones = b"\x01" * (size // 64)
    def work():
        for _ in range(passes):
            buf[::64] = ones
            total = sum(buf[::64])
        return total
for _ in range(times):
    work()
"""
WORKLOADS = ("python-loop", "dram-stride", "cxl-stride")
MODES = ("plain", "dormant", "live", "live-host-clock")
DESIGN = "skybyte-full"


def _qemu_cpu_s(platform: Platform) -> float:
    """CPU time (user + system) the platform's QEMU process has used so far."""
    assert platform.rundir is not None
    pid = (platform.rundir / "qemu.pid").read_text().strip()
    # /proc/PID/stat: the fields after the command's ")", utime and stime are the 12th and 13th.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _host_seconds(platform: Platform, argv: list[str]) -> tuple[float, float]:
    """(QEMU CPU seconds, wall-clock seconds) of running ``argv`` in the guest."""
    cpu, wall = _qemu_cpu_s(platform), time.monotonic()
    platform.guest().run(argv, check=True)
    return _qemu_cpu_s(platform) - cpu, time.monotonic() - wall


def run_workloads(platform: Platform, repeat: int) -> dict[str, dict[str, float]]:
    """Per workload: QEMU CPU seconds and wall-clock seconds of one run."""
    times = {}
    cxl_node = platform.devices[0].node
    for name in WORKLOADS:
        node = cxl_node if name == "cxl-stride" else 0
        command = ["numactl", f"--membind={node}", "python3", "-c", GUEST_SCRIPT, name]
        once = _host_seconds(platform, [*command, "1"])
        more = _host_seconds(platform, [*command, str(1 + repeat)])
        cpu_s, wall_s = ((m - o) / repeat for m, o in zip(more, once, strict=True))
        times[name] = {"qemu_cpu_s": cpu_s, "wall_s": wall_s}
    return times


def measure(mode: str, repeat: int) -> dict[str, object]:
    config = load_config()
    if mode == "live-host-clock":
        config = config.model_copy(update={"guest": config.guest.model_copy(update={"clock": "host"})})
    with Platform(config, plugin=mode != "plain") as platform:
        result: dict[str, object] = {"boot_s": platform.boot_seconds}
        session: contextlib.AbstractContextManager[LiveSession | None] = (
            platform.attach(DESIGN) if mode.startswith("live") else contextlib.nullcontext()
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
    yield "boot (wall)", [float(results[m]["boot_s"]) for m in modes]  # type: ignore[arg-type]
    for name in WORKLOADS:
        for kind in ("qemu_cpu_s", "wall_s"):
            label = f"{name} ({'cpu' if kind == 'qemu_cpu_s' else 'wall'})"
            yield label, [float(results[m]["times_s"][name][kind]) for m in modes]  # type: ignore[index]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=3, help="runs per workload (their mean is kept)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, from {MODES}")
    parser.add_argument("--json", type=Path, help="also write the results here")


def run(args: argparse.Namespace) -> int:
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        raise ConfigError(f"--modes {args.modes!r}: choose from {', '.join(MODES)}")
    results = {mode: measure(mode, args.repeat) for mode in modes}
    base = modes[0]
    print(f"\nTCG plugin overhead (emulator wall-clock, not a platform result; x = vs {base})")
    print(f"{'':22}" + "".join(f" {m:>18}" for m in modes))
    for name, values in _rows(results, modes):
        ratios = [v / values[0] if values[0] > 0 else float("nan") for v in values]
        print(f"{name:22}" + "".join(f" {v:9.3f}s {r:6.2f}x" for v, r in zip(values, ratios, strict=True)))
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

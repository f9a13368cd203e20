"""CLI of the platform: ``guest exec``, ``guest shell`` and ``demo``."""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
from pathlib import Path

from cxlssd.errors import ConfigError
from cxlssd.firmware.replay import compare_designs
from cxlssd.firmware.synth import SynthSpec
from cxlssd.platform.config import DEFAULT_CONFIG, format_size, load_config
from cxlssd.platform.machine import Platform

log = logging.getLogger(__name__)

NUMA_PROBE = Path(__file__).resolve().parents[1] / "guest" / "probes" / "numa_probe.py"
PROBE_SIZE_MIB = 16
DEMO_DESIGNS = ("base-cssd", "skybyte-w", "skybyte-p", "skybyte-full", "dram-only")
# 1 M requests, zipf over 2 GiB: larger than the 448 MiB of SSD DRAM, so designs differ.
DEMO_TRACE = SynthSpec(pattern="zipf", requests=1_000_000, footprint_bytes=2 << 30)


def register(subparsers: argparse._SubParsersAction) -> None:
    guest = subparsers.add_parser("guest", help="boot a guest and use it")
    guest_commands = guest.add_subparsers(dest="guest_command", required=True, metavar="COMMAND")

    run = guest_commands.add_parser(
        "exec",
        help="boot, run a command in the guest, shut down; exits with its status",
        description="Example: ./cxlssd guest exec -- numactl -H",
    )
    _add_config_option(run)
    run.add_argument(
        "argv",
        nargs=argparse.REMAINDER,
        metavar="-- CMD ...",
        help="the command to run in the guest",
    )
    run.set_defaults(handler=guest_exec)

    shell = guest_commands.add_parser(
        "shell", help="boot and open an interactive shell in the guest"
    )
    _add_config_option(shell)
    shell.set_defaults(handler=guest_shell)

    demo = subparsers.add_parser(
        "demo", help="boot the default platform, show the CXL device and NUMA nodes, probe them"
    )
    _add_config_option(demo)
    demo.set_defaults(handler=run_demo)


def _add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=DEFAULT_CONFIG,
        help=f"platform config YAML (default: {DEFAULT_CONFIG.name})",
    )


def guest_exec(args: argparse.Namespace) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise ConfigError("guest exec needs a command, e.g. ./cxlssd guest exec -- numactl -H")
    config = load_config(args.config)
    with Platform(config) as platform:
        status, _, _ = platform.guest().run(
            argv, stdout=sys.stdout.buffer, stderr=sys.stderr.buffer
        )
    return status


def guest_shell(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    with Platform(config) as platform:
        assert platform.rundir is not None
        argv = platform.guest().interactive_argv(platform.rundir / "known_hosts")
        return subprocess.run(argv).returncode


def run_demo(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    with Platform(config) as platform:
        guest = platform.guest()
        print(
            f"== platform {platform.name}: {format_size(config.guest.dram_bytes)} DRAM on node 0, "
            f"boot-to-ready {platform.boot_seconds:.0f} s (emulator wall-clock)"
        )
        for device in platform.devices:
            print(
                f"   {device.memdev}: {format_size(device.size_bytes)} CXL Type-3, {device.region} "
                f"at HPA {device.hpa_base:#x}, NUMA node {device.node} (CPU-less)"
            )
        print("== cxl list -M -R (in the guest)")
        guest.run(["cxl", "list", "-M", "-R"], stdout=sys.stdout.buffer, stderr=sys.stderr.buffer)
        print("== numactl -H (in the guest)")
        guest.run(["numactl", "-H"], stdout=sys.stdout.buffer, stderr=sys.stderr.buffer)
        print(
            f"== {PROBE_SIZE_MIB} MiB probe per node. Emulator wall-clock under TCG: it shows the "
            "device is really used (CXL accesses take QEMU's MMIO path), it is NOT a result."
        )
        probe = NUMA_PROBE.read_bytes()
        for node in [0, *(d.node for d in platform.devices)]:
            _, out, _ = guest.run(
                ["numactl", f"--membind={node}", "python3", "-", str(PROBE_SIZE_MIB)],
                stdin=probe,
                check=True,
            )
            result = json.loads(out)
            print(
                f"   node {node}: sequential read {result['seq_read_mib_per_s']:8.1f} MiB/s, "
                f"random read {result['random_read_ns']:8.0f} ns/access"
            )
    print(f"== firmware model, modelled time: {DEMO_TRACE.requests:,} requests, {DEMO_TRACE.pattern} "
          f"over {format_size(DEMO_TRACE.footprint_bytes)}, {DEMO_TRACE.write_fraction:.0%} writes "
          "(replayed; attaching the model live to the guest is the next step)")
    print(f"   {'design':<14}{'modelled ms':>12}{'speedup':>9}{'of DRAM-only':>14}"
          f"{'flash reads':>13}{'flash programs':>16}")
    for row in compare_designs(DEMO_TRACE, DEMO_DESIGNS):
        print(f"   {row['design']:<14}{row['modelled_ns'] / 1e6:>12.2f}{row['speedup']:>8.2f}x"
              f"{row['fraction_of_dram_only']:>13.1%}{row['flash_reads']:>13,}{row['flash_programs']:>16,}")
    return 0

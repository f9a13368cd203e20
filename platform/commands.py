"""CLI of the platform: ``guest exec`` and ``guest shell``."""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from cxlssd.errors import ConfigError
from cxlssd.firmware.profile import load_profile
from cxlssd.guest.runtime.install import with_guest_env
from cxlssd.paths import check_writable_output
from cxlssd.platform.config import CONFIG_DIR, DEFAULT_CONFIG, load_config, load_multi_config
from cxlssd.platform.machine import Platform
from cxlssd.platform.multi import MultiPlatform, live_designs

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    guest = subparsers.add_parser("guest", help="boot a guest and use it")
    guest_commands = guest.add_subparsers(dest="guest_command", required=True, metavar="COMMAND")

    run = guest_commands.add_parser(
        "exec",
        help="boot, run a command in the guest, shut down; exits with its status",
        description="Example: ./cxlssd guest exec -- numactl -H. With --design the firmware "
        "is attached live and the results of the command's regions of interest are printed "
        "in modelled time: ./cxlssd guest exec --design skybyte-full -- chase --bytes 64M",
    )
    _add_config_option(run)
    run.add_argument("--design", help="attach this firmware design live (profile name or .yaml); "
                     "the command's memory is bound to the CXL node (the movable DRAM node for dram-only)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a profile key of --design, e.g. cache.ways=8")
    run.add_argument("--record", type=Path, help="with --design: record the device-request stream "
                     "to this trace (replay it with ./cxlssd replay)")
    run.add_argument("--results", type=Path, help="with --design: write the full results as JSON")
    run.add_argument("--no-bind", action="store_true",
                     help="with --design: do not bind the command's memory (it binds itself)")
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
    _register_side_by_side(subparsers)


def _register_side_by_side(subparsers: argparse._SubParsersAction) -> None:
    both = subparsers.add_parser(
        "side-by-side",
        help="start the guests of a multi-guest config together, each with its design attached "
        "live, run the same command in all of them at once; one table of modelled times",
        description="Example: ./cxlssd side-by-side --config platform/configs/pair.yaml -- chase --bytes 8M",
    )
    both.add_argument("--config", type=Path, default=CONFIG_DIR / "pair.yaml",
                      help="multi-guest config whose guests each name a design (default: pair.yaml)")
    both.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to run")
    both.set_defaults(handler=side_by_side)


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
    if args.design is None and (args.record or args.results or args.overrides or args.no_bind):
        raise ConfigError("--set, --record, --results and --no-bind need --design NAME")
    if args.design is not None:
        load_profile(args.design, args.overrides)  # a bad design fails before the guest boots
    for output, what in ((args.results, "results"), (args.record, "trace")):
        if output is not None:
            check_writable_output(output, what)  # before the boot, not after the run
    config = load_config(args.config)
    with Platform(config) as platform:
        if args.design is None:
            status, _, _ = platform.guest().run(
                with_guest_env(argv), stdout=sys.stdout.buffer, stderr=sys.stderr.buffer
            )
            return status
        with platform.attach(args.design, args.overrides, args.record) as session:
            status, _, _ = session.run(
                argv, bind=not args.no_bind, stdout=sys.stdout.buffer, stderr=sys.stderr.buffer
            )
    results = {**session.results, "command": argv, "exit_status": status, "node": session.node}
    for line in roi_lines(results):
        print(line)
    if args.results:
        args.results.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        print(f"results: {args.results}")
    if args.record:
        print(f"trace: {args.record} (./cxlssd replay {args.record} --design NAME)")
    return status


def side_by_side(args: argparse.Namespace) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise ConfigError("side-by-side needs a command, e.g. -- chase --bytes 8M")
    config = load_multi_config(args.config)
    live_designs(config)  # every guest names a design: checked before anything boots
    with MultiPlatform(config) as multi:
        runs = multi.run_live(argv)
    print(f"== side by side ({config.name}): {shlex.join(argv)}, modelled time per ROI")
    print(f"   {'guest':<16} {'design':<14} {'roi':>5} {'modelled ms':>12} {'exit':>5}")
    for guest, run in runs.items():
        for roi in run.results.get("rois", []) or [{"roi": "-", "modelled_ns": float("nan")}]:
            modelled_ms = roi["modelled_ns"] / 1e6
            print(f"   {guest:<16} {run.design:<14} {roi['roi']:>5} {modelled_ms:>12.3f} {run.status:>5}")
    return max(run.status for run in runs.values())


def roi_lines(results: dict[str, Any]) -> list[str]:
    """A table of a live run's ROIs, in modelled time."""
    rois = results.get("rois", [])
    lines = [f"== design {results['design']}: {len(rois)} regions of interest (modelled time)"]
    if not rois:
        lines.append("   no ROI ended: mark one with cxlssd_roi_begin/end (docs/guest-runtime.md)")
        return lines
    lines.append(f"   {'roi':>5} {'modelled ms':>12} {'instructions':>14} {'LLC miss DRAM':>14} "
                 f"{'device reads':>13} {'writes':>9} {'flash reads':>12} {'programs':>9}")
    for r in rois:
        cpu = r.get("cpu", {})
        flash = r["device"].get("flash", {})
        model = r["device"]["model"]
        lines.append(
            f"   {r['roi']:>5} {r['modelled_ns'] / 1e6:>12.3f} {cpu.get('insns', 0):>14,} "
            f"{cpu.get('llc_misses_dram', 0):>14,} {model['reads']:>13,} {model['writes']:>9,} "
            f"{flash.get('reads_total', 0):>12,} {flash.get('programs_total', 0):>9,}"
        )
    if results.get("unfinished_rois"):
        lines.append(f"   unfinished (began, never ended): {results['unfinished_rois']}")
    return lines


def guest_shell(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    with Platform(config) as platform:
        assert platform.rundir is not None
        argv = platform.guest().interactive_argv(platform.rundir / "known_hosts")
        return subprocess.run(argv).returncode

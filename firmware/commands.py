"""CLI sub-commands of the firmware model: ``replay``, ``trace``, ``bench-firmware``,
``serve-firmware`` (the firmware process the platform starts)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from cxlssd.abi.ring import RingError
from cxlssd.errors import ConfigError, FirmwareError, InputError
from cxlssd.firmware import bench
from cxlssd.firmware.profile import available_profiles, load_profile
from cxlssd.firmware.replay import replay_file, summary_lines, with_recorded_device
from cxlssd.firmware.serve import serve
from cxlssd.firmware.synth import PATTERNS, SynthSpec, generate
from cxlssd.firmware.trace import TraceReader, TraceWriter
from cxlssd.paths import check_writable_output
from cxlssd.validation import parse_size

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the firmware model's sub-commands."""
    p = subparsers.add_parser(
        "replay", help="replay a request trace through a modelled device",
        description="Replay TRACE on a device profile; print counters and modelled stalls.",
    )
    p.add_argument("trace", help="trace file (see docs/firmware.md for the format)")
    p.add_argument("--design", default="base-cssd",
                   help=f"profile name ({', '.join(available_profiles())}) or a .yaml path")
    _add_set(p)
    p.add_argument("--out", type=Path, help="write the results (with the full profile) as JSON")
    p.add_argument("--no-vectorize", action="store_true",
                   help="serve every request on the per-request path (slower; same answers)")
    p.add_argument("--as-threads", action="store_true",
                   help="a live run's trace: schedule its guest threads by the design's thread model "
                        "instead of replaying the guest's own switches (docs/firmware.md)")
    p.set_defaults(handler=cmd_replay)

    trace = subparsers.add_parser("trace", help="make or inspect request traces")
    actions = trace.add_subparsers(dest="trace_command", required=True, metavar="ACTION")
    s = actions.add_parser("synth", help="write a synthetic trace")
    s.add_argument("out", type=Path)
    _add_spec(s)
    s.set_defaults(handler=cmd_synth)
    i = actions.add_parser("info", help="print a trace's header and metadata")
    i.add_argument("trace", type=Path)
    i.set_defaults(handler=cmd_info)

    b = subparsers.add_parser(
        "bench-firmware", help="replay throughput (requests/s) and peak memory per profile",
    )
    b.add_argument("--profiles", default=",".join(bench.DEFAULT_PROFILES),
                   help="comma-separated profile names")
    _add_spec(b, requests=10_000_000, footprint="2GiB")
    b.add_argument("--out", type=Path, help="write the rows as JSON")
    b.set_defaults(handler=cmd_bench)

    f = subparsers.add_parser(
        "serve-firmware", help="serve a running guest's plugin ring (started by the platform)",
        description="Run the live firmware on the plugin's device-request ring until SIGTERM, "
        "SIGINT or QEMU's exit; then write the results as JSON. `guest exec --design` starts it.",
    )
    f.add_argument("--ring", type=Path, required=True, help="the plugin's ring file")
    f.add_argument("--counters", type=Path, help="the plugin's counters file (for per-ROI CPU counters)")
    f.add_argument("--design", default="base-cssd", help="profile name or a .yaml path")
    _add_set(f)
    f.add_argument("--pv", type=Path, help="the paravirtual clock page (answers the guest's clock reads)")
    f.add_argument("--control", type=Path, help="control file: firmware knobs appended as JSON lines")
    f.add_argument("--cache-map", type=Path,
                   help="the plugin's cache map: which device pages are in SSD DRAM (docs/host-os.md)")
    f.add_argument("--record", type=Path, help="record the request stream to this trace file")
    f.add_argument("--results", type=Path, required=True, help="where to write the results (JSON)")
    f.set_defaults(handler=cmd_serve)


def _add_set(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a profile key, e.g. cache.ways=8")


def _add_spec(
    parser: argparse.ArgumentParser, requests: int = 1_000_000, footprint: str = "1GiB"
) -> None:
    d = SynthSpec()
    parser.add_argument("--pattern", choices=PATTERNS, default=d.pattern)
    parser.add_argument("--requests", type=int, default=requests)
    parser.add_argument("--footprint", default=footprint, help="bytes touched (e.g. 1GiB)")
    parser.add_argument("--write-fraction", type=float, default=d.write_fraction)
    parser.add_argument("--theta", type=float, default=d.zipf_theta, help="zipf skew")
    parser.add_argument("--hot", default="64MiB", help="hotset: hot-set size")
    parser.add_argument("--hot-fraction", type=float, default=d.hot_fraction,
                        help="hotset: share of requests to the hot set")
    parser.add_argument("--gap-ns", type=int, default=d.gap_ns,
                        help="computation between two requests of a vCPU")
    parser.add_argument("--vcpus", type=int, default=d.vcpus)
    parser.add_argument("--threads", type=int, default=d.threads,
                        help="threads per vCPU, scheduled on long delays in replay (SkyByte: 3)")
    parser.add_argument("--seed", type=int, default=d.seed)


def _spec(args: argparse.Namespace) -> SynthSpec:
    return SynthSpec(
        pattern=args.pattern, requests=args.requests,
        footprint_bytes=parse_size(args.footprint, "--footprint"),
        write_fraction=args.write_fraction, zipf_theta=args.theta,
        hot_bytes=parse_size(args.hot, "--hot"), hot_fraction=args.hot_fraction,
        gap_ns=args.gap_ns, vcpus=args.vcpus, threads=args.threads, seed=args.seed,
    )


def cmd_replay(args: argparse.Namespace) -> int:
    if not Path(args.trace).is_file():
        raise InputError(f"trace {args.trace} does not exist; make one with `cxlssd trace synth`")
    profile = load_profile(args.design, with_recorded_device(args.trace, args.overrides))
    if args.out:
        check_writable_output(args.out, "results")  # before the replay, not after it
    result = replay_file(args.trace, profile, vectorize=not args.no_vectorize, as_threads=args.as_threads)
    for line in summary_lines(result):
        print(line)
    if args.out:
        _write_json(args.out, result)
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    spec = _spec(args)
    try:
        with TraceWriter(args.out, spec.metadata()) as writer:
            for chunk in generate(spec):
                writer.write(chunk)
    except OSError as error:
        raise InputError(f"cannot write trace {args.out}: {error.strerror}") from None
    print(f"wrote {spec.requests} requests to {args.out}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    reader = TraceReader(args.trace)
    print(json.dumps({"records": reader.records, "chunks": reader.n_chunks,
                      "timebase": reader.timebase, "metadata": reader.metadata}, indent=2))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    profiles = [name.strip() for name in args.profiles.split(",") if name.strip()]
    for name in profiles:
        load_profile(name)  # fail early on a misspelt name
    spec = _spec(args)
    log.info("benchmarking %d profiles on %d %s requests", len(profiles), spec.requests,
             spec.pattern)
    rows = bench.run(spec, profiles)
    for line in bench.table(rows):
        print(line)
    if args.out:
        _write_json(args.out, {"spec": spec.metadata(), "rows": rows})
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    profile = load_profile(args.design, args.overrides)
    try:
        serve(args.ring, profile, args.results, args.counters, args.record, pv_path=args.pv,
              control_path=args.control, cache_map_path=args.cache_map)
    except RingError as error:
        raise FirmwareError(f"the firmware stopped: {error}") from None
    return 0


def _write_json(path: Path, data: object) -> None:
    try:
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    except OSError as error:
        raise ConfigError(f"cannot write {path}: {error.strerror}") from None

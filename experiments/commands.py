"""CLI sub-commands of the experiments area: ``run``, ``demo`` (the main job), ``bench-plugin``."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from cxlssd.experiments import bench_plugin
from cxlssd.experiments.report import table_lines, write_results
from cxlssd.experiments.runner import ExperimentRunner
from cxlssd.experiments.spec import DEMO_FILE, Experiment, load_experiment
from cxlssd.setup_commands import ensure_extra
from cxlssd.validation import format_size

log = logging.getLogger(__name__)




def register(subparsers: argparse._SubParsersAction) -> None:
    run = subparsers.add_parser(
        "run", help="run an experiment (designs x workloads live, or x traces replayed); resumable",
        description="Replay the experiment's traces, boot its platform once for the live workloads, "
        "run every point not yet in --out (an interrupted run resumes), then write results.csv, "
        "results.json, report.md and figures (PNG, SVG, PDF; docs/experiments.md).",
    )
    run.add_argument("experiment", type=Path, help="experiment YAML (see experiments/demo.yaml)")
    run.add_argument("--out", type=Path, help="results directory (default: results/NAME)")
    run.add_argument(
        "--cluster", metavar="ADDRESS",
        help="run the points on a Ray cluster: ray://HOST:PORT (Ray Client), HOST:PORT or auto (from a "
        "node of the cluster), or local (a Ray head on this machine, loopback only, for this run); "
        "installs Ray on first use (docs/experiments.md)",
    )
    run.set_defaults(handler=cmd_run)

    demo = subparsers.add_parser(
        "demo", help="the main job: the built-in experiment (a few workloads x base-cssd / "
        "skybyte-full / dram-only; 11.5-28 minutes here, as fast as the host is), "
        "table and figures at the end",
    )
    demo.add_argument("--out", type=Path, help="results directory (default: results/demo)")
    demo.set_defaults(handler=cmd_demo)

    bench = subparsers.add_parser(
        "bench-plugin",
        help="guest slowdown: plain TCG vs the dormant plugin vs a design attached live",
        description=bench_plugin.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench_plugin.add_arguments(bench)
    bench.set_defaults(handler=bench_plugin.run)


def run_experiment(experiment: Experiment, out: Path | None, cluster: str | None = None) -> int:
    out_dir = out or Path("results") / experiment.name
    points = experiment.points()
    replay = sum(1 for p in points if p.trace is not None)
    cases = len({p.case for p in points})
    print(f"== experiment {experiment.name}: {len(experiment.designs)} designs x {cases} cases "
          f"= {len(points)} points ({len(points) - replay} live runs, {replay} replays without a guest), "
          f"results in {out_dir}/ (modelled time; an interrupted run resumes)")
    if cluster is None:
        rows = ExperimentRunner(experiment, out_dir).run()
    else:
        ensure_extra("cluster")
        from cxlssd.experiments.cluster import ClusterRunner  # Ray is optional: imported when used

        rows = ClusterRunner(experiment, out_dir, cluster).run()
    written = write_results(experiment, rows, out_dir)
    for line in table_lines(experiment, written["table"]):
        print(f"   {line}")
    print(f"== report: {out_dir / 'report.md'}")
    print("== figures (SVG and PDF beside each): "
          + ", ".join(str(p) for p in written["plots"] if p.suffix == ".png"))
    status = 0
    if written["failed"]:
        print(f"== SELF-CHECK FAILED: {', '.join(written['failed'])}")
        status = 1
    if written["injection_problems"]:
        print(f"== QMP INJECTIONS NOT SENT OR NOT SEEN: {', '.join(written['injection_problems'])}")
        status = 1
    return status


def cmd_run(args: argparse.Namespace) -> int:
    return run_experiment(load_experiment(args.experiment), args.out, args.cluster)


def cmd_demo(args: argparse.Namespace) -> int:
    experiment = load_experiment(DEMO_FILE)
    from cxlssd.platform.config import load_config

    config = load_config(experiment.platform)
    devices = ", ".join(format_size(d.size_bytes) for d in config.cxl_devices)
    movable = config.guest.movable_dram_bytes
    dram = f"{format_size(config.guest.dram_bytes)} DRAM on node 0" + (
        f", {format_size(movable)} on node 1 for promoted pages and dram-only" if movable else "")
    cxl_node = 2 if movable else 1
    print(f"== the demo: one guest ({dram}, CXL Type-3 {devices} on node {cxl_node}) running each "
          "workload under each design with the SSD firmware attached")
    return run_experiment(experiment, args.out)

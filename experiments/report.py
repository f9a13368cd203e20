"""An experiment's results: CSV, JSON (with everything needed to reproduce it),
a Markdown report and figures (PNG, SVG and PDF; :mod:`.figures`), all in modelled time.

Per case (a workload point) and design: modelled time, speedup over the
baseline design, fraction of the ideal design (DRAM-only), flash traffic and
its reduction against the baseline. Over the cases: geometric means of speedup and
fraction of ideal, and the flash reduction of all the cases' flash operations.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cxlssd
from cxlssd.errors import PrerequisiteError
from cxlssd.experiments.spec import Experiment
from cxlssd.firmware.profile import load_profile
from cxlssd.platform.config import load_config

if TYPE_CHECKING:  # the figures module imports matplotlib (0.7 s): only when a report is written
    from cxlssd.experiments.figures import Drawn

CSV_FIELDS = (
    "case", "workload", "kind", "design", "runs", "modelled_ms", "modelled_ms_stdev", "modelled_ms_min",
    "modelled_ms_max", "speedup", "speedup_stdev", "fraction_of_ideal", "fraction_of_ideal_stdev",
    "flash_reads", "flash_programs", "flash_traffic_reduction", "local_ms", "device_stall_ms",
    "instructions", "device_requests", "long_delays", "switches", "hidden_ms", "residual_wait_ms",
    "check_ok", "exit_status",
)
REPORT_EVENT_CHARS = 300  # of a trace event in report.md (results.json has it whole)
REPORT_LOG_LINES = 12  # kernel-log lines of a QMP scenario shown in report.md (all are in results.json)


def _geomean(values: list[float]) -> float | None:
    good = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in good) / len(good)) if good else None


def _mean(values: list[Any]) -> float | int | None:
    """Mean of the values that are there (None: none are); whole means stay ints."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    mean = statistics.fmean(present)
    return int(mean) if mean.is_integer() else mean


def _switch_total(run: dict[str, Any], *keys: str) -> int | None:
    """The sum of ``keys`` of a row's guest switching counters (None: a row without
    them, e.g. a synthetic replay, whose switches the replay driver's thread model makes)."""
    switching = run.get("switching")
    return sum(switching.get(key, 0) for key in keys) if switching else None


def _ms(ns: float | None) -> float | None:
    return None if ns is None else ns / 1e6


def _ratio(num: dict[str, Any], den: dict[str, Any]) -> tuple[float | None, float | None]:
    """num's mean time over den's, and its spread propagated to first order from the
    two standard deviations (None when neither was repeated)."""
    if not num.get("mean_ns") or not den.get("mean_ns"):
        return None, None
    value = num["mean_ns"] / den["mean_ns"]
    if num is den or (num["stdev_ns"] is None and den["stdev_ns"] is None):
        return value, None  # a design against itself is exactly 1
    relative = math.hypot((num["stdev_ns"] or 0) / num["mean_ns"], (den["stdev_ns"] or 0) / den["mean_ns"])
    return value, value * relative


def _aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One (case, design) over its repetitions: modelled time statistics and mean counters."""
    times = [r["modelled_ns"] for r in runs if r["modelled_ns"]]
    return {
        "runs": len(runs),
        "mean_ns": statistics.fmean(times) if times else None,
        "stdev_ns": statistics.stdev(times) if len(times) > 1 else None,
        "min_ns": min(times) if times else None,
        "max_ns": max(times) if times else None,
        "flash": sum(r["flash"]["reads"] + r["flash"]["programs"] for r in runs) / len(runs),
    }


def derive(experiment: Experiment, rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Table rows in experiment order, one per case and design (repetitions
    aggregated: mean, sample standard deviation, min, max of the modelled time),
    with speedup, fraction of ideal and flash reduction computed from the means."""
    by_case: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for point in experiment.points():
        if point.key in rows:
            by_case.setdefault(point.case, {}).setdefault(point.design, []).append(rows[point.key])
    table = []
    for case, designs in by_case.items():
        stats = {design: _aggregate(runs) for design, runs in designs.items()}
        base = stats.get(experiment.baseline, {})
        ideal = stats.get(experiment.ideal or "", {})
        for design, runs in designs.items():
            mine = stats[design]
            speedup, speedup_stdev = _ratio(base, mine)
            fraction, fraction_stdev = _ratio(ideal, mine)
            table.append({
                "case": case,
                "workload": runs[0]["workload"],
                "kind": runs[0].get("kind", "live"),
                "design": design,
                "runs": mine["runs"],
                "modelled_ms": _ms(mine["mean_ns"]),
                "modelled_ms_stdev": _ms(mine["stdev_ns"]),
                "modelled_ms_min": _ms(mine["min_ns"]),
                "modelled_ms_max": _ms(mine["max_ns"]),
                "speedup": speedup,
                "speedup_stdev": speedup_stdev,
                "fraction_of_ideal": fraction,
                "fraction_of_ideal_stdev": fraction_stdev,
                "flash_reads": _mean([r["flash"]["reads"] for r in runs]),
                "flash_programs": _mean([r["flash"]["programs"] for r in runs]),
                "flash_traffic_reduction": base["flash"] / mine["flash"]
                if mine["flash"] and base.get("flash") else None,
                "local_ms": _ms(_mean([r["local_ns"] for r in runs])),
                "device_stall_ms": _ms(_mean([r["device_stall_ns"] for r in runs])),
                "instructions": _mean([r["instructions"] for r in runs]),
                "device_requests": _mean([r["device"]["requests"] for r in runs]),
                "long_delays": _mean([r["device"]["long_delays"] for r in runs]),
                # the guest's switches (its runtime's and its kernel helper's) and the flash
                # latency they hid or left to wait (None: rows without the guest's counters)
                "switches": _mean([_switch_total(r, "switches", "kernel_switches") for r in runs]),
                "hidden_ms": _ms(_mean([_switch_total(r, "hidden_ns") for r in runs])),
                "residual_wait_ms": _ms(_mean([_switch_total(r, "residual_wait_ns") for r in runs])),
                "check_ok": all(r["check_ok"] for r in runs),
                "exit_status": next((r["exit_status"] for r in runs if r["exit_status"]), 0),
            })
    return table


def summary(experiment: Experiment, table: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per design over the cases: geometric means of speedup and fraction of ideal;
    flash reduction as the baseline's flash operations over the design's, both summed
    over the cases both ran. (A geometric mean of per-case reductions would drop the
    cases a design takes off flash entirely and be ruled by those it leaves one
    operation in.)"""
    baseline = {r["case"]: _flash_ops(r) for r in table if r["design"] == experiment.baseline}
    out = {}
    for design in experiment.designs:
        mine = [r for r in table if r["design"] == design]
        base_ops = sum(baseline[r["case"]] for r in mine if r["case"] in baseline)
        my_ops = sum(_flash_ops(r) for r in mine if r["case"] in baseline)
        out[design] = {
            "speedup": _geomean([r["speedup"] for r in mine]),
            "fraction_of_ideal": _geomean([r["fraction_of_ideal"] for r in mine]),
            "flash_traffic_reduction": base_ops / my_ops if base_ops and my_ops else None,
        }
    return out


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def _with_spread(value: Any, spread: Any, spec: str) -> str:
    """``mean ± spread`` (just the mean when the point was not repeated)."""
    return _fmt(value, spec) if spread is None else f"{_fmt(value, spec)} ± {_fmt(spread, spec)}"


def _flash_ops(row: dict[str, Any]) -> float:
    return float(row["flash_reads"] + row["flash_programs"])


def table_lines(experiment: Experiment, table: list[dict[str, Any]]) -> list[str]:
    """The results as a fixed-width text table (the CLI prints it); repeated points
    show the mean ± the standard deviation of their runs."""
    width = min(48, max([len("geomean"), *(len(r["case"]) for r in table)]))
    lines = [f"{'case':<{width}} {'design':<14} {'runs':>4} {'modelled ms':>20} {'speedup':>12} "
             f"{'of ideal':>9} {'flash ops':>10} {'check':>6}"]
    for r in table:
        lines.append(
            f"{r['case'][:width]:<{width}} {r['design']:<14} {r['runs']:>4} "
            f"{_with_spread(r['modelled_ms'], r['modelled_ms_stdev'], '.3f'):>20} "
            f"{_with_spread(r['speedup'], r['speedup_stdev'], '.2f'):>12} "
            f"{_fmt(r['fraction_of_ideal'], '.1%'):>9} {_flash_ops(r):>10,.0f} "
            f"{'ok' if r['check_ok'] else 'FAIL':>6}"
        )
    for design, means in summary(experiment, table).items():
        lines.append(f"{'geomean':<{width}} {design:<14} {'':>4} {'':>20} "
                     f"{_fmt(means['speedup'], '.2f'):>12} {_fmt(means['fraction_of_ideal'], '.1%'):>9}")
    return lines


def _versions() -> dict[str, str]:
    from cxlssd.guest.runtime.build import runtime_key
    from cxlssd.platform.plugin.build import source_hash
    from cxlssd.platform.qemu import check_qemu

    try:
        qemu = check_qemu().version_text.splitlines()[0]
    except PrerequisiteError:
        qemu = "not installed (replay points need none)"
    version = f"{cxlssd.__version__} (installed)"
    if cxlssd.CHECKOUT_ROOT is not None:
        git = subprocess.run(["git", "-C", str(cxlssd.CHECKOUT_ROOT), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, check=False)
        version = git.stdout.strip() or "unknown"
    return {
        "cxlssd": version,
        "qemu": qemu,
        "plugin": source_hash(),
        "guest_runtime": runtime_key(),
    }


def _spread_lines(table: list[dict[str, Any]]) -> list[str]:
    """What ± means, and the largest spread of the repeated points."""
    repeated = [r for r in table if r["modelled_ms_stdev"] is not None and r["modelled_ms"]]
    if not repeated:
        return []
    widest = max(repeated, key=lambda r: r["modelled_ms_stdev"] / r["modelled_ms"])
    runs = sorted({r["runs"] for r in repeated})
    return [
        "",
        f"Repeated live points ({'/'.join(str(n) for n in runs)} runs each, column *runs*): modelled ms is "
        "the mean ± the sample standard deviation over the runs (min and max in results.csv); speedup and "
        "fraction of ideal are of the means, their ± propagated to first order from both designs' "
        f"deviations. Largest spread: `{widest['case']}` under `{widest['design']}`, "
        f"{widest['modelled_ms_stdev'] / widest['modelled_ms']:.2%} of the mean "
        f"({widest['modelled_ms_min']:.3f} to {widest['modelled_ms_max']:.3f} ms).",
    ]


def _trace_lines(rows: list[dict[str, Any]]) -> list[str]:
    traces = {r["workload"]: r["trace"] for r in rows if r.get("kind") == "replay"}
    if not traces:
        return []
    lines = ["", "## Replayed traces (no guest; the replay driver, firmware/replay.py)", ""]
    for name, trace in traces.items():
        made = trace["metadata"]
        how = (", ".join(f"{k} {v}" for k, v in made.items() if k != "generator")
               if made.get("generator") else "recorded")
        lines.append(f"- `{name}`: `{trace['path']}`, {trace['records']:,} records ({how})")
    lines += ["", "A trace without ROI markers (a synthetic one) is timed by its last request's modelled "
              "end; one with markers (recorded live) by its ROIs, as live."]
    return lines


def _injection_lines(rows: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The report's injection sections, and the QMP injections that were refused or
    that the guest never showed."""
    lines: list[str] = []
    problems: list[str] = []
    knobbed = [r for r in rows if r.get("knobs")]
    if knobbed:
        lines += ["", "## Injections (firmware knobs; modelled times in ns)", ""]
        for row in knobbed:
            knobs = "; ".join(json.dumps(k, sort_keys=True) for k in row["knobs"])
            lines.append(f"- `{row['key']}`: {knobs}")
    scenarios = [r for r in rows if r.get("qmp")]
    if scenarios:
        lines += ["", "## QMP injections and what the guest showed", "",
                  "Sent at wall-clock offsets from the workload's start (QEMU's events are not on the "
                  "modelled clock); *seen* is the guest's trace event for it (poison: from the poison list "
                  "read after the workload).", ""]
    for row in scenarios:
        lines.append(f"- `{row['key']}`:")
        for entry in row["qmp"]["injections"]:
            if not entry["sent"]:
                outcome = f"NOT SENT: {entry['reason']}"
            elif entry["observed"] is None:
                outcome = f"sent at {entry['sent_s']:.1f} s; NOT SEEN in the guest"
            else:
                event = entry["observed"][entry["observed"].find("cxl_"):]  # without the task and time
                outcome = f"sent at {entry['sent_s']:.1f} s; seen: `{event[:REPORT_EVENT_CHARS]}`"
            lines.append(f"  - {entry['kind']} {entry['when']}: {outcome}")
            if not entry["sent"] or entry["observed"] is None:
                problems.append(f"{row['key']}: {entry['kind']} {entry['when']}")
        kernel_log = row["qmp"]["kernel_log"]
        if kernel_log:
            shown = f", the last {REPORT_LOG_LINES}" if len(kernel_log) > REPORT_LOG_LINES else ""
            lines.append(f"  - guest kernel log during the point ({len(kernel_log)} lines{shown}):")
            lines += [f"    - `{line}`" for line in kernel_log[-REPORT_LOG_LINES:]]
    return lines, problems


def _figure_lines(drawn: list[Drawn]) -> list[str]:
    """The figures embedded in report.md in their (story) order, each with its caption
    and links to its vector versions."""
    if not drawn:
        return []
    lines = ["", "## Figures", ""]
    for number, figure in enumerate(drawn, 1):
        png, *vector = figure.files
        links = ", ".join(f"[{path.suffix[1:].upper()}]({path.name})" for path in vector)
        lines += [f"![{figure.caption}]({png.name})", "",
                  f"*Figure {number}.* {figure.caption} ({links})", ""]
    return lines[:-1]


def _design_param_lines(experiment: Experiment) -> list[str]:
    """What the commands differ in between designs of one case (``design_params``)."""
    if not experiment.design_params:
        return []
    per_design = "; ".join(f"`{d}` {_assignments(v)}" for d, v in experiment.design_params.items())
    return [f"Commands per design: {per_design}; otherwise {_assignments(experiment.params)}."]


def _assignments(values: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def write_results(experiment: Experiment, rows: dict[str, dict[str, Any]], out_dir: Path) -> dict[str, Any]:
    """Write results.csv, results.json, report.md and the figures; returns the table,
    the figures (``figures``, each with its files; ``plots``: every file), the points
    not run yet, the failed self-checks and the injection problems."""
    from cxlssd.experiments.figures import write_figures

    table = derive(experiment, rows)
    means = summary(experiment, table)
    with open(out_dir / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(table)
    overrides = [f"{k}={v}" for k, v in experiment.overrides.items()]
    ordered = [rows[p.key] for p in experiment.points() if p.key in rows]
    full = {
        "experiment": experiment.model_dump(mode="json", by_alias=True),
        "platform_config": load_config(experiment.platform).model_dump(mode="json"),
        "profiles": {d: load_profile(d, overrides).tree for d in experiment.designs},
        "versions": _versions(),
        "table": table,
        "summary": means,
        "points": ordered,
    }
    text = json.dumps(full, indent=1, sort_keys=True, default=str)
    (out_dir / "results.json").write_text(text + "\n")
    drawn = write_figures(experiment, table, means, out_dir) if table else []
    missing = [p.key for p in experiment.points() if p.key not in rows]
    failed = [r["key"] for r in ordered if not r["check_ok"]]
    repeated = any(r["runs"] > 1 for r in table)
    ideal = f"fraction of ideal is against `{experiment.ideal}`;" if experiment.ideal else "no ideal design;"
    runs_head, runs_rule = (" runs |", " ---: |") if repeated else ("", "")
    lines = [
        f"# Experiment {experiment.name}",
        "",
        f"Definition: `{experiment.source}`; platform `{experiment.platform.name}`; all times are "
        "**modelled** (docs/live.md), never emulator wall-clock.",
        f"Speedup is over `{experiment.baseline}`; {ideal} flash traffic reduction is the baseline's "
        "flash operations over the design's (over the cases: their sums).",
        *_design_param_lines(experiment),
        "",
        "## Over the cases",
        "",
        "Geometric means of speedup and fraction of ideal; flash reduction of the summed operations.",
        "",
        "| design | speedup | of ideal | flash reduction |",
        "| --- | ---: | ---: | ---: |",
    ]
    for design, mean in means.items():
        cells = (_fmt(mean["speedup"], ".2f"), _fmt(mean["fraction_of_ideal"], ".1%"),
                 _fmt(mean["flash_traffic_reduction"], ".2f"))
        lines.append(f"| {design} | {' | '.join(cells)} |")
    lines += _figure_lines(drawn)
    lines += [
        "",
        "## Per case and design",
        "",
        f"| case | design |{runs_head} modelled ms | speedup | of ideal | flash reads | flash programs "
        "| flash reduction | self-check |",
        f"| --- | --- |{runs_rule} ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in table:
        runs = f" {r['runs']} |" if repeated else ""
        lines.append(
            f"| {r['case']} | {r['design']} |{runs} "
            f"{_with_spread(r['modelled_ms'], r['modelled_ms_stdev'], '.3f')} | "
            f"{_with_spread(r['speedup'], r['speedup_stdev'], '.2f')} | "
            f"{_with_spread(r['fraction_of_ideal'], r['fraction_of_ideal_stdev'], '.1%')} | "
            f"{_fmt(r['flash_reads'], ',.0f')} | {_fmt(r['flash_programs'], ',.0f')} | "
            f"{_fmt(r['flash_traffic_reduction'], '.2f')} | {'ok' if r['check_ok'] else 'FAILED'} |"
        )
    lines += _spread_lines(table)
    lines += _trace_lines(ordered)
    injection_lines, injection_problems = _injection_lines(ordered)
    lines += injection_lines
    if experiment.notes:
        lines += ["", "## Notes", "", experiment.notes.strip()]
    if missing:
        lines += ["", f"Not run yet ({len(missing)}): " + ", ".join(missing)]
    if failed:
        lines += ["", "Self-check FAILED (the data is wrong, whatever the timing): " + ", ".join(failed)]
    if injection_problems:
        lines += ["", "QMP injections not sent or not seen in the guest: " + ", ".join(injection_problems)]
    (out_dir / "report.md").write_text("\n".join([*lines, ""]))
    return {"table": table, "figures": drawn, "plots": [path for figure in drawn for path in figure.files],
            "missing": missing, "failed": failed, "injection_problems": injection_problems}

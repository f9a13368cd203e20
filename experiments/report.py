"""An experiment's results: CSV, JSON (with everything needed to reproduce it),
a Markdown report and plots (PNG and SVG), all in modelled time.

Per case (a workload point) and design: modelled time, speedup over the
baseline design, fraction of the ideal design (DRAM-only), flash traffic and
its reduction against the baseline; geometric means over the cases.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cxlssd.experiments.spec import Experiment
from cxlssd.firmware.profile import load_profile
from cxlssd.platform.config import load_config

PLOT_FORMATS = ("png", "svg")
CSV_FIELDS = (
    "case", "workload", "design", "modelled_ms", "speedup", "fraction_of_ideal", "flash_reads",
    "flash_programs", "flash_traffic_reduction", "local_ms", "device_stall_ms", "instructions",
    "device_requests", "long_delays", "check_ok", "exit_status",
)


def _geomean(values: list[float]) -> float | None:
    good = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in good) / len(good)) if good else None


def derive(experiment: Experiment, rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Table rows in experiment order, with speedup, fraction of ideal and flash reduction."""
    by_case: dict[str, dict[str, dict[str, Any]]] = {}
    for point in experiment.points():
        if point.key in rows:
            by_case.setdefault(point.case, {})[point.design] = rows[point.key]
    table = []
    for case, designs in by_case.items():
        base = designs.get(experiment.baseline, {})
        ideal = designs.get(experiment.ideal or "", {})
        for design, row in designs.items():
            ns = row["modelled_ns"]
            flash_ops = row["flash"]["reads"] + row["flash"]["programs"]
            base_flash = base["flash"]["reads"] + base["flash"]["programs"] if base else 0
            table.append({
                "case": case,
                "workload": row["workload"],
                "design": design,
                "modelled_ms": ns / 1e6 if ns else None,
                "speedup": base["modelled_ns"] / ns if ns and base.get("modelled_ns") else None,
                "fraction_of_ideal": ideal["modelled_ns"] / ns if ns and ideal.get("modelled_ns") else None,
                "flash_reads": row["flash"]["reads"],
                "flash_programs": row["flash"]["programs"],
                "flash_traffic_reduction": base_flash / flash_ops if flash_ops and base_flash else None,
                "local_ms": row["local_ns"] / 1e6,
                "device_stall_ms": row["device_stall_ns"] / 1e6,
                "instructions": row["instructions"],
                "device_requests": row["device"]["requests"],
                "long_delays": row["device"]["long_delays"],
                "check_ok": row["check_ok"],
                "exit_status": row["exit_status"],
            })
    return table


def summary(experiment: Experiment, table: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Geometric means per design over the cases."""
    out = {}
    for design in experiment.designs:
        mine = [r for r in table if r["design"] == design]
        out[design] = {
            "speedup": _geomean([r["speedup"] for r in mine]),
            "fraction_of_ideal": _geomean([r["fraction_of_ideal"] for r in mine]),
            "flash_traffic_reduction": _geomean([r["flash_traffic_reduction"] for r in mine]),
        }
    return out


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "—" if value is None else format(value, spec)


def table_lines(experiment: Experiment, table: list[dict[str, Any]]) -> list[str]:
    """The results as a fixed-width text table (the CLI prints it)."""
    lines = [f"{'case':<30} {'design':<14} {'modelled ms':>12} {'speedup':>8} {'of ideal':>9} "
             f"{'flash ops':>10} {'check':>6}"]
    for r in table:
        lines.append(
            f"{r['case'][:30]:<30} {r['design']:<14} {_fmt(r['modelled_ms']):>12} "
            f"{_fmt(r['speedup'], '.2f'):>8} "
            f"{_fmt(r['fraction_of_ideal'], '.1%'):>9} {r['flash_reads'] + r['flash_programs']:>10,} "
            f"{'ok' if r['check_ok'] else 'FAIL':>6}"
        )
    for design, means in summary(experiment, table).items():
        lines.append(f"{'geomean':<30} {design:<14} {'':>12} {_fmt(means['speedup'], '.2f'):>8} "
                     f"{_fmt(means['fraction_of_ideal'], '.1%'):>9}")
    return lines


def _versions() -> dict[str, str]:
    from cxlssd.guest.runtime.build import runtime_key
    from cxlssd.platform.plugin.build import source_hash
    from cxlssd.platform.qemu import check_qemu

    repo = Path(__file__).resolve().parents[1]
    git = subprocess.run(["git", "-C", str(repo), "describe", "--always", "--dirty"], capture_output=True,
                         text=True, check=False)
    return {
        "cxlssd": git.stdout.strip() or "unknown",
        "qemu": check_qemu().version_text.splitlines()[0],
        "plugin": source_hash(),
        "guest_runtime": runtime_key(),
    }


def _plot(experiment: Experiment, table: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r["case"] for r in table))
    designs = list(experiment.designs)
    cell = {(r["case"], r["design"]): r for r in table}
    width = 0.8 / len(designs)
    written = []
    # Speedups and flash traffic span orders of magnitude: log scales (symlog keeps 0).
    charts = [
        ("speedup", f"speedup over {experiment.baseline} (modelled time)", "speedup", "log"),
        ("fraction_of_ideal", f"fraction of {experiment.ideal} performance", "fraction_of_ideal", "linear"),
        ("flash_ops", "flash operations (reads + programs)", None, "symlog"),
    ]
    for stem, title, field_name, scale in charts:
        if field_name == "fraction_of_ideal" and experiment.ideal is None:
            continue
        fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(cases) * len(designs) / 2), 4.0))
        for i, design in enumerate(designs):
            values = []
            for case in cases:
                row = cell.get((case, design))
                if row is None:
                    values.append(0.0)
                elif field_name is None:
                    values.append(float(row["flash_reads"] + row["flash_programs"]))
                else:
                    values.append(float(row[field_name] or 0.0))
            ax.bar([c + i * width for c in range(len(cases))], values, width, label=design)
        ax.set_xticks([c + width * (len(designs) - 1) / 2 for c in range(len(cases))], cases, rotation=20,
                      ha="right", fontsize=8)
        ax.set_yscale(scale)
        ax.set_title(f"{experiment.name}: {title}")
        ax.legend(fontsize=8)
        fig.tight_layout()
        for fmt in PLOT_FORMATS:
            path = out_dir / f"{stem}.{fmt}"
            fig.savefig(path)
            written.append(path)
        plt.close(fig)
    return written


def write_results(experiment: Experiment, rows: dict[str, dict[str, Any]], out_dir: Path) -> dict[str, Any]:
    """Write results.csv, results.json, report.md and the plots; returns what was written."""
    table = derive(experiment, rows)
    with open(out_dir / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(table)
    overrides = [f"{k}={v}" for k, v in experiment.overrides.items()]
    full = {
        "experiment": {**asdict(experiment), "platform": str(experiment.platform)},
        "platform_config": asdict(load_config(experiment.platform)),
        "profiles": {d: load_profile(d, overrides).tree for d in experiment.designs},
        "versions": _versions(),
        "table": table,
        "summary": summary(experiment, table),
        "points": [rows[p.key] for p in experiment.points() if p.key in rows],
    }
    (out_dir / "results.json").write_text(json.dumps(full, indent=1, sort_keys=True, default=str) + "\n")
    plots = _plot(experiment, table, out_dir) if table else []
    missing = [p.key for p in experiment.points() if p.key not in rows]
    failed = [r["case"] + "@" + r["design"] for r in table if not r["check_ok"]]
    lines = [
        f"# Experiment {experiment.name}",
        "",
        f"Definition: `{experiment.source}`; platform `{experiment.platform.name}`; all times are "
        "**modelled** (docs/live.md), never emulator wall-clock.",
        f"Speedup is over `{experiment.baseline}`; fraction of ideal is against `{experiment.ideal}`; "
        "flash traffic reduction is the baseline's flash operations over the design's.",
        "",
        "| case | design | modelled ms | speedup | of ideal | flash reads | flash programs | flash reduction "
        "| self-check |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in table:
        lines.append(
            f"| {r['case']} | {r['design']} | {_fmt(r['modelled_ms'])} | {_fmt(r['speedup'], '.2f')} | "
            f"{_fmt(r['fraction_of_ideal'], '.1%')} | {r['flash_reads']} | {r['flash_programs']} | "
            f"{_fmt(r['flash_traffic_reduction'], '.2f')} | {'ok' if r['check_ok'] else 'FAILED'} |"
        )
    lines += ["", "Geometric means over the cases:", "", "| design | speedup | of ideal | flash reduction |",
              "| --- | ---: | ---: | ---: |"]
    for design, means in summary(experiment, table).items():
        reduction = _fmt(means["flash_traffic_reduction"], ".2f")
        lines.append(f"| {design} | {_fmt(means['speedup'], '.2f')} | "
                     f"{_fmt(means['fraction_of_ideal'], '.1%')} | {reduction} |")
    injected = [(key, row["knobs"]) for key, row in rows.items() if row.get("knobs")]
    if injected:
        lines += ["", "## Injections (firmware knobs; modelled times in ns)", ""]
        for key, knobs in injected:
            lines.append(f"- `{key}`: " + "; ".join(json.dumps(k, sort_keys=True) for k in knobs))
    if experiment.notes:
        lines += ["", "## Notes", "", experiment.notes.strip()]
    if missing:
        lines += ["", f"Not run yet ({len(missing)}): " + ", ".join(missing)]
    if failed:
        lines += ["", "Self-check FAILED (the data is wrong, whatever the timing): " + ", ".join(failed)]
    lines += ["", "Plots: " + ", ".join(f"[{p.name}]({p.name})" for p in plots if p.suffix == ".png"), ""]
    (out_dir / "report.md").write_text("\n".join(lines))
    return {"table": table, "plots": plots, "missing": missing, "failed": failed}

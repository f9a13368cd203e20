"""Run an experiment on one booted platform, resumable, and write its results.

``./cxlssd run EXPERIMENT.yaml --out DIR`` boots the experiment's platform once
and runs every point (a workload case under one design, firmware attached
live) in turn. Each finished point is appended to ``DIR/points.jsonl`` at once,
so an interrupted run resumes where it stopped (points already there are not
run again). At the end (and after a resume) the whole set is written out by
:mod:`.report`: ``results.csv``, ``results.json`` (with the experiment, the
platform config, every design's resolved profile and the versions), ``report.md``
and the plots.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cxlssd.errors import InputError
from cxlssd.experiments.spec import Experiment, Point
from cxlssd.platform.config import load_config
from cxlssd.platform.inject import send_knob
from cxlssd.platform.machine import Platform

log = logging.getLogger(__name__)

POINTS_FILE = "points.jsonl"
OUTPUT_TAIL_CHARS = 2000


def _workload_report(stdout: bytes) -> dict[str, Any]:
    """The last JSON object the workload printed (its self-report), or {}."""
    for line in reversed(stdout.decode(errors="replace").strip().splitlines()):
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except ValueError:
                continue
            if isinstance(found, dict):
                return found
    return {}


def point_row(
    point: Point, status: int, stdout: bytes, stderr: bytes, results: dict[str, Any]
) -> dict[str, Any]:
    """One results row: the point, its modelled time (sum over its ROIs) and counters."""
    rois = results.get("rois", [])
    report = _workload_report(stdout)
    flash = {"reads": 0, "programs": 0, "erases": 0}
    device = {"requests": 0, "reads": 0, "writes": 0, "long_delays": 0}
    for roi in rois:
        model, fl = roi["device"]["model"], roi["device"].get("flash", {})
        for key in device:
            device[key] += model[key]
        flash["reads"] += fl.get("reads_total", 0)
        flash["programs"] += fl.get("programs_total", 0)
        flash["erases"] += fl.get("erases_gc", 0)
    check_ok = status == 0 and report.get("check_ok", True) is True and bool(rois)
    return {
        "key": point.key,
        "case": point.case,
        "workload": point.workload,
        "design": point.design,
        "params": point.params,
        "command": list(point.command),
        "exit_status": status,
        "check_ok": check_ok,
        "rois": len(rois),
        "modelled_ns": sum(r["modelled_ns"] for r in rois) if rois else None,
        "local_ns": sum(r["local_ns"] for r in rois),
        "device_stall_ns": sum(r["device_stall_ns"] for r in rois),
        "instructions": sum(r.get("cpu", {}).get("insns", 0) for r in rois),
        "device": device,
        "flash": flash,
        "workload_report": report,
        "stderr_tail": stderr.decode(errors="replace")[-OUTPUT_TAIL_CHARS:] if status else "",
    }


def load_points(out_dir: Path) -> dict[str, dict[str, Any]]:
    """The rows already in ``DIR/points.jsonl`` by point key (the last one wins)."""
    path = out_dir / POINTS_FILE
    rows: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return rows
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rows[row["key"]] = row
        except (ValueError, KeyError, TypeError):
            raise InputError(
                f"{path}:{number} is not a results row; it was not written by this runner "
                f"(move it away to start afresh)"
            ) from None
    return rows


class ExperimentRunner:
    """Runs the points of ``experiment`` not yet in ``out_dir``; ``platform`` may be
    an already running platform of the experiment's config (tests share one)."""

    def __init__(self, experiment: Experiment, out_dir: Path, platform: Platform | None = None) -> None:
        self.experiment = experiment
        self.out_dir = out_dir
        self.platform = platform

    def pending(self) -> list[Point]:
        done = load_points(self.out_dir)
        return [p for p in self.experiment.points() if p.key not in done]

    def run(self) -> dict[str, dict[str, Any]]:
        """Run what is pending; returns every row of the experiment so far, by key."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        pending = self.pending()
        total = len(self.experiment.points())
        if pending:
            log.info("%s: %d of %d points to run (%d done before)", self.experiment.name, len(pending), total,
                     total - len(pending))
            with self._platform() as platform:
                self._run_points(platform, pending, total)
        else:
            log.info("%s: all %d points already done in %s", self.experiment.name, total, self.out_dir)
        return load_points(self.out_dir)

    @contextmanager
    def _platform(self) -> Iterator[Platform]:
        if self.platform is not None:
            yield self.platform
            return
        with Platform(load_config(self.experiment.platform)) as platform:
            yield platform

    def _run_points(self, platform: Platform, pending: list[Point], total: int) -> None:
        started = time.monotonic()
        overrides = [f"{k}={v}" for k, v in self.experiment.overrides.items()]
        with open(self.out_dir / POINTS_FILE, "a") as points_file:
            for n, point in enumerate(pending, 1):
                began = time.monotonic()
                with platform.attach(point.design, overrides) as session:
                    for at_ms, knob in point.inject:
                        send_knob(platform, knob, at_ms)
                    status, out, err = session.run(point.command)
                row = point_row(point, status, out, err, session.results)
                row["knobs"] = session.results.get("knobs", [])
                row["wall_s"] = time.monotonic() - began  # emulation time, for the ETA only
                points_file.write(json.dumps(row, sort_keys=True) + "\n")
                points_file.flush()
                elapsed = time.monotonic() - started
                eta_s = elapsed / n * (len(pending) - n)
                modelled = f"{row['modelled_ns'] / 1e6:.3f} ms modelled" if row["modelled_ns"] else "no ROI"
                log.info("[%d/%d] %s: %s%s (%.0f s of emulation; ETA %.0f min)",
                         total - len(pending) + n, total, point.key, modelled,
                         "" if row["check_ok"] else ", CHECK FAILED", row["wall_s"], eta_s / 60)

"""Run an experiment, resumable, and keep every finished point.

``./cxlssd run EXPERIMENT.yaml --out DIR`` runs every point not yet in
``DIR/points.jsonl``: replay points first (a trace under one design with the
replay driver, no guest; synthetic traces are written into ``DIR/traces/``),
then live points on one booted platform (a workload case under one design,
firmware attached live, with its scenario's firmware knobs and QMP
injections). Each finished point is appended to ``DIR/points.jsonl`` at once,
so an interrupted run resumes where it stopped. At the end (and after a
resume) the whole set is written out by :mod:`.report`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from cxlssd.errors import ConfigError, InputError
from cxlssd.experiments.scenario import QmpScenario
from cxlssd.experiments.spec import Experiment, Point, TraceSource
from cxlssd.firmware.profile import load_profile
from cxlssd.firmware.replay import replay_file
from cxlssd.firmware.synth import generate
from cxlssd.firmware.trace import TraceReader, TraceWriter
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


def roi_totals(rois: list[dict[str, Any]]) -> dict[str, Any]:
    """A point's modelled time (the sum of its ROIs), its parts and counters."""
    flash = {"reads": 0, "programs": 0, "erases": 0}
    device = {"requests": 0, "reads": 0, "writes": 0, "long_delays": 0}
    for roi in rois:
        model, fl = roi["device"]["model"], roi["device"].get("flash", {})
        for key in device:
            device[key] += model[key]
        flash["reads"] += fl.get("reads_total", 0)
        flash["programs"] += fl.get("programs_total", 0)
        flash["erases"] += fl.get("erases_gc", 0)
    return {
        "rois": len(rois),
        "modelled_ns": sum(r["modelled_ns"] for r in rois) if rois else None,
        "local_ns": sum(r["local_ns"] for r in rois),
        "device_stall_ns": sum(r["device_stall_ns"] for r in rois),
        "instructions": sum(r.get("cpu", {}).get("insns", 0) for r in rois),
        "device": device,
        "flash": flash,
    }


def _point_fields(point: Point) -> dict[str, Any]:
    return {
        "key": point.key,
        "case": point.case,
        "workload": point.workload,
        "design": point.design,
        "params": point.params,
        "rep": point.rep,
        "overrides": list(point.overrides),
    }


def point_row(
    point: Point, status: int, stdout: bytes, stderr: bytes, results: dict[str, Any]
) -> dict[str, Any]:
    """One live results row: the point, its modelled time (sum over its ROIs) and counters."""
    rois = results.get("rois", [])
    report = _workload_report(stdout)
    return {
        **_point_fields(point),
        "kind": "live",
        "command": list(point.command),
        "exit_status": status,
        "check_ok": status == 0 and report.get("check_ok", True) is True and bool(rois),
        **roi_totals(rois),
        "workload_report": report,
        "stderr_tail": stderr.decode(errors="replace")[-OUTPUT_TAIL_CHARS:] if status else "",
    }


def replay_row(point: Point, trace: Path, overrides: list[str]) -> dict[str, Any]:
    """One replay results row. A trace with ROI markers (a recorded live run) gives its
    ROIs' modelled time, like the live point; one without (synthetic) the modelled
    end of its last request, with no local part (a replay has no CPU counters)."""
    result = replay_file(trace, load_profile(point.design, overrides))
    rois = result["rois"]
    if rois:
        totals = roi_totals(rois)
        totals["instructions"] = None  # the plugin's counters are live-only
    else:
        model, flash = result["counters"]["model"], result["counters"].get("flash", {})
        totals = {
            "rois": 0,
            "modelled_ns": result["stalls"]["modelled_end_ns"] or None,
            "local_ns": None,
            "device_stall_ns": result["stalls"]["stall_ns_total"],
            "instructions": None,
            "device": {key: model[key] for key in ("requests", "reads", "writes", "long_delays")},
            "flash": {"reads": flash.get("reads_total", 0), "programs": flash.get("programs_total", 0),
                      "erases": flash.get("erases_gc", 0)},
        }
    return {
        **_point_fields(point),
        "kind": "replay",
        "command": [],
        "trace": {"path": str(trace), "records": result["trace"]["records"],
                  "metadata": result["trace"]["metadata"]},
        "exit_status": 0,
        # no data to check in a replay: it is right when every ROI it began ended
        "check_ok": not result["unfinished_rois"] and bool(totals["modelled_ns"]),
        **totals,
        "latency_percentiles_ns": result["latency_percentiles_ns"],
        "workload_report": {},
        "stderr_tail": "",
    }


def materialize_trace(source: TraceSource, out_dir: Path) -> Path:
    """The trace file of ``source``: a synthetic one is written into ``out_dir/traces``
    unless a trace of the same spec is already there (a resumed run)."""
    path = source.file(out_dir)
    if source.synth is None:
        return path
    if path.exists():
        try:
            if TraceReader(path).metadata == json.loads(json.dumps(source.synth.metadata())):
                return path
        except InputError:
            pass  # cut short by an interrupted run: written again below
    path.parent.mkdir(parents=True, exist_ok=True)
    log.info("synthesizing trace %s (%d %s requests) into %s", source.name, source.synth.requests,
             source.synth.pattern, path)
    with TraceWriter(path, source.synth.metadata()) as writer:
        for chunk in generate(source.synth):
            writer.write(chunk)
    return path


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
        self._progress = _Progress(0, 0)

    def pending(self) -> list[Point]:
        done = load_points(self.out_dir)
        return [p for p in self.experiment.points() if p.key not in done]

    def run(self) -> dict[str, dict[str, Any]]:
        """Run what is pending; returns every row of the experiment so far, by key."""
        pending = self.pending()
        live = [p for p in pending if p.trace is None]
        if self.platform is not None and any(p.takes_down_cxl for p in live):
            raise ConfigError(
                "an uncorrectable-error injection takes the guest's CXL memory down until it reboots; "
                "the runner reboots the platforms it boots, but not one it was given (its owner would "
                "be left without CXL memory): run this experiment on a platform of its own (./cxlssd run)"
            )
        self.out_dir.mkdir(parents=True, exist_ok=True)
        total = len(self.experiment.points())
        if not pending:
            log.info("%s: all %d points already done in %s", self.experiment.name, total, self.out_dir)
            return load_points(self.out_dir)
        log.info("%s: %d of %d points to run (%d done before)", self.experiment.name, len(pending), total,
                 total - len(pending))
        self._progress = _Progress(total, len(pending))
        with open(self.out_dir / POINTS_FILE, "a") as points_file:
            for point in pending:
                if point.trace is not None:
                    self._record(points_file, point, partial(self._replay, point))
            while live:
                with self._platform() as platform:
                    while live:
                        point = live.pop(0)
                        self._record(points_file, point, partial(self._live, platform, point))
                        if point.takes_down_cxl and live:
                            log.info("%s took the guest's CXL memory down: a fresh guest for the "
                                     "remaining %d points", point.key, len(live))
                            break
        return load_points(self.out_dir)

    @contextmanager
    def _platform(self) -> Iterator[Platform]:
        if self.platform is not None:
            yield self.platform
            return
        with Platform(load_config(self.experiment.platform)) as platform:
            yield platform

    def _replay(self, point: Point) -> dict[str, Any]:
        assert point.trace is not None
        trace = materialize_trace(point.trace, self.out_dir)
        return replay_row(point, trace, self.experiment.profile_overrides(point))

    def _live(self, platform: Platform, point: Point) -> dict[str, Any]:
        scenario = QmpScenario(platform, point.qmp) if point.qmp else None
        if scenario is not None:
            scenario.prepare()  # with the plugin still dormant: faster
        with platform.attach(point.design, self.experiment.profile_overrides(point)) as session:
            for at_ms, knob in point.inject:
                send_knob(platform, knob, at_ms)
            if scenario is None:
                status, out, err = session.run(point.command)
            else:
                with scenario:
                    status, out, err = session.run(point.command)
        row = point_row(point, status, out, err, session.results)
        row["instance"] = platform.name  # which guest ran it (a run may boot more than one)
        row["knobs"] = session.results.get("knobs", [])
        if scenario is not None:
            row["qmp"] = scenario.observations()
        return row

    def _record(self, points_file: TextIO, point: Point, run: Callable[[], dict[str, Any]]) -> None:
        """Run one point, append its row to the points file at once, log the progress."""
        began = time.monotonic()
        row = run()
        row["wall_s"] = time.monotonic() - began  # emulation time, for the ETA only
        points_file.write(json.dumps(row, sort_keys=True) + "\n")
        points_file.flush()
        self._progress.log(point, row)


class _Progress:
    """Progress lines with an ETA from the emulation time of the points so far."""

    def __init__(self, total: int, pending: int) -> None:
        self.total, self.pending, self.ran = total, pending, 0
        self.started = time.monotonic()

    def log(self, point: Point, row: dict[str, Any]) -> None:
        self.ran += 1
        eta_s = (time.monotonic() - self.started) / self.ran * (self.pending - self.ran)
        modelled = f"{row['modelled_ns'] / 1e6:.3f} ms modelled" if row["modelled_ns"] else "no ROI"
        injections = "" if row.get("qmp", {}).get("ok", True) else ", INJECTION NOT SEEN"
        log.info("[%d/%d] %s: %s%s%s (%.1f s of %s; ETA %.0f min)",
                 self.total - self.pending + self.ran, self.total, point.key, modelled,
                 "" if row["check_ok"] else ", CHECK FAILED", injections, row["wall_s"],
                 "replay" if point.trace is not None else "emulation", eta_s / 60)

"""Run an experiment, resumable, and keep every finished point.

``./cxlssd run EXPERIMENT.yaml --out DIR`` runs every point not yet in
``DIR/points.jsonl``: replay points first (a trace under one design with the
replay driver, no guest; synthetic traces are written into ``DIR/traces/``),
then live points on one booted platform (a workload case under one design,
firmware attached live, with its scenario's firmware knobs and QMP
injections). Each finished point is appended to ``DIR/points.jsonl`` at once
(and synced), so an interrupted run resumes where it stopped. At the end (and
after a resume) the whole set is written out by :mod:`.report`.

A row is reused only if it was made from the same inputs: each row carries the
digest of everything that determines it (:func:`point_inputs`); a point whose
inputs changed runs again, and the log says which changed. A torn last line
(the runner killed mid-write) is set aside in ``points.jsonl.torn``. One run at a
time holds ``DIR/.lock``. A live point that outlives ``point_timeout_s`` is
recorded as failed (exit status 124, ``timed_out``) and the run goes on with a
fresh guest.

``--cluster`` runs the same points on a Ray cluster (:mod:`.cluster`): only where the
points run changes (:meth:`ExperimentRunner._execute`); the bookkeeping above is this
module's.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import cxlssd
from cxlssd.errors import ConfigError, GuestTimeout, InputError
from cxlssd.experiments.scenario import QmpScenario
from cxlssd.experiments.spec import Experiment, Point, TraceWorkload
from cxlssd.firmware.profile import load_profile
from cxlssd.firmware.replay import replay_file, with_recorded_device
from cxlssd.firmware.synth import generate
from cxlssd.firmware.trace import TraceReader, TraceWriter
from cxlssd.lifecycle import LockHeld, exclusive_lock
from cxlssd.platform.config import load_config
from cxlssd.platform.inject import send_knob
from cxlssd.platform.machine import Platform

log = logging.getLogger(__name__)

POINTS_FILE = "points.jsonl"
TORN_SUFFIX = ".torn"  # a torn last row is moved to points.jsonl.torn
LOCK_FILE = ".lock"
OUTPUT_TAIL_CHARS = 2000
TIMED_OUT_STATUS = 124  # a point stopped at its timeout (as coreutils' timeout(1) exits)
# Sources that present results without making them: editing them re-runs nothing.
PRESENTATION_ONLY = ("experiments/report.py",)


@functools.cache
def code_digest() -> str:
    """A digest of the code that makes results: every file of the package (its
    firmware, platform, guest runtime and image, runner) except experiment
    definitions and the report writer."""
    files = {}
    for under, root in cxlssd.package_roots():
        for directory, subdirs, names in os.walk(root):
            subdirs[:] = [d for d in subdirs if d != "__pycache__"]
            for name in names:
                path = Path(directory, name)
                files[(under / path.relative_to(root)).as_posix()] = path
    digest = hashlib.sha256()
    for relative, path in sorted(files.items()):
        definition = relative.startswith("experiments/") and relative.endswith(".yaml")
        if relative in PRESENTATION_ONLY or definition:
            continue
        digest.update(relative.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@functools.cache
def file_digest(path: Path) -> str:
    """The SHA-256 of a (trace) file's contents."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()[:16]


def point_inputs(experiment: Experiment, point: Point) -> dict[str, str]:
    """A digest per input that determines ``point``'s row: its command, its design's
    profile after every override, the platform config (live points), the scenario,
    the synthetic trace's spec or the recorded trace's contents, and the code."""
    parts: dict[str, object] = {
        "command": list(point.command),
        "profile": load_profile(point.design, experiment.profile_overrides(point)).tree,
        "scenario": [repr(item) for item in (*point.inject, *point.qmp)],
        "code": code_digest(),
    }
    if point.trace is None:
        config = load_config(experiment.platform).model_dump(exclude={"source"})
        parts["platform"] = config
    elif point.trace.synth is not None:
        parts["trace"] = point.trace.synth.metadata()
    else:
        assert point.trace.path is not None
        parts["trace"] = file_digest(point.trace.path)
    return {
        name: hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]
        for name, value in parts.items()
    }


def changed_inputs(row: dict[str, Any], inputs: dict[str, str]) -> list[str]:
    """Which of ``inputs`` differ from those ``row`` was made from ([] if none)."""
    recorded = row.get("inputs")
    if not isinstance(recorded, dict):
        return ["inputs (the row records none: an older cxlssd made it)"]
    return [name for name in sorted(set(inputs) | set(recorded)) if recorded.get(name) != inputs.get(name)]


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
    """A point's modelled time (the sum of its ROIs), its parts and counters (the
    transfer engine's too: how much of its moves the program waited for; and the
    guest's context switches: how much flash latency they hid)."""
    flash = {"reads": 0, "programs": 0, "erases": 0}
    device = {"requests": 0, "reads": 0, "writes": 0, "long_delays": 0}
    transfers: dict[str, int] = {}
    switching: dict[str, int] = {}
    for roi in rois:
        model, fl = roi["device"]["model"], roi["device"].get("flash", {})
        for key in device:
            device[key] += model[key]
        guest_os = roi["device"].get("os", {})
        for key, value in guest_os.items():
            if key != "parked":  # a gauge: reads parked at the ROI's end, not a count
                switching[key] = switching.get(key, 0) + value
        # Where the guest switches (live, or its recording) the long delays are the ones
        # answered to it; the model counts only those it hides itself (synthetic replays).
        device["long_delays"] += guest_os.get("long_delays", 0)
        flash["reads"] += fl.get("reads_total", 0)
        flash["programs"] += fl.get("programs_total", 0)
        flash["erases"] += fl.get("erases_gc", 0)
        for key, value in roi["device"].get("transfers", {}).items():
            transfers[key] = transfers.get(key, 0) + value
    return {
        "rois": len(rois),
        "modelled_ns": sum(r["modelled_ns"] for r in rois) if rois else None,
        "local_ns": sum(r["local_ns"] for r in rois),
        "device_stall_ns": sum(r["device_stall_ns"] for r in rois),
        "instructions": sum(r.get("cpu", {}).get("insns", 0) for r in rois),
        "device": device,
        "flash": flash,
        "transfers": transfers,
        "switching": switching,
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
    result = replay_file(trace, load_profile(point.design, with_recorded_device(trace, overrides)))
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


def materialize_trace(source: TraceWorkload, out_dir: Path) -> Path:
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
    """The rows already in ``DIR/points.jsonl`` by point key (the last one wins). A
    torn last line (the runner killed while writing it) is skipped with a warning;
    any other line that is not a row is an :class:`InputError`."""
    path = out_dir / POINTS_FILE
    rows: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return rows
    lines = path.read_bytes().split(b"\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            rows[row["key"]] = row
        except (ValueError, KeyError, TypeError):
            if number == len(lines):  # no newline after it: the write was cut short
                log.warning("%s:%d is a torn row (an interrupted write); its point runs again",
                            path, number)
                continue
            raise InputError(
                f"{path}:{number} is not a results row; it was not written by this runner "
                f"(remove or fix that line: the other rows are kept)"
            ) from None
    return rows


def set_aside_torn_row(out_dir: Path) -> None:
    """Move a torn last line of ``DIR/points.jsonl`` (no newline at its end) to
    ``points.jsonl.torn``, so new rows are appended after whole ones only."""
    path = out_dir / POINTS_FILE
    if not path.exists():
        return
    with open(path, "r+b") as points:
        data = points.read()
        if not data or data.endswith(b"\n"):
            return
        start = data.rfind(b"\n") + 1
        with open(path.with_name(POINTS_FILE + TORN_SUFFIX), "ab") as torn:
            torn.write(data[start:] + b"\n")
        points.truncate(start)
        os.fsync(points.fileno())
    log.warning("the last row of %s was torn (an interrupted write); set aside in %s%s",
                path, path.name, TORN_SUFFIX)


@contextmanager
def locked_out_dir(out_dir: Path) -> Iterator[None]:
    """Hold ``DIR/.lock``: two runs never append to one results dir."""
    with contextlib.ExitStack() as stack:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            stack.enter_context(exclusive_lock(out_dir / LOCK_FILE, wait=False))
        except LockHeld as held:
            raise ConfigError(
                f"another run (pid {held.holder}) is writing to {out_dir}; "
                "wait for it or choose another --out"
            ) from None
        except OSError as error:
            raise InputError(f"cannot write to the results directory {out_dir}: {error.strerror}") from None
        yield


def _append_synced(points_file: TextIO, row: dict[str, Any]) -> None:
    """Append ``row`` as one line, on disk before the next point starts."""
    points_file.write(json.dumps(row, sort_keys=True) + "\n")
    points_file.flush()
    os.fsync(points_file.fileno())


class ExperimentRunner:
    """Runs the points of ``experiment`` not yet in ``out_dir``; ``platform`` may be
    an already running platform of the experiment's config (tests share one)."""

    def __init__(self, experiment: Experiment, out_dir: Path, platform: Platform | None = None) -> None:
        self.experiment = experiment
        self.out_dir = out_dir
        self.platform = platform
        self._progress = _Progress(0, 0)

    def pending(self) -> list[Point]:
        """The points without a row made from their current inputs (saying why a
        point that has a row runs again)."""
        done = load_points(self.out_dir)
        todo = []
        for point in self.experiment.points():
            row = done.get(point.key)
            if row is None:
                todo.append(point)
            elif changed := changed_inputs(row, point_inputs(self.experiment, point)):
                log.warning("%s runs again: its %s changed since it ran", point.key, ", ".join(changed))
                todo.append(point)
        return todo

    def run(self) -> dict[str, dict[str, Any]]:
        """Run what is pending; returns every row of the experiment so far, by key."""
        live_points = [p for p in self.experiment.points() if p.trace is None]
        if self.platform is not None and any(p.takes_down_cxl for p in live_points):
            raise ConfigError(
                "an uncorrectable-error injection takes the guest's CXL memory down until it reboots; "
                "the runner reboots the platforms it boots, but not one it was given (its owner would "
                "be left without CXL memory): run this experiment on a platform of its own (./cxlssd run)"
            )
        with locked_out_dir(self.out_dir):
            set_aside_torn_row(self.out_dir)
            return self._run_pending()

    def _run_pending(self) -> dict[str, dict[str, Any]]:
        pending = self.pending()
        total = len(self.experiment.points())
        if not pending:
            log.info("%s: all %d points already done in %s", self.experiment.name, total, self.out_dir)
            return load_points(self.out_dir)
        log.info("%s: %d of %d points to run (%d done before)", self.experiment.name, len(pending), total,
                 total - len(pending))
        self._progress = _Progress(total, len(pending))
        with open(self.out_dir / POINTS_FILE, "a") as points_file:
            self._execute(points_file, pending)
        return load_points(self.out_dir)

    def _execute(self, points_file: TextIO, pending: list[Point]) -> None:
        """Run ``pending`` here, recording each row as it finishes: the replays, then the
        live points on one guest (a fresh one after a point that spoiled it)."""
        live = [p for p in pending if p.trace is None]
        for point in pending:
            if point.trace is not None:
                trace = materialize_trace(point.trace, self.out_dir)
                overrides = self.experiment.profile_overrides(point)
                self._keep(points_file, point, timed(partial(replay_row, point, trace, overrides)))
        while live:
            with self._platform() as platform:
                while live:
                    point = live.pop(0)
                    row = timed(partial(live_row, self.experiment, platform, point))
                    self._keep(points_file, point, row)
                    if not live:
                        break
                    if spoils_guest(point, row) and self.platform is None:
                        log.info("a fresh guest for the remaining %d points", len(live))
                        break

    @contextmanager
    def _platform(self) -> Iterator[Platform]:
        if self.platform is not None:
            yield self.platform
            return
        with Platform(load_config(self.experiment.platform)) as platform:
            yield platform

    def _keep(self, points_file: TextIO, point: Point, row: dict[str, Any]) -> None:
        """Append ``point``'s finished row (with the digests of its inputs) to the points
        file at once and log the progress."""
        row["inputs"] = point_inputs(self.experiment, point)
        _append_synced(points_file, row)
        self._progress.log(point, row)


def timed(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The row ``run()`` makes, with the wall-clock time it took (``wall_s``: emulation
    time, for the ETA only)."""
    began = time.monotonic()
    row = run()
    row["wall_s"] = time.monotonic() - began
    return row


def spoils_guest(point: Point, row: dict[str, Any]) -> bool:
    """Whether the guest that ran ``point`` must not run another: the point took its CXL
    memory down (an uncorrectable error) or outlived its timeout (the guest may hang)."""
    if point.takes_down_cxl:
        log.info("%s took the guest's CXL memory down", point.key)
        return True
    return bool(row.get("timed_out"))


def live_row(experiment: Experiment, platform: Platform, point: Point) -> dict[str, Any]:
    """Run the live ``point`` on ``platform`` (firmware attached, its scenario's knobs and
    QMP injections); its row, or a failed one if it outlived ``point_timeout_s``."""
    scenario = QmpScenario(platform, point.qmp) if point.qmp else None
    if scenario is not None:
        scenario.prepare()  # with the plugin still dormant: faster
    timeout_s = experiment.point_timeout_s
    try:
        with platform.lost_connection_explained(), \
                platform.attach(point.design, experiment.profile_overrides(point)) as session:
            for at_ms, knob in point.inject:
                send_knob(platform, knob, at_ms)
            with scenario if scenario is not None else contextlib.nullcontext():
                status, out, err = session.run(point.command, timeout_s=timeout_s)
    except GuestTimeout as error:
        log.error("%s did not finish within point_timeout_s = %.0f s: recorded as failed", point.key,
                  timeout_s)
        row = point_row(point, TIMED_OUT_STATUS, b"", str(error).encode(), {})
        row["timed_out"] = True
        return row
    row = point_row(point, status, out, err, session.results)
    row["instance"] = platform.name  # which guest ran it (a run may boot more than one)
    row["knobs"] = session.results.get("knobs", [])
    row["placement"] = session.results.get("placement")
    if scenario is not None:
        row["qmp"] = scenario.observations()
    return row


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

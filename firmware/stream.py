"""Serve a request stream through a controller, and turn ROI markers into results.

Both drivers use this: the live driver with chunks of the plugin's ring, the
replay driver with chunks of a trace, so a recorded run replays to the same
per-ROI answers (DESIGN.md decision 5). A stream holds device requests and, in
stream order, the guest's ROI markers (:data:`~.request.Op.MARKER` records,
``flags`` = command, ``addr`` = event index << 16 | ROI id, ``time_ns`` = the
vCPU's local clock). The controller never sees a marker: the chunk is served in
pieces between them.

The modelled clock of a vCPU at a marker is its local clock (instructions x
CPI / frequency + DRAM stalls, kept by the plugin) plus the device stall the
controller has charged it so far. An ROI's modelled time is that clock at its
end marker minus the clock at its begin marker, on the vCPU that ran both.

A guest-driven stream (a live run, or its trace) also holds the guest runtime's
long-delay queries (reads flagged :data:`~.request.FLAG_QUERY`, each served on
its own and answered through ``on_query``), its SWITCH/RESUME markers (settled by
:class:`~.live_switching.LiveContextSwitch`), the promotion daemon's reports
(PROMOTED/DEMOTED/PROMOTE_FAILED markers, ``addr`` = the device page) and the
LLC misses promoted pages served from host DRAM (:data:`~.request.FLAG_HOST`,
counted in bulk). The controller's promotion decisions go to ``on_decision``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cxlssd.abi.protocol import DAEMON_ON
from cxlssd.firmware.context_switch import NeverSwitch
from cxlssd.firmware.controller import Controller
from cxlssd.firmware.hints import TransferEngine
from cxlssd.firmware.live_switching import LiveContextSwitch
from cxlssd.firmware.request import FLAG_ENGINE, FLAG_HOST, FLAG_QUERY, PAGE_SHIFT, MarkerCmd, Op, Source

log = logging.getLogger(__name__)

_OPS = ("read", "write")
_N_SOURCES = len(Source)
# latency histogram: log-spaced bucket edges from 1 ns to 100 s (for percentiles)
_EDGES = np.unique(np.round(np.logspace(0, 11, 441)).astype(np.int64))
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
_PAGE_REPORTS = frozenset((MarkerCmd.PROMOTED, MarkerCmd.DEMOTED, MarkerCmd.PROMOTE_FAILED))
_REJECTIONS_LOGGED = 10  # then only counted (a guest could flood the log)


class LatencyHistogram:
    """Streaming latency histogram; percentiles are reported as bucket upper edges
    (within 6 % of the exact value)."""

    def __init__(self) -> None:
        self.counts = np.zeros(_EDGES.size + 1, dtype=np.int64)

    def add(self, latency_ns: np.ndarray) -> None:
        self.counts += np.bincount(
            np.searchsorted(_EDGES, latency_ns, side="left"), minlength=self.counts.size
        )

    def percentile(self, p: float) -> int:
        total = int(self.counts.sum())
        if not total:
            return 0
        bucket = int(np.searchsorted(np.cumsum(self.counts), total * p / 100.0))
        return int(_EDGES[min(bucket, _EDGES.size - 1)])


@dataclass(frozen=True)
class Marker:
    """One marker as the stream driver saw it."""

    cmd: int
    roi: int
    event: int  # index into the plugin's ROI event table
    vcpu: int
    local_ns: int
    stall_ns: int
    device: dict[str, Any]  # the controller's counters at that point
    latency: np.ndarray  # [op, source] -> (count, latency sum) so far

    @property
    def clock_ns(self) -> int:
        return self.local_ns + self.stall_ns


#: counters that are levels, not counts: an ROI reports their value at its end
GAUGES = frozenset(
    {"capacity_pages", "occupied_pages", "capacity_entries", "threshold", "promoted_pages", "parked"}
)


def counter_delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """What happened between two nested counter dicts: counts are subtracted,
    gauges and lists taken from ``after``, ratios (floats) left out, since a
    ratio over the whole run says nothing about the interval."""
    out: dict[str, Any] = {}
    for key, value in after.items():
        if isinstance(value, dict):
            out[key] = counter_delta(value, before.get(key, {}))
        elif isinstance(value, bool) or not isinstance(value, int):
            if not isinstance(value, float):
                out[key] = value
        else:
            out[key] = value if key in GAUGES else value - before.get(key, 0)
    return out


def _latency_table(latency: np.ndarray) -> dict[str, dict[str, dict[str, float]]]:
    """{op: {source: {requests, mean_latency_ns}}} for the non-empty cells."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    for op, name in enumerate(_OPS):
        for source in range(_N_SOURCES):
            count, total = int(latency[op, source, 0]), int(latency[op, source, 1])
            if count:
                table.setdefault(name, {})[Source(source).name.lower()] = {
                    "requests": count,
                    "mean_latency_ns": total / count,
                }
    return table


class StreamServer:
    """Feed chunks to ``controller``; collect ROI results from the markers.

    ``cpu_counters(event)`` may give the plugin's counters of the vCPU at a
    marker (a dict of numbers): the live driver reads them from the plugin's
    ROI table; a replay has none. ``on_clock(vcpu, seq, clock_ns)`` answers the
    guest's clock reads (the live driver writes the paravirtual page; a replay
    only counts them); ``on_query(vcpu, ticket, long_delay, ready_ns)`` answers
    long-delay queries, ``on_decision(page, demote)`` hands on promotion and
    demotion decisions, ``on_report()`` follows the guest's reports of pages it moved
    (or could not). ``switching`` settles long delays (without it no query
    is answered "long")."""

    def __init__(
        self,
        controller: Controller,
        cpu_counters: Callable[[int], dict[str, int] | None] | None = None,
        on_clock: Callable[[int, int, int], None] | None = None,
        switching: LiveContextSwitch | None = None,
        on_query: Callable[[int, int, bool, int], None] | None = None,
        on_decision: Callable[[int, bool], None] | None = None,
        on_report: Callable[[], None] | None = None,
    ) -> None:
        self.controller = controller
        self.cpu_counters = cpu_counters
        self.on_clock = on_clock
        self.switching = switching or LiveContextSwitch(controller, NeverSwitch())
        self.on_query = on_query
        self.on_decision = on_decision
        self.on_report = on_report
        self.transfers = TransferEngine(controller)
        self.clock_reads = 0
        self.requests = 0
        self.markers = 0
        # guest reports naming a page past the device: markers, and the promoted-page
        # accesses the plugin derives from them
        self.markers_rejected = 0
        self.end_ns = 0  # latest ready time of any request
        self.results: list[dict[str, Any]] = []
        self.histogram = LatencyHistogram()
        self._open: dict[tuple[int, int], tuple[Marker, dict[str, int] | None]] = {}
        # [op, source, (count, latency sum)]
        self._latency = np.zeros((len(_OPS), _N_SOURCES, 2), dtype=np.int64)

    def serve(self, chunk: np.ndarray) -> None:
        """Serve one chunk of the stream, in order."""
        marker = chunk["op"] == Op.MARKER
        stops = np.flatnonzero(marker | ((chunk["flags"] & FLAG_QUERY) != 0))  # (markers first)
        start = 0
        for m in stops.tolist():
            self._process(chunk[start:m])
            if marker[m]:
                self._marker(chunk[m])
            else:
                self._query(chunk[m : m + 1])
            start = m + 1
        self._process(chunk[start:])

    def serve_all(self, chunks: Iterable[np.ndarray]) -> None:
        for chunk in chunks:
            self.serve(chunk)

    def _query(self, request: np.ndarray) -> None:
        out = self._process(request)
        assert out is not None
        vcpu = int(request["vcpu"][0])
        # inside a transfer bracket the read is the engine's (posted): the vCPU has nothing
        # to wait for, so nothing to switch away from
        in_bracket = self.transfers.in_bracket(vcpu, int(request["thread"][0]))
        latency_ns = 0 if in_bracket else int(out["latency_ns"][0])
        ticket, long_delay, ready_ns = self.switching.query(vcpu, int(out["start_ns"][0]), latency_ns)
        if self.on_query is not None:
            self.on_query(vcpu, ticket, long_delay, ready_ns)

    def _process(self, requests: np.ndarray) -> np.ndarray | None:
        if self.transfers.brackets_open:
            requests = self.transfers.as_engine_work(requests)
        host = (requests["flags"] & FLAG_HOST) != 0
        if host.any():
            # counted in bulk: recency at this granularity is all the demotion choice needs
            pages = requests["addr"][host] >> np.uint64(PAGE_SHIFT)
            inside = pages < self.controller.device_pages  # (from the guest's own reports)
            self.markers_rejected += int(pages.shape[0]) - int(np.count_nonzero(inside))
            moving = (requests["flags"][host][inside] & FLAG_ENGINE) != 0  # a move's copies
            self.controller.count_host_accesses(pages[inside].astype(np.int64), moving)
            requests = requests[~host]
        if not requests.shape[0]:
            return None
        out = self.controller.process(requests)
        if self.transfers.brackets_open:
            self.transfers.served(requests, out)
        if self.on_decision is not None:
            decided = (out["promote_page"] >= 0) | (out["demote_page"] >= 0)
            for promote, demote in zip(out["promote_page"][decided].tolist(),
                                       out["demote_page"][decided].tolist(), strict=True):
                if demote >= 0:
                    self.on_decision(demote, True)
                if promote >= 0:
                    self.on_decision(promote, False)
        self.requests += int(requests.shape[0])
        self.end_ns = max(self.end_ns, int(out["ready_ns"].max()))
        rw = requests["op"] <= Op.WRITE
        self.histogram.add(out["latency_ns"][rw])
        if rw.any():
            cell = requests["op"][rw].astype(np.int64) * _N_SOURCES + out["source"][rw]
            size = len(_OPS) * _N_SOURCES
            self._latency[..., 0] += np.bincount(cell, minlength=size).reshape(len(_OPS), _N_SOURCES)
            self._latency[..., 1] += np.bincount(
                cell, weights=out["latency_ns"][rw], minlength=size
            ).astype(np.int64).reshape(len(_OPS), _N_SOURCES)
        return out

    def _marker(self, record: np.void) -> None:
        self.markers += 1
        vcpu = int(record["vcpu"])
        addr = int(record["addr"])
        cmd = int(record["flags"])
        self.switching.marker(vcpu, cmd, addr, int(record["time_ns"]))
        if cmd > MarkerCmd.CLOCK:
            self._runtime_marker(cmd, vcpu, int(record["thread"]), addr, int(record["time_ns"]))
            return
        if cmd == MarkerCmd.CLOCK:  # a clock read: answer it, nothing to snapshot
            self.clock_reads += 1
            if self.on_clock is not None:
                self.on_clock(vcpu, addr >> 16, int(record["time_ns"]) + self.controller.vcpu_stall_ns(vcpu))
            return
        marker = Marker(
            cmd=cmd,
            roi=addr & 0xFFFF,
            event=addr >> 16,
            vcpu=vcpu,
            local_ns=int(record["time_ns"]),
            stall_ns=self.controller.vcpu_stall_ns(vcpu),
            device=self.device_counters(),
            latency=self._latency.copy(),
        )
        cpu = self.cpu_counters(marker.event) if self.cpu_counters is not None else None
        key = (marker.roi, vcpu)
        if marker.cmd == MarkerCmd.ROI_BEGIN:
            # after the snapshot: a flush at the ROI's start is the ROI's work
            self.controller.roi_begins(marker.local_ns + marker.stall_ns)
            if key in self._open:
                log.warning("ROI %d began again on vCPU %d before it ended: the earlier begin is dropped",
                            marker.roi, vcpu)
            self._open[key] = (marker, cpu)
        elif marker.cmd == MarkerCmd.ROI_END:
            begun = self._open.pop(key, None)
            if begun is None:
                log.warning("ROI %d ended on vCPU %d without a begin: ignored", marker.roi, vcpu)
                return
            self.results.append(self._result(*begun, marker, cpu))
        else:
            log.warning("unknown marker command %d (ROI %d): ignored", marker.cmd, marker.roi)

    def _runtime_marker(self, cmd: int, vcpu: int, thread: int, arg: int, local_ns: int) -> None:
        """The promotion reports and the transfer engine's markers (SWITCH/RESUME are
        the switching's)."""
        if cmd in _PAGE_REPORTS and arg >= self.controller.device_pages:
            # guest-supplied (any program can write a marker): never an index into the model
            self.markers_rejected += 1
            if self.markers_rejected <= _REJECTIONS_LOGGED:
                log.warning("marker %d of vCPU %d names device page %#x, beyond the device's %d pages: "
                            "ignored", cmd, vcpu, arg, self.controller.device_pages)
            return
        if cmd in _PAGE_REPORTS and self.on_report is not None:
            self.on_report()
        if cmd == MarkerCmd.PROMOTED:
            self.controller.host_promoted(arg)
            self.transfers.page_moved(vcpu, thread)
        elif cmd == MarkerCmd.DEMOTED:
            self.controller.host_demoted(arg)
            self.transfers.page_moved(vcpu, thread)
        elif cmd == MarkerCmd.PROMOTE_FAILED:
            self.controller.host_gave_up(arg)
        elif cmd == MarkerCmd.XFER_BEGIN:
            self.transfers.begin(vcpu, thread, arg, local_ns)
        elif cmd == MarkerCmd.XFER_END:
            self.transfers.end(vcpu, thread, arg, local_ns)
        elif cmd == MarkerCmd.XFER_WAIT:
            self.transfers.wait(vcpu, arg, local_ns)
        elif cmd == MarkerCmd.HINT:
            self.transfers.hint(vcpu, arg, local_ns)
        elif cmd == MarkerCmd.DAEMON:
            self.transfers.daemon_switched(vcpu, thread, arg == DAEMON_ON, local_ns)

    def device_counters(self) -> dict[str, Any]:
        """The controller's counters with the guest OS's side (switches, the share of
        accesses promoted pages served)."""
        counters = self.controller.counter_dict()
        counters["os"] = self.switching.counter_dict()
        counters["transfers"] = self.transfers.counter_dict()
        return counters

    def _result(
        self, begin: Marker, begin_cpu: dict[str, int] | None, end: Marker, end_cpu: dict[str, int] | None
    ) -> dict[str, Any]:
        device = counter_delta(end.device, begin.device)
        result: dict[str, Any] = {
            "roi": begin.roi,
            "vcpu": begin.vcpu,
            "modelled_ns": end.clock_ns - begin.clock_ns,
            "begin_ns": begin.clock_ns,
            "end_ns": end.clock_ns,
            "local_ns": end.local_ns - begin.local_ns,
            "device_stall_ns": end.stall_ns - begin.stall_ns,
            "device": device,
            "latency_by_source": _latency_table(end.latency - begin.latency),
        }
        model = device.get("model", {})
        # the program's accesses: a move's copies are the device's work (count_host_accesses)
        host = model.get("host_accesses", 0) - model.get("move_host_accesses", 0)
        requests = model["requests"] - model.get("move_requests", 0)
        result["promoted_share"] = host / (host + requests) if host else 0.0
        if begin_cpu is not None and end_cpu is not None:
            result["cpu"] = counter_delta(end_cpu, begin_cpu)
        return result

    def unfinished(self) -> list[dict[str, int]]:
        """ROIs that began and never ended."""
        return [{"roi": roi, "vcpu": vcpu} for roi, vcpu in self._open]

    def summary(self) -> dict[str, Any]:
        """Counters, stall totals, latency percentiles and the ROI results so far."""
        counters = self.device_counters()
        model = counters["model"]
        return {
            "counters": counters,
            "stalls": {
                "latency_ns_total": model["latency_ns_total"],
                "stall_ns_total": model["stall_ns_total"],
                "long_delay_latency_ns": model["long_delay_latency_ns"],
                "modelled_end_ns": self.end_ns,
            },
            "latency_percentiles_ns": {f"p{p:g}": self.histogram.percentile(p) for p in PERCENTILES},
            "rois": self.results,
            "unfinished_rois": self.unfinished(),
            "markers_rejected": self.markers_rejected,
        }

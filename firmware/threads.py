"""Threads on a vCPU, for replay: opportunistic context switching as SkyByte runs it.

A trace record carries its guest thread (``thread``, per vCPU); its ``time_ns`` is
that thread's own compute clock (instructions, no device stalls). Each vCPU runs
its threads as the OS would on a core:

* the running thread issues its requests one after another, its compute gaps and
  every latency added to the vCPU's clock;
* on a long-delay answer the thread is parked until its data is ready, the vCPU
  pays the switch (``context_switch.switch_cost_ns``) and the scheduler picks the
  next thread (``context_switch.scheduler``: ``round-robin``, SkyByte's, takes the
  next in ring order and waits for it if its data is not there yet;
  ``earliest-ready`` takes the thread whose data is ready first);
* a resumed thread re-issues the access that was answered with the long delay;
* with no thread left to run, the vCPU idles until the next one is ready. A single
  thread therefore gains nothing from C: it waits as it would without the switch.

Without context switching (designs without C) a thread runs until it ends, then the
next one. The vCPUs advance together in modelled time (the one furthest behind
issues next), so the device sees their requests in time order. The controller runs
on the *issue* timebase: this driver owns the clocks.
"""

from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from cxlssd.errors import InputError
from cxlssd.firmware.controller import Controller
from cxlssd.firmware.request import FLAG_HOST, FLAG_POSTED, FLAG_QUERY, MarkerCmd, Op
from cxlssd.firmware.stream import PERCENTILES, LatencyHistogram

SCHEDULERS = ("round-robin", "earliest-ready")


@dataclass
class ThreadCounters:
    compute_ns: int = 0  # the threads' own work between their requests
    switches: int = 0
    switch_ns: int = 0  # vCPU time spent switching
    idle_ns: int = 0  # vCPU time with no thread ready to run
    reissues: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _Thread:
    __slots__ = ("last_ns", "parked_until", "pos", "records", "reissue")

    def __init__(self, records: np.ndarray) -> None:
        # (compute time, addr, op, flags) per request, as Python ints (cheap to index)
        self.records = list(zip(records["time_ns"].tolist(), records["addr"].tolist(),
                                records["op"].tolist(), records["flags"].tolist(), strict=True))
        self.pos = 0
        self.last_ns = self.records[0][0] if self.records else 0
        self.parked_until = 0  # ready time of the access it waits for
        self.reissue = False  # the parked access is issued again on resume

    @property
    def done(self) -> bool:
        return self.pos >= len(self.records) and not self.reissue


def guest_threads(requests: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """A live run's recorded stream (compute timebase: ``time_ns`` is its vCPU's
    compute clock, ``thread`` the guest thread the kernel helper noted) as the thread
    model's input. Returns the device reads and writes before the first ROI begins
    (the set-up), those of that ROI with each ``time_ns`` now its thread's own
    compute clock, and the ROI's id (-1: no ROI, all of it is the ROI's). The work
    between two requests of a vCPU is the thread's whose request ends it (the guest
    ran it); what the live run's guest did besides (its switches, promotions, misses
    served by host DRAM) is left to the replayed design."""
    markers = np.flatnonzero((requests["op"] == Op.MARKER) & (requests["flags"] == MarkerCmd.ROI_BEGIN))
    begin, end, roi = 0, len(requests), -1
    if markers.size:
        begin = int(markers[0])
        roi = int(requests["addr"][begin]) & 0xFFFF
        ends = np.flatnonzero((requests["op"] == Op.MARKER) & (requests["flags"] == MarkerCmd.ROI_END)
                              & (requests["addr"] & 0xFFFF == roi))
        ends = ends[ends > begin]
        end = int(ends[0]) if ends.size else end
    setup, part = _device_requests(requests[:begin]), _device_requests(requests[begin:end])
    for vcpu in np.unique(part["vcpu"]).tolist():
        mine = np.flatnonzero(part["vcpu"] == vcpu)
        work = np.diff(part["time_ns"][mine].astype(np.int64), prepend=0)
        for thread in np.unique(part["thread"][mine]).tolist():
            own = part["thread"][mine] == thread
            part["time_ns"][mine[own]] = np.cumsum(work[own])
    return setup, part, roi


def _device_requests(requests: np.ndarray) -> np.ndarray:
    """The reads and writes the device served (not the misses host DRAM served), without
    the live run's queries (the replayed design asks for itself); a copy."""
    rw = requests[(requests["op"] <= Op.WRITE) & (requests["flags"] & FLAG_HOST == 0)].copy()
    rw["flags"] &= ~np.uint8(FLAG_QUERY)
    return rw


class ThreadedReplay:
    """Run a trace's threads on their vCPUs through ``controller`` (issue timebase)."""

    def __init__(self, controller: Controller, scheduler: str = "round-robin") -> None:
        if controller.compute_timebase:
            raise ValueError("ThreadedReplay keeps the clocks: give it a controller on the issue timebase")
        if scheduler not in SCHEDULERS:
            raise InputError(f"unknown scheduler {scheduler!r}; choose one of {', '.join(SCHEDULERS)}")
        self.controller = controller
        self.earliest_ready = scheduler == "earliest-ready"
        self.switch_cost_ns = controller.context_switch.switch_cost_ns
        self.counters = ThreadCounters()
        self.vcpu_clock_ns: dict[int, int] = {}
        self.histogram = LatencyHistogram()

    def run(self, requests: np.ndarray, start_ns: int = 0) -> dict[int, int]:
        """Serve every read/write record of ``requests``, the vCPUs starting at
        ``start_ns``; returns each vCPU's final modelled clock (ns)."""
        rw = requests[requests["op"] <= Op.WRITE]
        self.controller.check_requests(rw)
        serve = self.controller.serve_one
        threads: dict[int, list[_Thread]] = {}
        for vcpu in np.unique(rw["vcpu"]).tolist():
            mine = rw[rw["vcpu"] == vcpu]
            threads[vcpu] = [_Thread(mine[mine["thread"] == t]) for t in np.unique(mine["thread"]).tolist()]
        current = dict.fromkeys(threads, 0)
        clock = dict.fromkeys(threads, 0)
        queue = [(start_ns, vcpu) for vcpu in threads]
        heapq.heapify(queue)
        latencies: list[int] = []
        while queue:
            now, vcpu = heapq.heappop(queue)
            ring = threads[vcpu]
            index = self._next(ring, current[vcpu], now)
            if index < 0:
                clock[vcpu] = now
                continue
            current[vcpu] = index
            thread = ring[index]
            if thread.parked_until > now:  # nothing else to run: wait for its data
                self.counters.idle_ns += thread.parked_until - now
                now = thread.parked_until
            if thread.reissue:
                thread.reissue = False
                self.counters.reissues += 1
                compute_ns, addr, op, flags = thread.records[thread.pos - 1]
            else:
                compute_ns, addr, op, flags = thread.records[thread.pos]
                thread.pos += 1
                gap = compute_ns - thread.last_ns  # the thread's own work
                now += gap
                self.counters.compute_ns += gap
                thread.last_ns = compute_ns
            start, latency, _, long_delay, _, _ = serve(now, addr, vcpu, op, flags)
            if flags & FLAG_POSTED:
                pass
            elif long_delay:  # only designs with C answer so
                thread.parked_until = start + latency
                thread.reissue = True
                now += self.switch_cost_ns
                self.counters.switches += 1
                self.counters.switch_ns += self.switch_cost_ns
                current[vcpu] = (index + 1) % len(ring)
            else:
                now += latency
            latencies.append(latency)
            if len(latencies) >= 1 << 16:
                self.histogram.add(np.array(latencies))
                latencies.clear()
            heapq.heappush(queue, (now, vcpu))
        self.histogram.add(np.array(latencies, dtype=np.int64))
        self.vcpu_clock_ns = clock
        return clock

    def _next(self, ring: list[_Thread], start: int, now: int) -> int:
        """The thread to run next on a vCPU (-1: all done)."""
        alive = [i for i in (*range(start, len(ring)), *range(start)) if not ring[i].done]
        if not alive:
            return -1
        if not self.earliest_ready:
            return alive[0]
        ready = [i for i in alive if ring[i].parked_until <= now]
        return ready[0] if ready else min(alive, key=lambda i: ring[i].parked_until)

    def summary(self) -> dict[str, Any]:
        """The replay result (as :meth:`.stream.StreamServer.summary`) with the
        vCPUs' clocks and the thread counters."""
        counters = self.controller.counter_dict()
        counters["threads"] = self.counters.as_dict()
        model = counters["model"]
        return {
            "counters": counters,
            "stalls": {
                "latency_ns_total": model["latency_ns_total"],
                # everything but the threads' compute: device time, switches, idling
                "stall_ns_total": sum(self.vcpu_clock_ns.values()) - self.counters.compute_ns,
                "long_delay_latency_ns": model["long_delay_latency_ns"],
                "modelled_end_ns": max(self.vcpu_clock_ns.values(), default=0),
            },
            "vcpu_clock_ns": {str(v): t for v, t in sorted(self.vcpu_clock_ns.items())},
            "latency_percentiles_ns": {f"p{p:g}": self.histogram.percentile(p) for p in PERCENTILES},
            "rois": [],
            "unfinished_rois": [],
        }

"""Flash backend: the FTL (where pages go) + the timeline (when operations finish).

The controller calls :meth:`FlashBackend.read` and :meth:`FlashBackend.program`
with a logical page and the time the operation is issued; GC the FTL asks for runs
right after the host program that caused it, in the background on the same die.
Every flash operation is counted by cause (see :class:`FlashCounters`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from cxlssd.firmware.ftl import PageFtl
from cxlssd.firmware.scheduler import FlashTimeline


@dataclass
class FlashCounters:
    """Flash operations by cause: ``host`` serves a miss or writes host data back;
    ``merge`` reads an old page for a log flush; ``gc`` relocates or erases."""

    reads_host: int = 0
    reads_merge: int = 0
    reads_gc: int = 0
    programs_host: int = 0
    programs_gc: int = 0
    erases_gc: int = 0
    gc_runs: int = 0
    host_read_queue_ns: int = 0  # time host reads waited for a busy die or channel

    def as_dict(self) -> dict[str, int | float]:
        out: dict[str, int | float] = dict(asdict(self))
        out["reads_total"] = self.reads_host + self.reads_merge + self.reads_gc
        out["programs_total"] = self.programs_host + self.programs_gc
        # FTL write amplification: pages programmed per page of host data programmed
        out["write_amplification"] = (
            out["programs_total"] / self.programs_host if self.programs_host else 0.0
        )
        return out


class FlashBackend:
    """Page reads/programs of logical pages, timed, with GC."""

    def __init__(self, ftl: PageFtl, timeline: FlashTimeline) -> None:
        if ftl.n_dies != timeline.n_dies:
            raise ValueError("the FTL and the timeline disagree on the number of dies")
        self.ftl = ftl
        self.timeline = timeline
        self.counters = FlashCounters()

    def read(self, lpn: int, time_ns: int, cause: str = "host") -> int:
        """Read page ``lpn`` issued at ``time_ns``; returns when its data is out.

        ``cause`` is ``"host"`` (a miss) or ``"merge"`` (a log flush)."""
        timeline = self.timeline
        die = lpn % timeline.n_dies
        counters = self.counters
        if cause == "merge":
            counters.reads_merge += 1
            return timeline.merge_read(die, time_ns)
        done = timeline.read(die, time_ns)
        counters.reads_host += 1
        counters.host_read_queue_ns += done - time_ns - timeline.read_ns - timeline.transfer_ns
        return done

    def program(self, lpn: int, time_ns: int) -> int:
        """Program host data of page ``lpn`` issued at ``time_ns`` (background work);
        returns its estimated completion."""
        die = self.ftl.program(lpn)
        done = self.timeline.program(die, time_ns)
        self.counters.programs_host += 1
        if self.ftl.gc_pending:
            self._collect(time_ns)
        return done

    def _collect(self, time_ns: int) -> None:
        ftl, counters = self.ftl, self.counters
        while ftl.gc_pending:
            result = ftl.collect(ftl.gc_pending.pop())
            if result is None:
                continue
            counters.gc_runs += 1
            counters.reads_gc += result.moved
            counters.programs_gc += result.moved
            counters.erases_gc += 1
            if result.moved:
                self.timeline.copy(result.die, time_ns, result.moved)
            self.timeline.erase(result.die, time_ns)

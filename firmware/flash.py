"""Flash backend: the FTL (where pages go) + the timeline (when operations finish).

The controller calls :meth:`FlashBackend.read` and :meth:`FlashBackend.program`
with a logical page and the time the operation is issued; GC the FTL asks for runs
right after the host program that caused it, in the background on the same die.
Every flash operation is counted by cause (see :class:`FlashCounters`).

A GC storm (the ``gc-storm`` knob) makes chosen dies collect blocks, forced
(:meth:`PageFtl.collect`), until it stops: every host read on such a die first
tops the die's background work up to one erase, so it finds GC in progress.

Die faults (the ``die-fault`` knob, docs/inject.md): a *slow* die has its array
times scaled (:meth:`FlashTimeline.set_die_factor`); a *failed* die takes no new
writes (the FTL places them on the other dies) and its pages are **rebuilt on
read** from the die's parity stripe, modelled as RAIN across the channels: the
stripe of die ``d`` is the die of the same row (``d // channels``) on every
channel, so one failed die per row (a whole channel at most) can be rebuilt. A
rebuild reads the page's stripe mates on the other channels in parallel, XORs
them (:data:`REBUILD_NS_PER_PAGE` each; the read is done when the slowest mate
and the XOR are), then writes the rebuilt page to a healthy die (where placement puts it) in the
background, so later reads of it are ordinary reads there. Keeping the
parity up to date on writes is not modelled (its cost is taken as part of the
over-provisioning). Without faults, reads take the same path as before.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from cxlssd.errors import InputError
from cxlssd.firmware.ftl import GcResult, PageFtl
from cxlssd.firmware.scheduler import FlashTimeline

#: a rebuild's XOR of each stripe mate's page in the controller (ours: 4 KiB through
#: a ~4 GB/s parity engine); with idle dies a rebuilt read costs one page read plus
#: (channels - 1) x this
REBUILD_NS_PER_PAGE = 1_000


def check_rebuildable(channels: int) -> None:
    """InputError unless a failed die can be rebuilt (its stripe has another channel)."""
    if channels < 2:
        raise InputError(
            "a design with one flash channel has no parity stripe to rebuild a failed die "
            "from; slow the die instead, or use a design with more flash.channels"
        )


@dataclass
class FlashCounters:
    """Flash operations by cause: ``host`` serves a miss or writes host data back;
    ``merge`` reads an old page for a log flush; ``gc`` relocates or erases;
    ``rebuild`` reads a failed die's page back from its parity stripe and rewrites it."""

    reads_host: int = 0
    reads_merge: int = 0
    reads_gc: int = 0
    reads_rebuild: int = 0  # stripe reads (channels - 1 per rebuild)
    programs_host: int = 0
    programs_gc: int = 0
    programs_rebuild: int = 0
    erases_gc: int = 0
    gc_runs: int = 0  # blocks collected (gc.unit die) or lines (line: one erase per die each)
    rebuilds: int = 0  # host or merge reads of a failed die's page
    reads_slow_die: int = 0  # host reads served by a slowed die
    host_read_queue_ns: int = 0  # time host reads waited for a busy die or channel
    roi_idles: int = 0  # ROI beginnings that found the device idle (flash.idle_at_roi_begin)
    roi_dropped_ns: int = 0  # how long the dies were still to be busy then, summed

    def as_dict(self) -> dict[str, int | float]:
        out: dict[str, int | float] = dict(asdict(self))
        out["reads_total"] = self.reads_host + self.reads_merge + self.reads_gc + self.reads_rebuild
        out["programs_total"] = self.programs_host + self.programs_gc + self.programs_rebuild
        # FTL write amplification: pages programmed per page of host data programmed
        out["write_amplification"] = (
            out["programs_total"] / self.programs_host if self.programs_host else 0.0
        )
        return out


@dataclass
class StormWork:
    """A GC storm's dies (until when each keeps collecting, ns) and its tally."""

    stop_ns: dict[int, int] = field(default_factory=dict)
    blocks: int = 0
    pages_moved: int = 0
    dies_without_work: set[int] = field(default_factory=set)


class FlashBackend:
    """Page reads/programs of logical pages, timed, with GC."""

    def __init__(self, ftl: PageFtl, timeline: FlashTimeline, gc_read_priority: bool = True,
                 idle_at_roi_begin: bool = False) -> None:
        if ftl.n_dies != timeline.n_dies:
            raise ValueError("the FTL and the timeline disagree on the number of dies")
        self.ftl = ftl
        self.timeline = timeline
        # gc.read_priority: GC work is background work that host reads go before (ours,
        # as the write-backs and flush programs); false: reads queue behind it (FIFO), as
        # the artifact's GC_IO commands take the unit's timeline (ftl.cc ssd_advance_status)
        self.gc_read_priority = gc_read_priority
        # flash.idle_at_roi_begin: a ROI starts on idle dies, the work the set-up left
        # queued dropped, as SkyByte's artifact measures in a run of its own (main.cc)
        self.idle_at_roi_begin = idle_at_roi_begin
        self.counters = FlashCounters()
        self.slow: set[int] = set()  # dies with a factor above 1
        self.storm = StormWork()
        # Any die slowed or failed, or a GC storm: reads take the general path
        # (without, one attribute test on every read).
        self.faults = False

    def _update_faults(self) -> None:
        self.faults = bool(self.slow or self.ftl.failed or self.storm.stop_ns)

    def roi_begins(self, time_ns: int) -> bool:
        """A ROI begins at ``time_ns``: with ``idle_at_roi_begin``, every die and channel
        is idle from then on (counted in the ROI: ``roi_idles``, ``roi_dropped_ns``).
        Whether it dropped the work queued then."""
        if not self.idle_at_roi_begin:
            return False
        self.counters.roi_dropped_ns += self.timeline.idle(time_ns)
        self.counters.roi_idles += 1
        return True

    def read(self, lpn: int, time_ns: int, cause: str = "host") -> int:
        """Read page ``lpn`` issued at ``time_ns``; returns when its data is out.

        ``cause`` is ``"host"`` (a miss) or ``"merge"`` (a log flush)."""
        timeline = self.timeline
        die = self.ftl.die_of(lpn)
        counters = self.counters
        if self.faults:
            if die in self.ftl.failed:
                return self._read_failed(lpn, die, time_ns, cause)
            if cause != "merge":
                if die in self.slow:
                    counters.reads_slow_die += 1
                stop_ns = self.storm.stop_ns.get(die)
                if stop_ns is not None and time_ns < stop_ns:
                    self.storm_top_up(die, time_ns)
        done = timeline.read(die, time_ns, present=cause != "merge")
        if cause == "merge":
            counters.reads_merge += 1
            return done
        counters.reads_host += 1
        counters.host_read_queue_ns += done - time_ns - timeline.die_read_ns[die] - timeline.transfer_ns
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
        ftl = self.ftl
        if ftl.unit == "line":
            self._collect_lines(time_ns)
            return
        while ftl.gc_pending:
            result = ftl.collect(ftl.gc_pending.pop())
            if result is not None:
                self._account_gc(result, time_ns)

    def _collect_lines(self, time_ns: int) -> None:
        """One GC pass of ``gc.unit: line``: lines until enough are free, each at most
        once, and no more lines than were missing when it began (ours: the artifact's
        line pass may sweep every line, which on a drive too full to reach the stop
        threshold it does at every block opening); every die gets its share (reads
        where the pages were, programs where they go, an erase) as GC work."""
        ftl, timeline = self.ftl, self.timeline
        collected: set[int] = set()
        lines_missing = ftl.gc_stop_blocks - ftl.free_lines()
        while ftl.free_lines() < ftl.gc_stop_blocks and len(collected) < lines_missing:
            result = ftl.collect_line(collected)
            if result is None:
                break
            collected.add(result.block)
            self._count_gc(result.moved, erases=len(result.dies))
            erased = set(result.dies)
            for die in range(ftl.n_dies):
                work_ns = timeline.gc_work_ns(
                    die, reads_out=result.read_from[die], programs_in=result.programmed_on[die],
                    erases=int(die in erased),
                )
                if work_ns:
                    self._gc_work(die, time_ns, work_ns)
        ftl.gc_pending.clear()  # its trigger, and the pass's own block openings
        ftl.line_openings = 0

    def _gc_work(self, die: int, time_ns: int, work_ns: int, background: bool = False) -> None:
        if background or self.gc_read_priority:
            self.timeline.background(die, time_ns, work_ns)
        else:
            self.timeline.occupy(die, time_ns, work_ns)

    def _count_gc(self, moved: int, erases: int) -> None:
        """Count one collected block or line: ``moved`` pages relocated, ``erases`` blocks."""
        counters = self.counters
        counters.gc_runs += 1
        counters.reads_gc += moved
        counters.programs_gc += moved
        counters.erases_gc += erases

    def _account_gc(self, result: GcResult, time_ns: int, storm: bool = False) -> None:
        """Count one collected block and queue its copies and erase on its die (a GC
        storm's as background work whatever ``gc_read_priority``: it keeps its dies'
        backlog topped up)."""
        self._count_gc(result.moved, erases=1)
        work_ns = self.timeline.gc_work_ns(result.die, copies=result.moved, erases=1)
        self._gc_work(result.die, time_ns, work_ns, background=storm)

    # -- GC storms -------------------------------------------------------------------

    def begin_storm(self, dies: list[int], stop_ns: int) -> None:
        """Keep ``dies`` collecting until ``stop_ns``: each host read on one of them
        before then first tops its background work up to one erase (so reads always
        find GC in progress). The storm's tally starts from zero."""
        self.storm = StormWork(stop_ns=dict.fromkeys(dies, stop_ns))
        self._update_faults()

    def end_storm(self) -> StormWork:
        """Stop adding storm work; returns the storm's tally."""
        storm, self.storm = self.storm, StormWork()
        self._update_faults()
        return storm

    def storm_collect(self, die: int, time_ns: int, blocks: int = 1) -> bool:
        """Collect ``blocks`` blocks on ``die`` at ``time_ns``, even ones with every page
        valid (forced); False if the die ran out of work (no closed block, no free
        block to move into, or failed)."""
        for _ in range(blocks):
            result = self.ftl.collect(die, force=True)
            if result is None:
                self.storm.dies_without_work.add(die)
                return False
            self._account_gc(result, time_ns, storm=True)
            self.storm.blocks += 1
            self.storm.pages_moved += result.moved
        return True

    def storm_top_up(self, die: int, time_ns: int) -> None:
        """Collect blocks on ``die`` until it has at least one erase of background work."""
        timeline = self.timeline
        while timeline.backlog_ns(die, time_ns) < timeline.die_erase_ns[die]:
            if not self.storm_collect(die, time_ns):
                return

    # -- die faults ----------------------------------------------------------------

    def stripe_of(self, die: int) -> list[int]:
        """The dies of ``die``'s parity stripe (its row across the channels), itself included."""
        channels = self.timeline.channels
        row = die // channels
        return [row * channels + c for c in range(channels)]

    def _read_failed(self, lpn: int, die: int, time_ns: int, cause: str) -> int:
        ftl, timeline, counters = self.ftl, self.timeline, self.counters
        if ftl.l2p[lpn] < 0:
            # never written: no data to rebuild; charged as a read of its stand-in die
            die = ftl.stand_in(lpn)
            if cause == "merge":
                counters.reads_merge += 1
            else:
                counters.reads_host += 1
            return timeline.read(die, time_ns)
        mates = [d for d in self.stripe_of(die) if d != die]
        done = max(timeline.read(mate, time_ns) for mate in mates) + len(mates) * REBUILD_NS_PER_PAGE
        counters.rebuilds += 1
        counters.reads_rebuild += len(mates)
        if cause != "merge":  # a merge read's page is programmed by its flush anyway
            timeline.program(ftl.program(lpn), done)
            counters.programs_rebuild += 1
            if ftl.gc_pending:
                self._collect(time_ns)
        return done

    def fail_dies(self, dies: list[int]) -> None:
        """Fail ``dies``: no new writes, their pages rebuilt on read. InputError if a
        stripe would lose two dies (or has no other die), or the rest lack room."""
        check_rebuildable(self.timeline.channels)
        for die in dies:
            lost = [d for d in self.stripe_of(die) if d != die and (d in self.ftl.failed or d in dies)]
            if lost:
                raise InputError(
                    f"die {die} shares its parity stripe (die row {die // self.timeline.channels} across "
                    f"the channels) with failed die {lost[0]}: one failed die per stripe can be rebuilt; "
                    "restore that one first"
                )
        self.ftl.fail(dies)
        self._update_faults()

    def slow_dies(self, dies: list[int], factor: float) -> None:
        """Scale the array times of ``dies`` by ``factor`` (> 1)."""
        self.timeline.set_die_factor(dies, factor)
        self.slow.update(dies)
        self._update_faults()

    def restore_dies(self, dies: list[int]) -> None:
        """Undo slow-downs and failures of ``dies``; pages written elsewhere meanwhile
        stay where they are until written again."""
        self.timeline.set_die_factor(dies, 1.0)
        self.slow.difference_update(dies)
        self.ftl.restore(dies)
        self._update_faults()

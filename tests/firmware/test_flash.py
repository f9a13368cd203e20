"""Flash layers: timeline (per-die queueing, read priority), FTL + GC, backend counters."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cxlssd.firmware.flash import FlashBackend
from cxlssd.firmware.ftl import GC_VICTIM_POLICIES, PLACEMENTS, GcResult, PageFtl, StripedPlacement
from cxlssd.firmware.scheduler import MAX_BOOKED, FlashTimeline


def timeline(**kw) -> FlashTimeline:
    args = {"channels": 2, "dies_per_channel": 2, "read_ns": 3000, "program_ns": 80000,
            "erase_ns": 1_000_000, **kw}
    return FlashTimeline(**args)


def test_reads_on_one_die_queue_and_other_dies_run_in_parallel() -> None:
    t = timeline()
    same = [t.read(0, 0) for _ in range(4)]
    assert same == [3000, 6000, 9000, 12000]
    assert [t.read(d, 0) for d in (1, 2, 3)] == [3000, 3000, 3000]


def test_channel_transfer_is_shared_by_its_dies() -> None:
    t = timeline(transfer_ns=1000)
    # dies 0 and 2 share channel 0: the second transfer waits for the first
    assert t.read(0, 0) == 4000
    assert t.read(2, 0) == 5000
    assert t.read(1, 0) == 4000  # channel 1


def test_host_read_waits_for_one_background_program_not_the_backlog() -> None:
    t = timeline()
    for _ in range(10):
        t.program(0, 0)
    # the program in progress since 0 ends at 80 us; the read goes next
    assert t.read(0, 1000) == 80000 + 3000
    # the rest of the backlog resumes after the read: all work done 3 us later
    assert t.background(0, 83000, 0) == 10 * 80000 + 3000


def test_a_read_does_not_wait_for_reads_booked_ahead_of_it() -> None:
    """A log compaction books its merge reads when it starts, each at the time the flush will
    reach its page; a host read issued before one of them goes first, as the die serves
    reads as they come (the later one has not been issued yet)."""
    t = timeline()
    assert t.read(0, 100_000, present=False) == 103_000  # merge reads booked ahead
    assert t.read(0, 200_000, present=False) == 203_000
    assert t.read(0, 10_000) == 13_000  # before both: no wait
    assert t.read(0, 101_000) == 106_000  # one in progress: waits for it only
    assert t.read(0, 198_500) == 206_000  # no room before the next one: queues behind it
    assert t.read(1, 10_000) == 13_000  # other dies as before


def test_a_read_in_a_gap_waits_for_the_program_in_progress() -> None:
    t = timeline()
    for _ in range(4):
        t.program(0, 0)  # 320 us of programs from 0
    assert t.read(0, 400_000, present=False) == 403_000  # a merge read after them
    # at 1 us the first program runs until 80 us: the read goes next, before the merge read
    assert t.read(0, 1_000) == 83_000


def test_an_idle_device_forgets_the_work_queued_and_booked_ahead() -> None:
    """FlashTimeline.idle (flash.idle_at_roi_begin): programs queued, reads booked ahead
    and channel transfers are dropped, with how long each die was to stay busy; a read
    right after waits for nothing, and work queued later drains as before."""
    t = timeline()
    for _ in range(3):
        t.program(0, 0)  # 3 x 80 us on die 0, from 0
    t.read(1, 500_000)  # a read booked ahead on die 1, as a compaction's merge read
    assert t.read(0, 1000) == 80_000 + 3000  # before: behind the program in progress
    dropped = t.idle(10_000)
    assert dropped == (240_000 - 10_000) + (503_000 - 10_000)  # each die's busy-until
    assert t.read(0, 10_000) == t.read(1, 10_000) == 10_000 + 3000
    assert t.idle(20_000) == 0  # nothing left: nothing dropped
    t.program(2, 20_000)
    assert t.read(2, 200_000) == 200_000 + 3000  # the program was over by then


def test_gc_holding_the_die_leaves_no_gap() -> None:
    t = timeline()
    assert t.occupy(0, 0, 200_000) == 200_000  # GC work without read priority (FIFO)
    assert t.read(0, 500_000, present=False) == 503_000  # a merge read booked ahead
    assert t.read(0, 10_000) == 203_000  # waits for all of the GC work, then fits before it


def test_a_die_without_host_reads_remembers_a_bounded_number_of_bookings() -> None:
    """Merge reads and FIFO GC work book their intervals; no host read comes to forget
    those that are over, so the die keeps only the last MAX_BOOKED."""
    t = timeline()
    for i in range(3 * MAX_BOOKED):
        t.read(0, i * 10_000, present=False)
        t.occupy(1, i * 10_000, 5_000)
    assert len(t._booked[0]) == len(t._booked[1]) == MAX_BOOKED
    assert t._booked[1][-1] == ((3 * MAX_BOOKED - 1) * 10_000, (3 * MAX_BOOKED - 1) * 10_000 + 5_000)


def test_gc_without_read_priority_holds_reads_for_all_of_its_work() -> None:
    # gc.read_priority false: GC work takes the die's timeline and a read queues behind
    # all of it (SkyByte's artifact: GC_IO commands advance the unit's next free time);
    # by default a read waits only for the operation in progress
    work_ns = 3 * (3000 + 80_000) + 1_000_000  # three on-die copies and the erase
    # with read priority: the rest of the operation in progress (the backlog is taken as
    # whole programs), then the read
    for read_priority, expect in ((True, work_ns % 80_000 + 3000), (False, work_ns + 3000)):
        ftl = make_ftl(n_dies=4)
        flash = FlashBackend(ftl, timeline(), gc_read_priority=read_priority)
        result = GcResult(die=0, block=0, moved=3)
        flash._account_gc(result, 0)
        assert flash.timeline.read(0, 0) == expect
        assert flash.timeline.read(1, 0) == 3000  # other dies are not held


def make_ftl(victim: str = "greedy", logical: int = 256, precondition: bool = False,
             placement: str = "write-pointer", n_dies: int = 2, unit: str = "die") -> PageFtl:
    return PageFtl(logical, n_dies=n_dies, pages_per_block=8, overprovisioning=0.25,
                   free_threshold=0.2, victim=GC_VICTIM_POLICIES.get(victim)(),
                   precondition=precondition, placement=PLACEMENTS.get(placement)(), unit=unit)


def check_ftl(ftl: PageFtl) -> None:
    mapped = np.flatnonzero(ftl.l2p >= 0)
    # every mapped page has exactly one physical page pointing back at it
    assert np.array_equal(ftl.p2l[ftl.l2p[mapped]], mapped)
    assert np.count_nonzero(ftl.p2l >= 0) == mapped.size
    per_block = np.bincount(np.flatnonzero(ftl.p2l >= 0) // ftl.pages_per_block,
                            minlength=ftl.valid.size)
    assert np.array_equal(per_block, ftl.valid)
    dies = ftl.l2p[mapped] // ftl.pages_per_die
    assert [ftl.die_of(lpn) for lpn in mapped.tolist()] == dies.tolist()
    if isinstance(ftl.placement, StripedPlacement):
        assert (dies == mapped % ftl.n_dies).all()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 255), min_size=1, max_size=1500),
       st.sampled_from(["greedy", "fifo"]), st.booleans(),
       st.sampled_from([*PLACEMENTS.names(), "line"]))
def test_no_mapping_lost_or_duplicated_through_gc(lpns, victim, precondition, placement) -> None:
    # "line": the artifact's line GC, which needs the write pointer
    unit = "line" if placement == "line" else "die"
    placement = "write-pointer" if unit == "line" else placement
    ftl = make_ftl(victim, precondition=precondition, placement=placement, n_dies=4, unit=unit)
    flash = FlashBackend(ftl, timeline())
    for i, lpn in enumerate(lpns):
        flash.program(lpn, i * 100)
    check_ftl(ftl)
    if precondition:
        assert (ftl.l2p >= 0).all()
    else:
        assert set(np.flatnonzero(ftl.l2p >= 0).tolist()) == set(lpns)
    c = flash.counters
    assert c.programs_host == len(lpns)
    assert c.reads_gc == c.programs_gc
    assert c.erases_gc == c.gc_runs * (ftl.n_dies if unit == "line" else 1)


def test_gc_runs_under_pressure_and_counts_write_amplification() -> None:
    ftl = make_ftl(precondition=True)
    flash = FlashBackend(ftl, timeline(channels=1))
    rng = np.random.default_rng(0)
    for i, lpn in enumerate(rng.integers(0, 256, 3000).tolist()):
        flash.program(lpn, i)
    counters = flash.counters.as_dict()
    assert counters["erases_gc"] > 0
    assert counters["write_amplification"] > 1.0
    assert all(ftl.free_blocks(d) >= 1 for d in range(ftl.n_dies))
    check_ftl(ftl)


def test_line_gc_collects_the_same_block_on_every_die_until_enough_lines_are_free() -> None:
    # SkyByte's artifact (bytefs_gc.cc): below 20 % free lines a pass collects lines,
    # fewest valid pages first, until 35 % are free (ours: at most as many lines as
    # were missing); their pages go where the write pointer puts them (any die), and
    # every die erases its block of the line
    ftl = make_ftl(n_dies=4, unit="line")  # 10 blocks a die: GC below 2 free lines, up to 4
    flash = FlashBackend(ftl, timeline())
    lines: list = []
    collect_line = ftl.collect_line

    def spy(skip=frozenset()):
        result = collect_line(skip)
        if result is not None:
            lines.append(result)
        return result

    ftl.collect_line = spy  # type: ignore[method-assign]
    passes: list[int] = []
    for i, lpn in enumerate(np.random.default_rng(1).integers(0, 128, 3000).tolist()):
        before, missing = len(lines), ftl.gc_stop_blocks - ftl.free_lines()
        flash.program(lpn, i * 1000)
        if len(lines) > before:
            passes.append(len(lines) - before)
            assert len(lines) - before <= missing + 1  # + 1: the program's own block opening
            assert ftl.free_lines() >= ftl.gc_threshold_blocks  # out of the trigger zone
    check_ftl(ftl)
    c = flash.counters
    assert lines and all(line.dies == [0, 1, 2, 3] for line in lines)
    assert c.gc_runs == len(lines) and c.erases_gc == 4 * len(lines)
    assert c.reads_gc == c.programs_gc == sum(line.moved for line in lines) > 0
    # a line's valid pages were re-placed over the dies by the write pointer
    moved = [line for line in lines if line.moved >= 4]
    assert moved and all(sum(1 for n in line.programmed_on if n) >= 3 for line in moved)
    assert max(passes) >= 2  # a pass takes several lines (2 -> 4 free)
    # every die keeps the same free blocks: the lines stay aligned
    assert len({tuple(sorted(ftl.free[d])) for d in range(4)}) == 1


def test_line_gc_spreads_its_work_over_every_die() -> None:
    # relocation reads on the line's dies, programs at the write pointer and an erase on
    # every die: each die gets at least its erase of background work, where per-die GC
    # loads only the die that ran short
    ftl = make_ftl(n_dies=4, unit="line")
    flash = FlashBackend(ftl, timeline())
    for lpn in np.random.default_rng(2).integers(0, 128, 3000).tolist():
        flash.program(lpn, 0)
        if flash.counters.erases_gc:
            break
    assert flash.counters.erases_gc == 4 * flash.counters.gc_runs > 0
    assert min(flash.timeline.backlog_ns(d, 0) for d in range(4)) >= flash.counters.gc_runs * 1_000_000


def test_the_write_pointer_spreads_programs_over_the_dies_whatever_their_pages() -> None:
    # as SkyByte's artifact (get_new_page): programs take the dies in turn, and a page
    # is read from the die it was last written to; striping keeps page p on die p % 4
    pages = [0, 4, 8, 12, 4, 0]  # all on die 0 under striping
    pointer, striped = make_ftl(n_dies=4), make_ftl(n_dies=4, placement="striped")
    assert [pointer.program(p) for p in pages] == [0, 1, 2, 3, 0, 1]
    assert [striped.program(p) for p in pages] == [0] * 6
    assert [pointer.die_of(p) for p in (0, 4, 8, 12, 16, 17)] == [1, 0, 2, 3, 0, 1]
    flash = FlashBackend(pointer, timeline(channels=2))  # 4 dies: 2 channels x 2
    assert flash.read(8, 0) == 3000 and flash.read(12, 0) == 3000  # dies 2 and 3 in parallel
    assert flash.read(16, 0) == 3000 and flash.read(0, 0) == 3000  # never written: die 0; page 0: die 1
    check_ftl(pointer)
    check_ftl(striped)


def test_the_write_pointer_skips_a_failed_die_and_a_die_at_its_last_free_block() -> None:
    ftl = make_ftl(n_dies=4)
    ftl.fail([1])
    assert [ftl.program(p) for p in range(6)] == [0, 2, 3, 0, 2, 3]
    ftl.restore([1])
    while ftl.has_room(2):  # fill die 2 down to the free block GC relocates into
        ftl._place(255, 2)
    assert len(ftl.free[2]) == 1
    assert [ftl.program(p) for p in range(100, 106)] == [0, 1, 3, 0, 1, 3]
    check_ftl(ftl)


def test_greedy_picks_fewest_valid_fifo_picks_oldest() -> None:
    valid = np.array([5, 1, 3, 0])
    opened = np.array([2, 3, 1, 0])
    closed = np.array([True, True, True, False])
    assert GC_VICTIM_POLICIES.get("greedy")().choose(valid, opened, closed) == 1
    assert GC_VICTIM_POLICIES.get("fifo")().choose(valid, opened, closed) == 2


def test_backend_counts_host_reads_and_queueing() -> None:
    flash = FlashBackend(make_ftl(), timeline(channels=1))
    assert flash.read(0, 0) == 3000
    assert flash.read(2, 0) == 6000  # lpn 2 is on die 0 too
    assert flash.counters.reads_host == 2
    assert flash.counters.host_read_queue_ns == 3000


def test_the_profile_composes_the_gc_unit_and_its_read_priority() -> None:
    from cxlssd.firmware.controller import Controller
    from cxlssd.firmware.profile import load_profile

    default = Controller.from_profile(load_profile("skybyte-full")).flash
    assert default is not None and default.ftl.unit == "die" and default.gc_read_priority
    artifact = Controller.from_profile(
        load_profile("skybyte-full", ["gc.unit=line", "gc.read_priority=false", "gc.stop_threshold=0.4"])
    ).flash
    assert artifact is not None and artifact.ftl.unit == "line" and not artifact.gc_read_priority
    assert artifact.ftl.gc_stop_blocks == int(np.ceil(0.4 * artifact.ftl.blocks_per_die))

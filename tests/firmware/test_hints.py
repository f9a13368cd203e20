"""The transfer engine and the lifetime hints (firmware/hints.py, docs/offload.md): a page move
bracketed by XFER markers is taken off the vCPU's clock and run by the engine, overlapping the
vCPU's work; XFER_WAIT charges only what is left; NEED hints fill the data cache from flash in
the background, DEAD hints drop pages from it. The guest side is tests/guest/test_offload.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cxlssd.abi.protocol import DAEMON_OFF, DAEMON_ON, SWITCH_KERNEL, XFER_BY_OS
from cxlssd.firmware.controller import Controller
from cxlssd.firmware.hints import HINT_DEAD, HINT_NEED, MAX_UNWAITED_TRANSFERS, EngineConfig
from cxlssd.firmware.live_switching import guest_driven
from cxlssd.firmware.profile import load_profile
from cxlssd.firmware.replay import replay_file
from cxlssd.firmware.request import FLAG_HOST, FLAG_POSTED, FLAG_QUERY, REQUEST_DTYPE, MarkerCmd, Op
from cxlssd.firmware.stream import StreamServer
from cxlssd.firmware.trace import TraceWriter

HIT_NS = 158
READ_NS = 3000
DIES = 16
CFG = EngineConfig()
DAEMON, PROGRAM = 70, 90  # guest threads (pids, as the kernel helper tags requests)


def host_ns(pages: int) -> int:
    return CFG.host_ns_per_transfer + pages * CFG.host_ns_per_page


def record(time_ns: int, addr: int, op: int = Op.READ, flags: int = 0, thread: int = 0) -> np.ndarray:
    r = np.zeros(1, dtype=REQUEST_DTYPE)
    r[0] = (time_ns, addr, 0, 0 if op == Op.MARKER else 64, op, flags, thread)
    return r


def mark(time_ns: int, cmd: int, arg: int = 0, thread: int = 0) -> np.ndarray:
    return record(time_ns, arg, Op.MARKER, cmd, thread)


def hint(time_ns: int, kind: int, first_page: int, pages: int, op: int = 0) -> np.ndarray:
    return mark(time_ns, MarkerCmd.HINT, kind << 56 | op << 48 | pages << 32 | first_page)


def server(design: str = "base-cssd", *overrides: str) -> StreamServer:
    controller = Controller.from_profile(load_profile(design, list(overrides)))
    return StreamServer(controller, switching=guest_driven(controller))


def promotion(begin_ns: int, ticket: int, pages: list[int], copy_ns: int, thread: int = 0,
              by_os: bool = False, report: bool = True) -> np.ndarray:
    """A promotion move as the guest makes it: the kernel's copy reads every line of each page
    (over ``copy_ns`` of local time), the library (``by_os``: the promotion daemon, one look
    at the mailbox) reports each page (unless not ``report``); every record is ``thread``'s."""
    parts = [mark(begin_ns, MarkerCmd.XFER_BEGIN, (XFER_BY_OS if by_os else 0) | ticket << 1, thread)]
    step = copy_ns // (len(pages) * 64 + 1)
    t = begin_ns
    for page in pages:
        for line in range(64):
            t += step
            parts.append(record(t, page << 12 | line << 6, thread=thread))
        if report:
            parts.append(mark(t, MarkerCmd.PROMOTED, page, thread))
    parts.append(mark(begin_ns + copy_ns, MarkerCmd.XFER_END, ticket, thread))
    return np.concatenate(parts)


def stall(s: StreamServer) -> int:
    return s.controller.vcpu_stall_ns(0)


def test_a_bracketed_move_costs_the_vcpu_only_its_remap_and_the_engine_its_transfer() -> None:
    s = server()
    pages = list(range(100, 108))  # 8 cold pages: 8 flash reads
    s.serve(promotion(1000, 1, pages, copy_ns=500_000))
    # the vCPU's clock at the end is its clock at the begin + the remap of 8 pages
    assert 1000 + 500_000 + stall(s) == 1000 + host_ns(8)
    t = s.transfers.counters
    assert (t.transfers, t.promotions, t.pages, t.flash_pages) == (1, 1, 8, 8)
    link_ns = 8 * 4096 * 10**9 // CFG.link_bytes_per_s
    assert t.busy_ns == HIT_NS + READ_NS + max(link_ns, 8 * READ_NS // DIES)
    assert t.guest_copy_ns == 500_000  # the copy's instructions: its device work is the engine's
    assert t.bytes == 8 * 4096


def test_the_copys_device_work_is_booked_from_the_begin_not_along_the_time_taken_back() -> None:
    """The engine reads every page from the bracket's begin, so a read of a copied page right
    after the bracket is a plain SSD-DRAM hit. Served at the vCPU's own times, the last
    page's fill was booked ~440 us later than that: the read waited for it, and the time
    taken back from the vCPU came back as stall. (The pages are not reported: a promoted
    page leaves the data cache.)"""
    s = server()
    s.serve(promotion(1000, 1, list(range(100, 108)), copy_ns=500_000, report=False))
    assert stall(s) == host_ns(0) - 500_000  # the vCPU's clock: begin + the bracket's remap
    before = stall(s)
    s.serve(record(1000 + 500_000 + 10_000, 107 << 12))  # 10 us after the begin, in the vCPU's time
    assert stall(s) - before == HIT_NS


def test_compute_after_the_move_overlaps_it_and_the_wait_charges_only_the_rest() -> None:
    s = server("base-cssd", "flash.preset=slc")  # 25 us reads: the engine takes longer than the CPU's part
    s.serve(promotion(0, 7, list(range(256)), copy_ns=1_000_000))
    busy = s.transfers.counters.busy_ns
    after_end = stall(s) + 1_000_000  # the vCPU's clock right after the bracket
    assert after_end == host_ns(256) < busy
    compute_ns = (busy - after_end) // 3  # the vCPU computes a third of what is left, then needs it
    s.serve(mark(1_000_000 + compute_ns, MarkerCmd.XFER_WAIT, 7))
    t = s.transfers.counters
    assert t.waits == 1 and t.waited_busy_ns == busy
    assert t.wait_ns == busy - after_end - compute_ns
    assert 1_000_000 + compute_ns + stall(s) == busy  # ready exactly when the transfer is done
    # waiting again (or for a ticket never issued) charges nothing
    before = stall(s)
    s.serve(mark(1_100_000, MarkerCmd.XFER_WAIT, 7))
    assert stall(s) == before


def test_a_wait_after_enough_compute_costs_nothing() -> None:
    s = server()
    s.serve(promotion(0, 1, [5, 6], copy_ns=10_000))
    before = stall(s)
    s.serve(mark(10_000_000, MarkerCmd.XFER_WAIT, 1))
    assert stall(s) == before and s.transfers.counters.wait_ns == 0


def test_the_engine_runs_one_transfer_at_a_time_in_issue_order() -> None:
    s = server("base-cssd", "flash.preset=slc")  # the first transfer outlasts the CPU's part
    s.serve(promotion(0, 1, list(range(0, 32)), copy_ns=1000))
    first_busy = s.transfers.counters.busy_ns
    s.serve(promotion(1000, 2, list(range(32, 64)), copy_ns=1000))
    second_busy = s.transfers.counters.busy_ns - first_busy
    clock = 1000 + stall(s)
    s.serve(mark(1000, MarkerCmd.XFER_WAIT, 2))
    # the second transfer started when the first was done
    assert clock + s.transfers.counters.wait_ns == first_busy + second_busy


def test_a_long_delay_query_inside_a_bracket_is_the_engines_read_and_never_long() -> None:
    """A queried read of the copy (the kernel helper asks before a page not cached): the engine
    reads it, posted, so the answer is not a long delay and the vCPU is charged nothing for it;
    outside a bracket the same read of a cold page is a long delay."""
    answers: list[bool] = []
    s = server("skybyte-c")
    s.on_query = lambda vcpu, ticket, long_delay, ready_ns: answers.append(long_delay)
    s.serve(np.concatenate([mark(1000, MarkerCmd.XFER_BEGIN, 1 << 1),
                            record(2000, 100 << 12, flags=FLAG_QUERY),
                            mark(1000 + 500_000, MarkerCmd.XFER_END, 1)]))
    assert answers == [False]
    assert stall(s) == host_ns(0) - 500_000  # the bracket's remap, nothing for the read
    s.serve(record(600_000, 200 << 12, flags=FLAG_QUERY))
    assert answers == [False, True]


def test_a_demotion_bracket_is_a_transfer_to_the_device_nobody_waits_for() -> None:
    s = server()
    s.serve(promotion(0, 1, [9], copy_ns=1000))
    s.serve(np.concatenate([mark(2000, MarkerCmd.XFER_BEGIN, 2 << 1 | 1), mark(2500, MarkerCmd.DEMOTED, 9),
                            mark(3000, MarkerCmd.XFER_END, 2)]))
    t = s.transfers.counters
    assert (t.transfers, t.promotions, t.demotions, t.pages) == (2, 1, 1, 2)
    assert t.waits == 0


def test_need_hints_fill_the_data_cache_in_the_background() -> None:
    s = server()
    s.serve(hint(1000, HINT_NEED, 200, 16))
    assert stall(s) == 0  # no guest vCPU pays for the prefetch
    t = s.transfers.counters
    assert t.need_pages == t.need_prefetched == 16
    # long after: the pages are SSD-DRAM hits
    s.serve(record(10_000_000, 200 << 12))
    assert stall(s) == HIT_NS
    # hinted again: nothing to read
    s.serve(hint(10_000_100, HINT_NEED, 200, 16))
    assert s.transfers.counters.need_prefetched == 16


def test_a_read_right_after_a_need_hint_waits_for_the_fill_in_flight() -> None:
    s = server()
    s.serve(np.concatenate([hint(1000, HINT_NEED, 300, 1), record(1500, 300 << 12)]))
    assert HIT_NS < stall(s) < HIT_NS + READ_NS


def test_dead_hints_drop_dirty_pages_without_writing_them_back() -> None:
    s = server()
    s.serve(np.concatenate([record(1000, 400 << 12, Op.WRITE), record(20_000, 401 << 12)]))
    s.serve(hint(50_000, HINT_DEAD, 400, 3))
    t = s.transfers.counters
    assert (t.dead_pages, t.dead_dropped, t.dead_dirty_dropped) == (3, 2, 1)
    assert s.controller.cache is not None and s.controller.cache.lookup(400) < 0


@pytest.mark.parametrize("design", ["dram-only", "skybyte-full"])
def test_hints_and_transfers_are_harmless_on_every_kind_of_device(design: str) -> None:
    s = server(design)
    s.serve(np.concatenate([hint(0, HINT_NEED, 0, 4), hint(0, HINT_DEAD, 0, 4),
                            promotion(10, 1, [1, 2], copy_ns=100), mark(200, MarkerCmd.XFER_WAIT, 1),
                            hint(300, 9, 0, 1)]))
    assert s.transfers.counters.transfers == 1


def test_the_transfer_counters_are_in_the_roi_results_and_replay_identically(tmp_path: Path) -> None:
    stream = np.concatenate([mark(0, MarkerCmd.ROI_BEGIN, 1), hint(0, HINT_NEED, 500, 8),
                             promotion(10, 1, list(range(500, 508)), copy_ns=50_000),
                             mark(60_000, MarkerCmd.XFER_WAIT, 1), hint(70_000, HINT_DEAD, 600, 2),
                             mark(80_000, MarkerCmd.ROI_END, 1)])
    s = server()
    s.serve(stream)
    (roi,) = s.results
    transfers = roi["device"]["transfers"]
    assert transfers["transfers"] == 1 and transfers["pages"] == 8 and transfers["need_prefetched"] == 8
    assert transfers["flash_pages"] == 0  # the hint had brought them into SSD DRAM
    assert roi["modelled_ns"] == 80_000 + stall(s)
    trace = tmp_path / "t.trace"
    with TraceWriter(trace, metadata={"guest_driven": True}) as writer:
        writer.write(stream)
    replayed = replay_file(trace, load_profile("base-cssd"))
    assert replayed["rois"][0]["device"]["transfers"] == transfers
    assert replayed["rois"][0]["modelled_ns"] == roi["modelled_ns"]


def test_transfers_never_waited_for_do_not_grow_the_firmwares_memory() -> None:
    """Tickets are the guest's: a program that brackets moves and never waits keeps
    only the newest MAX_UNWAITED_TRANSFERS answers in the firmware."""
    s = server()
    brackets = [np.concatenate([mark(10 * t, MarkerCmd.XFER_BEGIN, t << 1),
                                mark(10 * t + 5, MarkerCmd.XFER_END, t)])
                for t in range(MAX_UNWAITED_TRANSFERS + 10)]
    s.serve(np.concatenate(brackets))
    assert s.transfers.counters.transfers == MAX_UNWAITED_TRANSFERS + 10
    s.serve(mark(10**9, MarkerCmd.XFER_WAIT, 0))  # forgotten: ignored, nothing charged
    s.serve(mark(10**9, MarkerCmd.XFER_WAIT, MAX_UNWAITED_TRANSFERS + 9))  # kept
    assert s.transfers.counters.waits == 1


def test_the_daemons_moves_cost_the_program_nothing_as_skybytes_promotion_thread() -> None:
    """A look of the promotion daemon (XFER_BY_OS): its work is taken back and, as evaluated,
    nothing is charged instead (SkyByte's promotion thread is the device's); the engine
    reads the pages, and nobody waits for them."""
    s = server()
    s.serve(promotion(1000, 1, list(range(100, 108)), copy_ns=500_000, thread=DAEMON, by_os=True))
    assert 1000 + 500_000 + stall(s) == 1000  # the vCPU's clock: back where the look began
    t = s.transfers.counters
    assert (t.os_looks, t.os_pages, t.os_flash_pages) == (1, 8, 8)
    assert (t.os_taken_back_ns, t.os_host_ns) == (500_000, 0)
    assert t.os_busy_ns > 0 and (t.transfers, t.pages, t.guest_copy_ns) == (0, 0, 0)
    s.serve(mark(600_000, MarkerCmd.XFER_WAIT, 1, DAEMON))  # not a transfer anyone waits for
    assert t.waits == 0
    # promoted, the pages left the data cache (SkyByte: do_promotion_evict)
    assert not any(s.controller.cached(page) for page in range(100, 108))


def test_the_daemons_cpu_part_is_a_knob_and_an_empty_look_costs_nothing() -> None:
    s = server("base-cssd", "migration.move_host_ns_per_batch=3000", "migration.move_host_ns_per_page=500")
    s.serve(promotion(0, 1, [5, 6], copy_ns=40_000, thread=DAEMON, by_os=True))
    assert 40_000 + stall(s) == 3000 + 2 * 500
    before = stall(s)
    s.serve(np.concatenate([mark(50_000, MarkerCmd.XFER_BEGIN, XFER_BY_OS | 2 << 1, DAEMON),
                            mark(58_000, MarkerCmd.XFER_END, 2, DAEMON)]))
    assert stall(s) - before == -8000 and s.transfers.counters.os_host_ns == 4000


def test_a_look_of_the_daemon_inside_a_programs_transfer_claims_only_its_own_work() -> None:
    """The daemon (a real-time thread) preempts a program inside the program's bracket: each
    bracket claims its thread's requests and reports, and the program's is not charged the
    daemon's CPU part (it is in its clock advance, and not its copy)."""
    s = server("base-cssd", "migration.move_host_ns_per_batch=3000", "migration.move_host_ns_per_page=500")
    program = promotion(0, 1, [100], copy_ns=50_000, thread=PROGRAM)
    first_half = np.flatnonzero(program["time_ns"] < 10_000)
    daemon = promotion(10_000, 5, [200], copy_ns=5_000, thread=DAEMON, by_os=True)
    s.serve(np.concatenate([program[first_half], daemon, program[first_half[-1] + 1:]]))
    t = s.transfers.counters
    assert (t.pages, t.flash_pages, t.os_pages, t.os_flash_pages) == (1, 1, 1, 1)
    assert t.guest_copy_ns == 50_000 - 5_000  # the program's own time in its bracket
    assert t.os_taken_back_ns == 5_000 and t.foreign_requests == 0
    assert 50_000 + stall(s) == host_ns(1) + 3000 + 500  # each bracket's CPU part, once


def test_another_threads_request_inside_a_bracket_is_its_own_and_counted() -> None:
    s = server()
    s.serve(np.concatenate([mark(0, MarkerCmd.XFER_BEGIN, XFER_BY_OS | 1 << 1, DAEMON),
                            record(100, 300 << 12, thread=PROGRAM)]))
    assert stall(s) == HIT_NS + READ_NS  # the program waits for its cold read
    assert s.transfers.counters.foreign_requests == 1


def test_what_the_program_runs_while_a_look_blocks_stays_on_its_clock() -> None:
    """move_pages(2) blocks inside a look (an RCU grace period): the kernel helper's DAEMON
    markers tell the firmware when the daemon leaves its CPU and gets it back. The program's
    time between them (its instructions and its read's stall) is not taken back with the
    daemon's, and its request there is not counted as foreign."""
    s = server()
    look = promotion(0, 1, [100], copy_ns=20_000, thread=DAEMON, by_os=True)
    cut = np.flatnonzero(look["time_ns"] >= 10_000)[0]  # halfway through the copy
    program = np.concatenate([
        mark(10_000, MarkerCmd.DAEMON, DAEMON_OFF, DAEMON),
        record(14_000, 300 << 12, thread=PROGRAM),  # a cold read: it stalls the vCPU
        mark(16_000, MarkerCmd.DAEMON, DAEMON_ON, DAEMON),
    ])
    # the program's 6 000 ns and the read's stall move the daemon's later records along
    rest = look[cut:].copy()
    rest["time_ns"] += 6_000
    s.serve(np.concatenate([look[:cut], program, rest]))
    t = s.transfers.counters
    assert (t.os_switched_out, t.os_others_ns) == (1, 6_000 + HIT_NS + READ_NS)
    assert t.os_taken_back_ns == 20_000 and t.foreign_requests == 0
    # the vCPU's clock at the look's end: the program's part stays, the daemon's is gone
    assert 20_000 + 6_000 + stall(s) == 6_000 + HIT_NS + READ_NS


def test_a_program_parked_while_a_look_is_out_waits_only_for_its_own_read() -> None:
    """As traced in skybyte-full's radix (2026-12-07): the daemon leaves its CPU halfway
    through a look, the program runs and parks on a long read (the kernel helper's switch),
    the daemon finishes the look and leaves, the program resumes. The daemon's first half is
    taken back when it leaves, so the read is timed without it and the switch hides the read.
    Taken back only at the look's end, the first half stayed on the clock the read was timed
    on and came off before the resume: the program waited for it again (the trace's 38
    switches hid -0.62 ms)."""
    s = server("skybyte-full")
    look = promotion(0, 1, [100], copy_ns=20_000, thread=DAEMON, by_os=True)
    cut = np.flatnonzero(look["time_ns"] >= 10_000)[0]  # halfway through the copy
    program = np.concatenate([
        mark(10_000, MarkerCmd.DAEMON, DAEMON_OFF, DAEMON),
        record(10_500, 300 << 12, flags=FLAG_QUERY, thread=PROGRAM),  # a cold read: long
        mark(11_000, MarkerCmd.SWITCH, SWITCH_KERNEL, PROGRAM),
        mark(11_500, MarkerCmd.DAEMON, DAEMON_ON, DAEMON),
    ])
    rest = look[cut:].copy()
    rest["time_ns"] += 1_500  # the program's time
    end = int(rest["time_ns"][-1])
    s.serve(np.concatenate([look[:cut], program, rest, mark(end + 500, MarkerCmd.DAEMON, DAEMON_OFF, DAEMON),
                            mark(end + 1_000, MarkerCmd.RESUME, 1, PROGRAM)]))
    os, t = s.switching.counters, s.transfers.counters
    assert os.long_delays == os.kernel_switches == os.resumes == 1
    assert t.os_switched_out == 1 and t.os_taken_back_ns == 20_000 and t.os_outside_looks_ns == 500
    # the read was issued 500 ns into the program's time; at its resume the clock holds the
    # program's 1 500 + 500 ns and the move's CPU part (the daemon's work is gone)
    latency_ns = os.hidden_ns + os.residual_wait_ns
    assert latency_ns == HIT_NS + READ_NS
    assert os.residual_wait_ns == max(0, 500 + latency_ns - (2_000 + t.os_host_ns)) and os.hidden_ns > 0


def test_another_threads_daemon_marker_changes_nothing() -> None:
    s = server()
    look = promotion(10_000, 1, [100], copy_ns=20_000, thread=DAEMON, by_os=True)
    s.serve(np.concatenate([look[:5], mark(12_000, MarkerCmd.DAEMON, DAEMON_OFF, PROGRAM), look[5:]]))
    t = s.transfers.counters
    assert (t.os_switched_out, t.os_others_ns, t.os_taken_back_ns) == (0, 0, 20_000)
    assert stall(s) == -20_000


def test_the_daemons_time_on_its_cpu_outside_its_looks_is_taken_back_too() -> None:
    """The daemon's wake-up (from the switch that gives it the CPU to its look), the gap
    between two looks and its way back to waiting (its last look's end to the switch that
    takes the CPU away) are the promotion thread's, not the program's: taken back as a
    look's work is; a write-back it causes there is the engine's (posted, at the span's
    start). The program's time before the daemon gets its CPU and after it leaves stays."""
    s = server()
    s.serve(record(500, 300 << 12, thread=PROGRAM))  # a cold read: the program's stall
    program_ns = stall(s)
    assert program_ns == HIT_NS + READ_NS
    first = promotion(11_000, 1, [100], copy_ns=20_000, thread=DAEMON, by_os=True)
    s.serve(np.concatenate([
        mark(10_000, MarkerCmd.DAEMON, DAEMON_ON, DAEMON),  # woken: 1 000 ns to its look
        first,
        record(31_100, 400 << 12, Op.WRITE, FLAG_POSTED, DAEMON),  # an LLC write-back it caused
        mark(31_335, MarkerCmd.XFER_BEGIN, XFER_BY_OS | 2 << 1, DAEMON),  # it looks again at once
        mark(31_375, MarkerCmd.XFER_END, 2, DAEMON),
        mark(32_211, MarkerCmd.DAEMON, DAEMON_OFF, DAEMON),  # back to wait
    ]))
    t = s.transfers.counters
    assert t.os_looks == 2 and t.os_taken_back_ns == 20_000 + 40
    assert t.os_outside_looks_ns == 1_000 + 335 + 836
    # the vCPU's clock when the program gets it back: where the daemon got it
    assert 32_211 + stall(s) == 10_000 + program_ns
    assert t.foreign_requests == 0
    before = stall(s)
    s.serve(record(33_000, 300 << 12 | 64, thread=PROGRAM))  # the program's, after: charged (a hit)
    assert stall(s) - before == HIT_NS


def test_without_daemon_markers_only_the_looks_are_taken_back() -> None:
    """Without the kernel helper nothing says when the daemon waits: the time between two
    looks may be anyone's, so it stays on the clock."""
    s = server()
    s.serve(np.concatenate([promotion(0, 1, [100], copy_ns=20_000, thread=DAEMON, by_os=True),
                            promotion(50_000, 2, [101], copy_ns=20_000, thread=DAEMON, by_os=True)]))
    t = s.transfers.counters
    assert (t.os_taken_back_ns, t.os_outside_looks_ns) == (40_000, 0)
    assert stall(s) == -40_000


def test_the_read_the_doorbell_interrupted_stays_the_programs() -> None:
    """The promotion doorbell interrupts the program at a device read; its long-delay answer
    is settled at the vCPU's next event, which is then the daemon's. The program still waits
    for that read in full (nothing else of it ran): only the daemon's own time is taken back."""
    s = server("skybyte-c")
    s.serve(record(500, 300 << 12, flags=FLAG_QUERY, thread=PROGRAM))  # a cold read
    assert s.switching.counters.long_delays == 1 and stall(s) == HIT_NS + READ_NS  # a wait until it switches
    s.serve(np.concatenate([
        mark(1_000, MarkerCmd.DAEMON, DAEMON_ON, DAEMON),
        promotion(2_000, 1, [100], copy_ns=5_000, thread=DAEMON, by_os=True),
        mark(7_836, MarkerCmd.DAEMON, DAEMON_OFF, DAEMON),
    ]))
    assert s.switching.counters.ignored == 1  # charged in full: nothing was switched to
    assert s.transfers.counters.os_outside_looks_ns == 1_000 + 836
    assert 7_836 + stall(s) == 1_000 + HIT_NS + READ_NS


def test_a_daemon_that_leaves_unmarked_claims_nothing_after() -> None:
    """On its way out the daemon closes the kernel helper's file before its last switch, so
    no DAEMON_OFF comes: the program's next request ends the span, nothing is taken back for
    it, and the program's requests stay the program's."""
    s = server()
    s.serve(mark(1_000, MarkerCmd.DAEMON, DAEMON_ON, DAEMON))
    s.serve(record(9_000, 300 << 12, thread=PROGRAM))
    assert stall(s) == HIT_NS + READ_NS and not s.transfers.brackets_open
    assert s.transfers.counters.os_outside_looks_ns == 0 and s.transfers.counters.foreign_requests == 0


def demotion_look(begin_ns: int, ticket: int, old_page: int, new_page: int, copy_ns: int) -> np.ndarray:
    """A demotion as the daemon makes it in a design without the write log: the kernel's copy
    stores every line of the page into its new device frame, and each LLC store miss reads
    the line for ownership (a device read, inside the look); the DEMOTED report names the
    page the firmware promoted."""
    parts = [mark(begin_ns, MarkerCmd.XFER_BEGIN, XFER_BY_OS | ticket << 1, DAEMON)]
    for line in range(64):
        parts.append(record(begin_ns + (line + 1) * copy_ns // 66, new_page << 12 | line << 6, thread=DAEMON))
    parts.append(mark(begin_ns + 65 * copy_ns // 66, MarkerCmd.DEMOTED, old_page, DAEMON))
    parts.append(mark(begin_ns + copy_ns, MarkerCmd.XFER_END, ticket, DAEMON))
    return np.concatenate(parts)


@pytest.mark.parametrize("vectorize", [True, False])
def test_a_pages_move_does_not_count_towards_its_promotion(vectorize: bool) -> None:
    """SkyByte's promotion thread moves pages inside the device: its copies are no host
    accesses and count towards no promotion (artifact, ftl.cc promotion_thread). In the
    guest the kernel's copy reaches the device: the look's reads of the new frame (the
    stores' reads for ownership) and, later, the LLC's write-backs of the lines it dirtied.
    Counted, they made the demoted page hot at once: promoted again, another demoted, and
    so on (a P design without the log moved pages without end, 2026-12-06)."""
    s = server("skybyte-p")
    s.controller.vectorize = vectorize
    threshold = s.controller.migration.threshold
    assert threshold < 64
    s.serve(demotion_look(1000, 1, old_page=7, new_page=300, copy_ns=50_000))
    # the lines written back later, by whichever thread runs when the LLC evicts them
    write_backs = [record(100_000 + 100 * line, 300 << 12 | line << 6, Op.WRITE, FLAG_POSTED, PROGRAM)
                   for line in range(64)]
    s.serve(np.concatenate(write_backs))
    assert 300 not in s.controller.pending_promotions().tolist()
    c = s.controller.counters
    assert c.move_requests == 128
    # past the data cache, as SkyByte's demotion: no fill for the ownership reads, one program
    assert not s.controller.cached(300) and c.cache_misses == 0
    assert (c.demotion_reads_unfilled, c.demotion_programs) == (64, 1)
    assert s.controller.flash.counters.programs_host == 1
    # the program's own accesses to the page count as any other's (the first fills it)
    s.serve(np.concatenate([record(200_000 + 300 * k, 300 << 12 | k << 6, thread=PROGRAM)
                            for k in range(threshold + 1)]))
    assert 300 in s.controller.pending_promotions().tolist()


@pytest.mark.parametrize("vectorize", [True, False])
def test_a_demotion_goes_past_the_data_cache_unless_its_frame_is_cached(vectorize: bool) -> None:
    """SkyByte writes a demoted page to flash past the SSD DRAM (artifact, ftl.cc
    promotion_thread: single_block_write) and evicts a promoted one from it
    (do_promotion_evict). A new frame the data cache already holds takes the demotion's
    lines there, as any write; another engine's copy (not the daemon's) reads its data."""
    s = server("skybyte-p")
    s.controller.vectorize = vectorize
    s.serve(record(500, 300 << 12, thread=PROGRAM))  # the new frame is cached
    s.serve(demotion_look(1000, 1, old_page=7, new_page=300, copy_ns=50_000))
    write_backs = [record(100_000 + 100 * line, 300 << 12 | line << 6, Op.WRITE, FLAG_POSTED, PROGRAM)
                   for line in range(64)]
    s.serve(np.concatenate(write_backs))
    c = s.controller.counters
    assert s.controller.cached(300) and c.cache_misses == 1
    assert (c.demotion_reads_unfilled, c.demotion_programs) == (0, 0)
    # the program's transfer engine (offload, not XFER_BY_OS) reads what it copies
    s.serve(promotion(200_000, 2, [400], copy_ns=10_000, thread=PROGRAM, report=False))
    assert s.controller.cached(400) and c.cache_misses == 2
    # a promoted page leaves the data cache
    s.serve(mark(300_000, MarkerCmd.PROMOTED, 300, DAEMON))
    assert not s.controller.cached(300)


@pytest.mark.parametrize("vectorize", [True, False])
def test_write_backs_left_behind_by_a_promotion_cost_the_device_nothing(vectorize: bool) -> None:
    """The LLC still holds dirty lines of a page the guest promoted (the kernel's copy read
    them there) and writes them back to the freed frame later. In SkyByte the page keeps its
    address and those lines land in its promoted copy in host DRAM; here they cost the
    device nothing and count as a promoted page's accesses, until the guest reuses the
    frame (any other request), which is then the device's again."""
    s = server("skybyte-p")
    s.controller.vectorize = vectorize
    c = s.controller.counters
    s.serve(record(500, 300 << 12, Op.WRITE, thread=PROGRAM))  # cached, dirty
    s.serve(mark(1_000, MarkerCmd.PROMOTED, 300, DAEMON))
    s.serve(np.concatenate([record(2_000 + line, 300 << 12 | line << 6, Op.WRITE, FLAG_POSTED, PROGRAM)
                            for line in range(4)]))
    assert c.left_behind_writes == 4 and c.served["promoted"] == 4
    assert not s.controller.cached(300) and c.cache_misses == 1
    before = stall(s)
    s.serve(record(3_000, 300 << 12 | 5 << 6, thread=PROGRAM))  # the frame's new owner reads it
    assert c.cache_misses == 2 and stall(s) - before > HIT_NS
    s.serve(record(4_000, 300 << 12 | 6 << 6, Op.WRITE, FLAG_POSTED, PROGRAM))
    assert c.left_behind_writes == 4 and s.controller.cached(300)


@pytest.mark.parametrize("vectorize", [True, False])
def test_a_demotions_reads_of_host_dram_are_no_accesses_of_the_promoted_page(vectorize: bool) -> None:
    """SkyByte's promotion thread copies a demoted page inside the device, past its access
    counting (artifact, ftl.cc: only ``byte_issue`` counts). In the guest the kernel's copy
    reads the page from host DRAM, and the plugin reports those LLC misses as the promoted
    page's (FLAG_HOST). Counted, a demotion's 64 reads made promoted pages look busy: the
    `skybyte` rule's share passed 75 %, the threshold fell to 1 and stayed there, and each
    demotion's reads kept it there (ycsb-b under skybyte-p, 2026-12-06: 1.44 M of the ROI's
    1.81 M host accesses were demotions' copies)."""
    s = server("skybyte-p")
    s.controller.vectorize = vectorize
    s.serve(promotion(1000, 1, [7], copy_ns=10_000, thread=DAEMON, by_os=True))
    assert s.controller.promoted_pages().tolist() == [7]
    program_reads = [record(100_000 + k, 7 << 12 | k << 6, flags=FLAG_HOST | FLAG_POSTED, thread=PROGRAM)
                     for k in range(3)]
    copy = [record(200_000 + 10 * k, 7 << 12 | k << 6, flags=FLAG_HOST | FLAG_POSTED, thread=DAEMON)
            for k in range(64)]
    s.serve(np.concatenate([
        mark(50_000, MarkerCmd.ROI_BEGIN, 9), *program_reads,
        mark(199_000, MarkerCmd.XFER_BEGIN, XFER_BY_OS | 2 << 1, DAEMON), *copy,
        *[record(201_000 + 10 * k, 300 << 12 | k << 6, thread=DAEMON) for k in range(64)],
        mark(202_000, MarkerCmd.DEMOTED, 7, DAEMON), mark(203_000, MarkerCmd.XFER_END, 2, DAEMON),
        record(300_000, 500 << 12, thread=PROGRAM), mark(400_000, MarkerCmd.ROI_END, 1 << 16 | 9),
    ]))
    c = s.controller.counters
    assert (c.host_accesses, c.move_host_accesses) == (3 + 64, 64)
    (roi,) = s.results
    # the program's accesses: three to the promoted page, one device read
    assert roi["promoted_share"] == pytest.approx(3 / 4)
    assert roi["device"]["model"]["move_host_accesses"] == 64


def test_host_accesses_past_the_end_of_a_window_go_on_into_the_next() -> None:
    """Host accesses come in bulk (a chunk of the ring at a time): a bulk longer than the
    rest of the migration window ends it at its size and counts the rest in the next,
    so no window's promoted share exceeds 1 (it reached 1.37 on average, 2026-12-06)."""
    c = Controller.from_profile(load_profile("skybyte-p", ["migration.policy=fixed"]))
    assert c.migration is not None
    window = c.migration.window_accesses
    c.count_host_accesses(np.full(2 * window + window // 2, 7, dtype=np.int64))
    assert [share for _, share in c.migration.history] == [1.0, 1.0]
    c.count_host_accesses(np.full(window // 2, 7, dtype=np.int64))
    assert [share for _, share in c.migration.history] == [1.0, 1.0, 1.0]


def test_write_backs_a_look_evicts_count_in_no_window() -> None:
    """The window's promoted share counts the program's accesses: a write-back the daemon's
    copy evicts from the LLC inside a look is the move's, left behind in host DRAM but
    counted neither as an access nor as a promoted page's (before, such write-backs made
    windows' shares 3.5, 2026-12-06)."""
    s = server("skybyte-p", "migration.policy=fixed", "migration.window_accesses=4")
    mig = s.controller.migration
    assert mig is not None
    s.serve(promotion(1000, 1, [7], copy_ns=10_000, thread=DAEMON, by_os=True))
    evicted = [record(20_100 + 10 * k, 7 << 12 | k << 6, Op.WRITE, FLAG_POSTED, DAEMON) for k in range(8)]
    s.serve(np.concatenate([
        mark(20_000, MarkerCmd.XFER_BEGIN, XFER_BY_OS | 2 << 1, DAEMON), *evicted,
        mark(21_000, MarkerCmd.XFER_END, 2, DAEMON),
        *[record(30_000 + 1000 * k, 500 << 12 | k << 6, thread=PROGRAM) for k in range(4)],
    ]))
    assert s.controller.counters.left_behind_writes == 8
    assert [share for _, share in mig.history] == [0.0]

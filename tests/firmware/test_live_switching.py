"""The guest-driven stream (issue 5), firmware side: long-delay queries settled by what the
guest did next, promotions carried out by the guest OS, and the pv page that carries both.
The real guest runs are in tests/platform/test_os_codesign.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cxlssd.abi import protocol, pv
from cxlssd.errors import ConfigError
from cxlssd.firmware.controller import Controller
from cxlssd.firmware.live_switching import guest_driven
from cxlssd.firmware.profile import load_profile
from cxlssd.firmware.replay import replay_file
from cxlssd.firmware.request import FLAG_HOST, FLAG_POSTED, FLAG_QUERY, REQUEST_DTYPE, MarkerCmd, Op
from cxlssd.firmware.serve import Mailbox
from cxlssd.firmware.stream import StreamServer
from cxlssd.firmware.synth import SynthSpec, synthesize
from cxlssd.firmware.trace import TraceWriter

# An SSD-DRAM hit (SkyByte's 158 ns total), and a cold flash read: that path + the flash
# read (the default ULL NAND)
HIT_NS = 158
FLASH_NS = HIT_NS + 3000
SWITCH_NS = 1300


def record(time_ns: int, addr: int, op: int = Op.READ, flags: int = 0, vcpu: int = 0) -> np.ndarray:
    r = np.zeros(1, dtype=REQUEST_DTYPE)
    r[0] = (time_ns, addr, vcpu, 0 if op == Op.MARKER else 64, op, flags, 0)
    return r


def query(time_ns: int, page: int) -> np.ndarray:
    return record(time_ns, page << 12, flags=FLAG_QUERY)


def mark(time_ns: int, cmd: int, arg: int = 0) -> np.ndarray:
    return record(time_ns, arg, Op.MARKER, cmd)


def server(design: str, *overrides: str) -> tuple[StreamServer, list[tuple[int, int, bool, int]]]:
    controller = Controller.from_profile(load_profile(design, list(overrides)))
    answers: list[tuple[int, int, bool, int]] = []
    s = StreamServer(controller, switching=guest_driven(controller),
                     on_query=lambda *answer: answers.append(answer))
    return s, answers


def stall(s: StreamServer) -> int:
    return s.controller.vcpu_stall_ns(0)


def test_a_long_delay_switched_away_from_costs_the_switch_and_what_is_left() -> None:
    s, answers = server("skybyte-c")
    s.serve(query(1000, 5))
    assert answers == [(0, 1, True, 1000 + FLASH_NS)]
    assert stall(s) == FLASH_NS  # charged as a wait until the guest switches away
    s.serve(mark(1010, MarkerCmd.SWITCH))
    assert stall(s) == SWITCH_NS
    # another task ran 1 us of work, then the first resumes: 1010 + 1300 + 1000 local+stall
    s.serve(mark(2010, MarkerCmd.RESUME, 1))
    left = 1000 + FLASH_NS - (2010 + SWITCH_NS)
    assert stall(s) == SWITCH_NS + left
    os = s.switching.counter_dict()
    assert os["switches"] == os["resumes"] == os["long_delays"] == 1
    assert os["hidden_ns"] == FLASH_NS - left and os["residual_wait_ns"] == left


def test_a_task_that_resumes_after_the_data_is_there_waits_nothing() -> None:
    s, _ = server("skybyte-c")
    s.serve(np.concatenate([query(0, 5), mark(5, MarkerCmd.SWITCH), mark(10_000, MarkerCmd.RESUME, 1)]))
    assert stall(s) == SWITCH_NS
    assert s.switching.counters.hidden_ns == FLASH_NS


def test_a_kernel_switch_costs_its_instructions_not_the_switch_cost() -> None:
    """The guest kernel helper's SWITCH (transparent switching): the switch's cost is the
    kernel's own instructions, already on the vCPU's clock; the residual is charged as for
    the runtime's tasks."""
    s, answers = server("skybyte-c")
    s.serve(np.concatenate([query(1000, 5), mark(1010, MarkerCmd.SWITCH, protocol.SWITCH_KERNEL)]))
    assert answers == [(0, 1, True, 1000 + FLASH_NS)] and stall(s) == 0  # the switch took it back
    s.serve(mark(3000, MarkerCmd.RESUME, 1))
    left = 1000 + FLASH_NS - 3000
    assert stall(s) == left
    os = s.switching.counter_dict()
    assert os["kernel_switches"] == os["resumes"] == 1 and os["switches"] == os["switch_cost_ns"] == 0
    assert os["hidden_ns"] == FLASH_NS - left and os["parked"] == 0


def test_the_data_cache_publishes_its_pages_while_the_context_lasts(tmp_path: Path) -> None:
    """The cache map the plugin reads under transparent switching: a page's slot while it is
    cached, -1 once evicted, and -1 everywhere after the firmware is done."""
    s, _ = server("skybyte-c", "ssd_dram.size_bytes=64KiB", "cache.ways=16")
    cache = s.controller.cache
    assert cache is not None
    path = tmp_path / "cachemap"
    path.write_bytes(b"\xff" * 4 * (len(cache.slot_of_page) + 3))
    with cache.published(path):
        s.serve(np.concatenate([record(page * 10_000, page << 12) for page in range(40)]))
        shown = np.fromfile(path, dtype=np.int32)
        assert (shown[:40] >= 0).sum() == 16 and (shown[24:40] >= 0).all()  # the last 16 stay
        assert (shown[40:] == -1).all()
    assert (np.fromfile(path, dtype=np.int32) == -1).all()
    assert cache.lookup(39) >= 0  # the cache keeps its state


def test_a_cache_map_too_small_for_the_device_is_not_published(tmp_path: Path) -> None:
    s, _ = server("skybyte-c")
    assert s.controller.cache is not None
    path = tmp_path / "cachemap"
    path.write_bytes(b"\xff" * 64)
    with s.controller.cache.published(path):
        s.serve(record(0, 3 << 12))
        assert (np.fromfile(path, dtype=np.int32) == -1).all()
    assert s.controller.cache.lookup(3) >= 0


def test_a_long_delay_not_switched_away_from_costs_the_full_latency() -> None:
    s, _ = server("skybyte-c")
    s.serve(np.concatenate([query(0, 5), mark(10, MarkerCmd.RESUME, 1)]))  # no other task: no switch
    assert stall(s) == FLASH_NS
    assert s.switching.counters.ignored == 1 and s.switching.counters.hidden_ns == 0


def test_a_thread_that_does_not_switch_reads_the_rest_of_the_page_once_its_data_is_there() -> None:
    """No other thread: the helper returns, the thread re-issues its access and reads
    the page's next line. Both come after the data, as under base-cssd (+ the lines'
    hits); before, they were timed at the answer, waited for the fill in flight, and the
    settlement charged the flash read a second time (kvstore-a under skybyte-c, 0.75x)."""
    for design in ("skybyte-c", "base-cssd"):
        s, _ = server(design)
        s.serve(np.concatenate([query(1000, 5), record(1100, 5 << 12), record(1200, (5 << 12) + 64),
                                mark(1300, MarkerCmd.CLOCK)]))
        assert stall(s) == FLASH_NS + 2 * HIT_NS, design
        # skybyte-c: a long delay not switched away from; base-cssd: never a long delay
        assert s.switching.counters.ignored == (design == "skybyte-c"), design


def test_without_context_switching_a_query_is_an_ordinary_read() -> None:
    s, answers = server("base-cssd")
    s.serve(query(0, 5))
    assert answers == [(0, 1, False, 0)] and stall(s) == FLASH_NS


def test_a_short_query_is_not_a_long_delay() -> None:
    s, answers = server("skybyte-c")
    s.serve(np.concatenate([query(0, 5), query(10_000, 5)]))  # the second hits the data cache
    assert answers[1] == (0, 2, False, 0)
    assert stall(s) == FLASH_NS + HIT_NS


def test_guest_driven_promotion_leaves_the_device_and_counts_host_accesses() -> None:
    s, _ = server("skybyte-p", "migration.policy=fixed", "migration.initial_threshold=2")
    decisions: list[tuple[int, bool]] = []
    s.on_decision = lambda page, demote: decisions.append((page, demote))
    s.serve(np.concatenate([record(i * 10_000, 7 << 12) for i in range(3)]))  # miss, hit, hit
    assert decisions == [(7, False)]
    c = s.controller
    assert c.pending_promotions().tolist() == [7] and not c.promoted[7]
    s.serve(mark(40_000, MarkerCmd.PROMOTED, 7))
    # the device page was freed: a later request for it is the device's, not DRAM's
    assert c.promoted_pages().tolist() == [7] and not c.promoted[7]
    s.serve(np.concatenate([record(50_000 + i, (7 << 12) + 64 * i, flags=FLAG_HOST | FLAG_POSTED)
                            for i in range(5)]))
    assert c.counters.host_accesses == 5 and c.counters.requests == 3  # counted, not served
    s.serve(mark(60_000, MarkerCmd.DEMOTED, 7))
    assert c.promoted_pages().size == 0 and c.counters.demotions_applied == 1


def test_a_promotion_the_host_gave_up_can_be_decided_again() -> None:
    s, _ = server("skybyte-p", "migration.policy=fixed", "migration.initial_threshold=1")
    decisions: list[tuple[int, bool]] = []
    s.on_decision = lambda page, demote: decisions.append((page, demote))
    s.serve(np.concatenate([record(0, 3 << 12), record(10_000, 3 << 12)]))
    s.serve(mark(20_000, MarkerCmd.PROMOTE_FAILED, 3))
    s.serve(record(30_000, 3 << 12))
    assert decisions == [(3, False), (3, False)]
    assert s.controller.counters.promotions_failed == 1


def test_the_roi_reports_switches_and_the_share_promoted_pages_served() -> None:
    s, _ = server("skybyte-full")
    s.serve(np.concatenate([
        mark(0, 1, 9), query(10, 5), mark(20, MarkerCmd.SWITCH), mark(5000, MarkerCmd.RESUME, 1),
        record(5100, 9 << 12, flags=FLAG_HOST | FLAG_POSTED), mark(6000, 2, 1 << 16 | 9),
    ]))
    (roi,) = s.results
    assert roi["device"]["os"]["switches"] == 1 and roi["device"]["os"]["hidden_ns"] > 0
    assert roi["promoted_share"] == pytest.approx(1 / 2)  # one host access, one device read


def test_a_recorded_guest_driven_stream_replays_to_the_same_answers(tmp_path: Path) -> None:
    stream = np.concatenate([
        mark(0, 1, 9), query(10, 5), mark(20, MarkerCmd.SWITCH),
        query(1500, 77), mark(1510, MarkerCmd.SWITCH),
        mark(2000, MarkerCmd.RESUME, 1), mark(4000, MarkerCmd.SWITCH), mark(4100, MarkerCmd.RESUME, 2),
        mark(6000, 2, 1 << 16 | 9),
    ])
    live, _ = server("skybyte-c")
    live.serve(stream)
    trace = tmp_path / "run.trace"
    with TraceWriter(trace, metadata={"guest_driven": True}) as writer:
        writer.write(stream)
    replayed = replay_file(trace, load_profile("skybyte-c"))
    assert replayed["rois"][0]["modelled_ns"] == live.results[0]["modelled_ns"]
    assert replayed["counters"]["os"] == live.switching.counter_dict()


def test_profiles_reject_a_bad_threshold_and_an_unknown_scheduler() -> None:
    with pytest.raises(ConfigError, match="threshold_ns must be above 0"):
        load_profile("skybyte-c", ["context_switch.threshold_ns=0"])
    with pytest.raises(ConfigError, match=r"unknown context_switch\.scheduler 'lottery'.*round-robin"):
        load_profile("skybyte-c", ["context_switch.scheduler=lottery"])
    with pytest.raises(ConfigError, match="unknown migration policy 'hot'"):
        Controller.from_profile(load_profile("skybyte-p", ["migration.policy=hot"]))


def _pv_page(tmp_path: Path, slots: int, mailbox_entries: int) -> tuple[Path, np.ndarray, np.ndarray]:
    """A pv page whose header the plugin would have written (magic, vCPU slots, the mailbox
    at 2048 with ``mailbox_entries``): its path, its u64 words and its header's u32 fields."""
    path = tmp_path / "pv"
    pv.create_page(path)
    words = np.memmap(path, dtype=np.uint64, mode="r+")
    words[0] = protocol.PV_MAGIC
    header = words[:8].view(np.uint32)
    header[3], header[8], header[9] = slots, 2048, mailbox_entries
    return path, words, header


def test_the_pv_page_carries_features_answers_and_the_mailbox(tmp_path: Path) -> None:
    path, words, header = _pv_page(tmp_path, slots=2, mailbox_entries=4)
    with pv.PvPage(path) as page:
        page.set_features(protocol.FEATURE_CONTEXT_SWITCH | protocol.FEATURE_PROMOTION, "earliest-ready")
        assert header[6] == 3 and header[7] == 1
        page.answer_query(1, ticket=5, long_delay=True, ready_ns=1234)
        assert words[(64 + 64) // 8 + 2 : (64 + 64) // 8 + 5].tolist() == [1234, 1, 5]
        assert all(page.post(p, demote=p == 3, consumed=page.consumed()) for p in range(4))
        assert not page.post(9, demote=False, consumed=page.consumed())  # full until the guest moves its tail
        assert words[256 + 8 : 256 + 12].tolist() == [0, 1, 2, 3 | protocol.PV_DEMOTE]
        words[257] = 1
        assert not page.post(9, demote=False, consumed=0)  # room as the caller knew it
        assert page.post(9, demote=False, consumed=page.consumed()) and words[256 + 8] == 9
        words[258] = 5  # taken out (and not yet carried out): free too
        assert page.post(10, demote=False, consumed=9) and page.consumed() == 5
    assert header[6] == 0  # closed: the guest sees no firmware


def _decided(controller: Controller, pages: tuple[int, ...]) -> None:
    """``pages`` in the data cache and decided for promotion, as ``_count_hit`` leaves them."""
    assert controller.cache is not None
    for page in pages:
        controller.cache.insert(page, seq=page)
        controller.pending[page] = True
        controller._pending_count += 1


def test_the_mailbox_queues_promotions_when_full_and_sends_demotions_first(tmp_path: Path) -> None:
    path, words, _ = _pv_page(tmp_path, slots=1, mailbox_entries=2)
    controller = Controller.from_profile(load_profile("skybyte-p"))
    guest_driven(controller)
    _decided(controller, (1, 2, 3, 4))
    with pv.PvPage(path) as page:
        mailbox = Mailbox(page, controller)
        for device_page in (1, 2, 3, 4):
            mailbox.post(device_page, demote=False)
        # the third and fourth found the mailbox full: they wait, still pending (not decided again)
        assert mailbox.stats() == {"posted": 2, "promotions_waited": 2, "promotions_stale": 0,
                                   "promotions_waiting": 2, "demotions_waiting": 0,
                                   "discarded_at_start": 0}
        assert controller.pending_promotions().tolist() == [1, 2, 3, 4]
        mailbox.post(9, demote=True)  # a demotion waits for room too, ahead of the promotions
        assert mailbox.stats()["demotions_waiting"] == 1
        words[258] = 2  # the daemon took both out (its `taken`)...
        mailbox.flush()
        assert mailbox.stats()["demotions_waiting"] == 1  # ... unknown to the firmware until
        mailbox.reported()  # its first report, a point of the request stream
        assert mailbox.stats()["demotions_waiting"] == 0 and mailbox.stats()["promotions_waiting"] == 1
        assert words[256 + 8 : 256 + 10].tolist() == [9 | protocol.PV_DEMOTE, 3]  # in order


def test_a_waiting_promotion_whose_page_left_the_data_cache_is_given_up(tmp_path: Path) -> None:
    path, words, _ = _pv_page(tmp_path, slots=1, mailbox_entries=1)
    controller = Controller.from_profile(load_profile("skybyte-p"))
    guest_driven(controller)
    _decided(controller, (1, 2, 3))
    assert controller.cache is not None
    with pv.PvPage(path) as page:
        mailbox = Mailbox(page, controller)
        for device_page in (1, 2, 3):
            mailbox.post(device_page, demote=False)
        controller.cache.invalidate(2)  # evicted while it waited: its hits are history
        words[258] = 1
        mailbox.reported()
        # 2 is skipped (the host did not promote it: it may be decided again), 3 goes
        assert mailbox.stats()["promotions_stale"] == 1 and mailbox.stats()["posted"] == 2
        assert words[256 + 8] == 3 and controller.pending_promotions().tolist() == [1, 3]
        assert controller.counters.promotions_failed == 1


def test_a_new_firmware_discards_the_decisions_an_earlier_run_left_in_the_mailbox(tmp_path: Path) -> None:
    path, words, _ = _pv_page(tmp_path, slots=1, mailbox_entries=4)
    with pv.PvPage(path) as page:
        first_controller = Controller.from_profile(load_profile("skybyte-p"))
        _decided(first_controller, (5, 6, 7))
        first = Mailbox(page, first_controller)
        for device_page in (5, 6, 7):
            first.post(device_page, demote=False)
        words[258] = 1  # its daemon took one out, then its program ended
        controller = Controller.from_profile(load_profile("skybyte-p"))
        _decided(controller, (1, 2, 3, 4))
        second = Mailbox(page, controller)
        # the next run's daemon starts from an empty mailbox with all its room
        assert second.stats()["discarded_at_start"] == 2
        assert words[256] == words[257] == words[258] == 3 and page.consumed() == 3
        for device_page in (1, 2, 3, 4):
            second.post(device_page, demote=False)
        assert second.stats()["posted"] == 4 and second.stats()["promotions_waited"] == 0


def test_a_device_page_freed_by_a_promotion_can_be_reused_and_promoted_again() -> None:
    s, _ = server("skybyte-p", "migration.policy=fixed", "migration.initial_threshold=1")
    decisions: list[tuple[int, bool]] = []
    s.on_decision = lambda page, demote: decisions.append((page, demote))
    c = s.controller
    s.serve(np.concatenate([
        record(0, 4 << 12), record(10_000, 4 << 12), mark(20_000, MarkerCmd.PROMOTED, 4),
    ]))
    # the guest put another page at device page 4: it is hot too
    s.serve(np.concatenate([
        record(30_000, 4 << 12), record(40_000, 4 << 12), mark(50_000, MarkerCmd.PROMOTED, 4),
    ]))
    assert decisions == [(4, False), (4, False)]
    assert c.counters.promotions_applied == 2 and c.counter_dict()["migration"]["promoted_pages"] == 2
    s.serve(mark(60_000, MarkerCmd.DEMOTED, 4))
    assert c.counter_dict()["migration"]["promoted_pages"] == 1 and c.promoted_pages().tolist() == [4]


def test_guest_reports_of_pages_beyond_the_device_are_counted_and_ignored() -> None:
    """Any guest program can write markers: a page number past the device's end (or a
    promoted page's host access with one) is never an index into the model."""
    s, _ = server("skybyte-p", "migration.policy=fixed", "migration.initial_threshold=2")
    beyond = s.controller.device_pages
    for cmd in (MarkerCmd.PROMOTED, MarkerCmd.DEMOTED, MarkerCmd.PROMOTE_FAILED):
        s.serve(mark(1_000, cmd, beyond))
        s.serve(mark(2_000, cmd, (1 << 63) - 1))
    s.serve(record(3_000, beyond << 12, flags=FLAG_HOST | FLAG_POSTED))
    s.serve(record(4_000, 5 << 12))  # and the device goes on serving
    assert s.markers_rejected == 7 and s.summary()["markers_rejected"] == 7
    c = s.controller.counters
    assert c.requests == 1 and c.host_accesses == 0 and c.promotions_applied == 0


def test_the_answers_do_not_depend_on_where_the_ring_was_cut() -> None:
    """Where a chunk of the live ring ends is a moment of host time (how far the firmware
    lagged the guest): a stream of queries, switches, a look of the promotion daemon with
    its DAEMON markers and an ROI gives the same answers, counters and ROI results served
    whole, in fixed chunks or cut at random points (measured on a recorded tpcc run too:
    docs/live.md)."""
    requests = synthesize(SynthSpec(pattern="zipf", requests=20_000, footprint_bytes=32 << 20,
                                    zipf_theta=0.9, gap_ns=200, seed=3))
    reads = np.flatnonzero(requests["op"] == Op.READ)
    requests["flags"][reads[::7]] |= FLAG_QUERY
    t = requests["time_ns"]
    queries = reads[::7]
    _, first_touch = np.unique(requests["addr"] >> np.uint64(12), return_index=True)
    # a query of a page not read before (a flash read: long), parked, resumed 100 requests later
    ticket = int(np.flatnonzero(np.isin(queries, first_touch) & (queries > 1_000))[0]) + 1
    switched = int(queries[ticket - 1])

    def marker(at: int, cmd: int, arg: int = 0, thread: int = 0) -> np.ndarray:
        m = mark(at, cmd, arg)
        m["thread"] = thread
        return m

    look = int(t[12_000])
    stream = np.concatenate([
        marker(0, MarkerCmd.ROI_BEGIN, 1), requests[: switched + 1],
        marker(int(t[switched]), MarkerCmd.SWITCH, protocol.SWITCH_KERNEL),
        requests[switched + 1 : switched + 100],
        marker(int(t[switched + 99]), MarkerCmd.RESUME, ticket), requests[switched + 100 : 12_000],
        marker(look, MarkerCmd.DAEMON, protocol.DAEMON_ON, 7),
        marker(look + 1_000, MarkerCmd.XFER_BEGIN, protocol.XFER_BY_OS | 1 << 1, 7),
        marker(look + 2_000, MarkerCmd.PROMOTED, 3, 7), marker(look + 3_000, MarkerCmd.XFER_END, 1, 7),
        marker(look + 4_000, MarkerCmd.DAEMON, protocol.DAEMON_OFF, 7), requests[12_000:],
        marker(int(t[-1]) + 1, MarkerCmd.ROI_END, 1),
    ])
    stream["time_ns"][np.flatnonzero(stream["time_ns"] >= look)[5:]] += 4_000  # the daemon's time

    def serve(cuts: list[int]) -> dict[str, object]:
        s, answers = server("skybyte-full")
        for lo, hi in zip([0, *cuts], [*cuts, len(stream)], strict=True):
            s.serve(stream[lo:hi].copy())
        return {**s.summary(), "answers": answers}

    whole = serve([])
    counters = whole["counters"]
    assert isinstance(counters, dict) and whole["rois"]
    assert counters["transfers"]["os_looks"] == 1 and counters["transfers"]["os_outside_looks_ns"] == 2_000
    assert counters["os"]["long_delays"] > 0 and counters["os"]["resumes"] == 1
    rng = np.random.default_rng(5)
    assert serve(list(range(1000, len(stream), 1000))) == whole
    assert serve(sorted(rng.choice(np.arange(1, len(stream)), 2_000, replace=False).tolist())) == whole

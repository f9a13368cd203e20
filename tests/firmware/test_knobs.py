"""Firmware knobs: validated, applied to a controller, spikes and GC storms end on
the modelled clock, each knob changes the modelled latency of the requests it
affects (compared with the same requests on a controller without it); the
firmware process's control file hands over only complete lines."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cxlssd.errors import InputError
from cxlssd.firmware.controller import Controller
from cxlssd.firmware.flash import REBUILD_NS_PER_PAGE
from cxlssd.firmware.knobs import (
    DeviceShape,
    DieFault,
    FirmwareKnob,
    FlashLatency,
    FlushThrottle,
    GcStorm,
    KnobController,
    LatencySpike,
    LinkLatency,
    check_fits,
    knob_from_dict,
    knob_to_dict,
)
from cxlssd.firmware.profile import load_profile
from cxlssd.firmware.request import Op, make_requests
from cxlssd.firmware.serve import ControlFile

PAGE = 4096
LINE = 64
#: 64 MiB of preconditioned flash (every page mapped, so GC has blocks to move)
#: on 4 channels x 2 dies, 32-page blocks; a 1 MiB data cache (256 pages)
SMALL = {
    "device.capacity_bytes": "64MiB", "ssd_dram.size_bytes": "1MiB", "write_log.size_bytes": "128KiB",
    "flash.channels": 4, "flash.dies_per_channel": 2, "flash.pages_per_block": 32,
    "flash.precondition": True,
}


def controller() -> Controller:
    return Controller.from_profile(load_profile("base-cssd", {"device.capacity_bytes": 1 << 30}))


def miss_latency(c: Controller, page: int, time_ns: int) -> int:
    return int(c.submit(time_ns, page * PAGE)["latency_ns"])


def test_flash_and_link_latency_change_the_next_requests() -> None:
    c = controller()
    knobs = KnobController(c)
    before = miss_latency(c, 1, 0)
    knobs.apply(FlashLatency(read_ns=c.flash_timeline().read_ns + 10_000))
    assert miss_latency(c, 2, 10**7) == before + 10_000
    hit = int(c.submit(2 * 10**7, 2 * PAGE)["latency_ns"])
    knobs.apply(LinkLatency(extra_ns=500))
    assert int(c.submit(3 * 10**7, 2 * PAGE)["latency_ns"]) == hit + 500
    knobs.apply(LinkLatency(extra_ns=0))
    assert int(c.submit(4 * 10**7, 2 * PAGE)["latency_ns"]) == hit
    assert [entry["kind"] for entry in knobs.log] == ["flash-latency", "link-latency", "link-latency"]


def test_a_spike_lasts_its_modelled_duration_from_the_first_request_it_applies_to() -> None:
    c = controller()
    knobs = KnobController(c)
    c.submit(1_000, PAGE)
    hit = int(c.submit(2_000, PAGE)["latency_ns"])
    knobs.apply(LatencySpike(extra_ns=1_000, duration_ms=1.0))
    knobs.tick()  # no request yet under the spike: it has not started
    assert int(c.submit(5_000_000, PAGE)["latency_ns"]) == hit + 1_000
    knobs.tick()  # started at that request's start (5 ms + the stall so far), ends 1 ms later
    assert int(c.submit(5_500_000, PAGE)["latency_ns"]) == hit + 1_000
    knobs.tick()
    c.submit(6_100_000, PAGE)
    knobs.tick()  # past 6 ms: over
    assert int(c.submit(6_200_000, PAGE)["latency_ns"]) == hit
    start, end = knobs.log[-2], knobs.log[-1]
    assert start["kind"] == "latency-spike-start" and 5_000_000 <= start["at_ns"] < 5_010_000
    assert end["kind"] == "latency-spike-end" and end["at_ns"] >= start["at_ns"] + 1_000_000
    assert end["requests_during"] == 3


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"kind": "flash-latency"}, "needs at least one"),
        ({"kind": "flash-latency", "read_ns": 0}, "read_ns: 0 is out of range: give a whole number of ns"),
        ({"kind": "flash-latency", "read_ns": 2.5}, "read_ns: expected an integer, got 2.5"),
        ({"kind": "link-latency", "extra_ns": -1}, "extra_ns: -1 is out of range"),
        ({"kind": "latency-spike", "extra_ns": 100, "duration_ms": 0}, "duration_ms: 0.0 is out of range"),
        ({"kind": "latency-spike", "extra_ns": 100, "duration_ms": 5, "colour": 1},
         "latency-spike: unknown key 'colour'; allowed keys: duration_ms, extra_ns"),
        ({"kind": "gc-party"}, "not a firmware knob"),
        ({"kind": "gc-storm"}, "exactly one of --duration-ms"),
        ({"kind": "gc-storm", "duration_ms": 5, "blocks": 2}, "exactly one of --duration-ms"),
        ({"kind": "gc-storm", "blocks": 0}, "blocks: 0 is out of range: give 1.."),
        ({"kind": "gc-storm", "blocks": 1, "dies": []}, "non-empty list of die indexes"),
        ({"kind": "gc-storm", "blocks": 1, "dies": [0, -1]}, r"dies\[1\]: -1 is not an index"),
        ({"kind": "die-fault", "mode": "melt", "die": 0}, "mode: expected one of slow, fail, restore, got"),
        ({"kind": "die-fault", "mode": "fail"}, "exactly one of --die and --channel"),
        ({"kind": "die-fault", "mode": "fail", "die": 1, "channel": 0}, "exactly one of --die and --channel"),
        ({"kind": "die-fault", "mode": "slow", "die": 1}, "latency factor 1 < factor"),
        ({"kind": "die-fault", "mode": "slow", "die": 1, "factor": 1}, "latency factor 1 < factor"),
        ({"kind": "die-fault", "mode": "fail", "die": 1, "factor": 2}, "factor is for mode slow"),
        ({"kind": "die-fault", "mode": "restore", "channel": -2}, "channel: -2 is not an index"),
        ({"kind": "flush-throttle", "program_interval_ns": -5}, "program_interval_ns: -5 is out of range"),
    ],
)
def test_bad_knobs_are_clear_errors(raw: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message):
        knob_from_dict(raw)


def test_the_control_file_hands_over_complete_lines_and_skips_bad_ones(tmp_path: Path) -> None:
    path = tmp_path / "firmware.control"
    path.write_text('{"kind": "link-latency", "extra_ns": 5}\n{"kind": "nope"}\n{"kind": "link-lat')
    control = ControlFile(path)
    assert control.new_knobs() == [(LinkLatency(extra_ns=5), None)]
    with open(path, "a") as f:
        f.write('ency", "extra_ns": 7, "at_ms": 2.5}\n')
    assert control.new_knobs() == [(LinkLatency(extra_ns=7), 2.5)]
    assert control.new_knobs() == []


def test_scheduled_knobs_apply_at_their_modelled_time_after_the_first_request() -> None:
    c = controller()
    knobs = KnobController(c)
    knobs.schedule(LinkLatency(extra_ns=300), at_ms=2.0)
    c.submit(1_000_000, PAGE)
    knobs.tick()  # time 0 is this first request (1 ms): the knob is due at 3 ms
    hit = int(c.submit(2_000_000, PAGE)["latency_ns"])
    knobs.tick()
    c.submit(3_100_000, PAGE)
    knobs.tick()
    assert int(c.submit(3_200_000, PAGE)["latency_ns"]) == hit + 300
    with pytest.raises(InputError, match="at_ms"):
        knobs.schedule(LinkLatency(extra_ns=1), at_ms=-1)


# -- the behaviour knobs: each changes the modelled latency of what it affects ----------


class Twin:
    """The same requests, at the same times, on two controllers of one design: one
    with knobs (ticked before every request, as the firmware ticks before every
    chunk) and one without, so every difference is the knobs'."""

    def __init__(self, design: str = "base-cssd", **overrides: Any) -> None:
        profile = load_profile(design, {**SMALL, **{k.replace("__", "."): v for k, v in overrides.items()}})
        self.c = Controller.from_profile(profile)
        self.control = Controller.from_profile(profile)
        self.knobs = KnobController(self.c)
        self.t_ns = 0

    def run(
        self, addrs: Iterable[int], op: int = Op.READ, gap_ns: int = 100_000, quiet_ns: int = 10_000_000
    ) -> tuple[np.ndarray, np.ndarray]:
        """Latencies (with knobs, without) of one request per address, ``gap_ns`` apart;
        then ``quiet_ns`` without requests."""
        got, want = [], []
        for addr in addrs:
            self.knobs.tick()
            got.append(int(self.c.submit(self.t_ns, addr, op)["latency_ns"]))
            want.append(int(self.control.submit(self.t_ns, addr, op)["latency_ns"]))
            self.t_ns += gap_ns
        self.t_ns += quiet_ns
        return np.array(got), np.array(want)

    def reads(self, pages: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
        return self.run([page * PAGE for page in pages])

    def entries(self, kind: str) -> list[dict[str, Any]]:
        return [entry for entry in self.knobs.log if entry["kind"] == kind]


def applied(knobs: KnobController, knob: FirmwareKnob) -> bool:
    """Apply ``knob``; whether it was taken (not recorded as rejected)."""
    knobs.apply(knob)
    return "rejected" not in knobs.log[-1]


def idle_read_ns(c: Controller, factor: float = 1.0) -> int:
    """A flash read on an idle die: the SSD-DRAM hit path + the die's read time."""
    return c.latencies.hit_ns + round(c.flash_timeline().read_ns * factor)


def test_a_gc_storm_slows_reads_while_it_lasts_then_they_are_back_to_normal() -> None:
    twin = Twin()
    normal = idle_read_ns(twin.c)
    got, want = twin.reads(range(0, 200))
    assert (got == want).all() and (want == normal).all()
    twin.knobs.apply(GcStorm(duration_ms=20))
    got, want = twin.reads(range(1000, 1300))  # 30 ms apart from the stalls
    after, after_want = twin.reads(range(2000, 2200))
    start, end = twin.entries("gc-storm-start")[0], twin.entries("gc-storm-end")[0]
    during = end["requests_during"]  # the reads served before its end was seen
    print(f"GC storm: reads {want.mean():.0f} ns -> {got[:during].mean():.0f} ns (median "
          f"{np.median(got[:during]):.0f}) during, {got[during:].mean():.0f} ns after; {end}")
    assert (want == normal).all() and 100 < during < 300
    # host reads wait for the GC copy or erase in progress on their die
    assert np.mean(got[:during] > normal) > 0.8 and got[:during].mean() > 5 * normal
    assert (got[during:] == want[during:]).all()
    one_block_ns = 32 * (3_000 + 80_000) + 1_000_000  # copy a full block, erase it
    assert start["at_ns"] + 20_000_000 <= end["at_ns"] <= start["at_ns"] + 20_000_000 + one_block_ns + 200_000
    assert end["gc_stopped_at_ns"] == start["at_ns"] + 20_000_000
    flash = twin.c.counter_dict()["flash"]
    assert end["blocks_collected"] == flash["gc_runs"] == flash["erases_gc"] > 8
    assert end["pages_moved"] == flash["programs_gc"] == 32 * end["blocks_collected"]  # full blocks
    assert end["dies_without_work"] == []
    assert (after == after_want).all()  # over: back to normal


def test_a_gc_storm_keeps_its_dies_busy_within_one_large_chunk() -> None:
    """The storm's work is topped up by the reads themselves, not between chunks: one
    chunk of 3000 reads, 100 us apart, through a 100 ms storm and past its end."""
    twin = Twin()
    twin.reads([0])
    twin.knobs.apply(GcStorm(duration_ms=100))
    twin.knobs.tick()
    twin.c.submit(twin.t_ns, PAGE)  # starts at the next chunk: this one
    twin.knobs.tick()
    stop_ns = twin.knobs.log[-1]["at_ns"] + 100_000_000
    pages = np.arange(1000, 4000)
    requests = make_requests(pages * PAGE, time_ns=twin.t_ns + np.arange(pages.size) * 100_000)
    out = twin.c.process(requests)
    during, after = out["start_ns"] < stop_ns, out["start_ns"] > stop_ns + 4_000_000  # + one block
    print(f"one chunk: {out['latency_ns'][during].mean():.0f} ns until the storm stopped, "
          f"{out['latency_ns'][after].mean():.0f} ns after")
    assert during.sum() > 500 and after.sum() > 500
    assert np.mean(out["latency_ns"][during] > idle_read_ns(twin.c)) > 0.9
    assert (out["latency_ns"][after] == idle_read_ns(twin.c)).all()


def test_a_gc_storm_on_chosen_dies_by_blocks_slows_only_their_reads() -> None:
    twin = Twin()
    twin.reads([0])  # the storm starts with the first request after it is applied
    twin.knobs.apply(GcStorm(blocks=2, dies=(3,)))
    got, want = twin.reads(range(8, 8 + 64))  # 8 pages per die (page p is on die p % 8)
    on_die_3 = np.arange(8, 8 + 64) % 8 == 3
    assert (got[~on_die_3] == want[~on_die_3]).all()
    assert (got[on_die_3] > want[on_die_3]).all()
    twin.reads([0, 1])  # its end is seen before the request after the one past it
    end = twin.entries("gc-storm-end")[0]
    assert end["blocks_collected"] == 2 and twin.c.counter_dict()["flash"]["gc_runs"] == 2
    # ends when its two blocks' work is done (the reads on die 3 pushed it back a little)
    assert end["at_ns"] - end["started_at_ns"] >= 2 * (32 * 83_000 + 1_000_000)


def test_a_slow_die_or_channel_scales_its_reads_until_restored() -> None:
    twin = Twin()
    c = twin.c
    one_per_die = range(64, 72)  # page p is on die p % 8, die d on channel d % 4
    assert applied(twin.knobs, DieFault(mode="slow", channel=1, factor=4))
    assert applied(twin.knobs, DieFault(mode="slow", die=6, factor=2.5))
    got, want = twin.reads(one_per_die)
    expected = [idle_read_ns(c, {1: 4, 5: 4, 6: 2.5}.get(die, 1)) for die in range(8)]
    assert got.tolist() == expected and (want == idle_read_ns(c)).all()
    assert [e.get("dies") for e in twin.entries("die-fault")] == [[1, 5], [6]]
    assert applied(twin.knobs, DieFault(mode="restore", channel=1))
    got, _ = twin.reads(range(80, 88))
    assert got.tolist() == [idle_read_ns(c, 2.5 if die == 6 else 1) for die in range(8)]
    assert c.counter_dict()["flash"]["reads_slow_die"] == 3 + 1


def test_a_failed_die_is_rebuilt_from_its_stripe_then_read_from_its_stand_in() -> None:
    twin = Twin(flash__overprovisioning=0.5)  # room for die 2's pages on the others
    c, ftl = twin.c, twin.c.flash.ftl  # type: ignore[union-attr]
    assert applied(twin.knobs, DieFault(mode="fail", die=2))
    pages = range(0, 64)
    on_die_2 = np.arange(64) % 8 == 2
    got, want = twin.reads(pages)
    # its 3 stripe mates (dies 0, 1, 3: row 0 across the 4 channels) read in parallel, then XORed
    assert (got[on_die_2] == idle_read_ns(c) + 3 * REBUILD_NS_PER_PAGE).all()
    assert (got[~on_die_2] == want[~on_die_2]).all()
    flash = c.counter_dict()["flash"]
    assert (flash["rebuilds"], flash["reads_rebuild"], flash["programs_rebuild"]) == (8, 24, 8)
    moved = [ftl.die_of(p) for p in np.flatnonzero(on_die_2).tolist()]
    assert 2 not in moved and len(set(moved)) > 1  # spread over the healthy dies
    twin.reads(range(1024, 1600, 8))  # evict them from the data cache (pages on die 0)
    got, want = twin.reads(pages)
    assert (got == want).all() and c.counter_dict()["flash"]["rebuilds"] == 8  # read where rebuilt
    # no new writes on die 2 (the write pointer skips it); a restored die takes them again
    fill = ftl.write_ptr[2]
    written = [c.flash.program(p, twin.t_ns) and ftl.die_of(p) for p in range(8, 16)]  # type: ignore[union-attr]
    assert 2 not in written and len(set(written)) == 7 and ftl.write_ptr[2] == fill
    assert applied(twin.knobs, DieFault(mode="restore", die=2))
    written = [c.flash.program(p, twin.t_ns) and ftl.die_of(p) for p in range(8, 16)]  # type: ignore[union-attr]
    assert sorted(written) == list(range(8))


def test_die_failures_the_model_cannot_take_are_rejected_with_the_reason() -> None:
    twin = Twin(flash__overprovisioning=0.5)
    assert applied(twin.knobs, DieFault(mode="fail", die=2))
    assert not applied(twin.knobs, DieFault(mode="fail", die=1))  # same stripe: dies 0..3
    assert "shares its parity stripe (die row 0 across the channels) with failed die 2" in (
        twin.knobs.log[-1]["rejected"]
    )
    assert applied(twin.knobs, DieFault(mode="fail", die=5))  # row 1
    full = Twin()  # 7 % over-provisioning: no room for a whole die's pages
    assert not applied(full.knobs, DieFault(mode="fail", channel=0))
    assert "raise flash.overprovisioning" in full.knobs.log[-1]["rejected"]
    assert full.c.flash is not None and not full.c.flash.ftl.failed  # nothing half done


def test_flush_throttle_stalls_log_appends_and_off_restores() -> None:
    twin = Twin("skybyte-w")  # a 1820-entry log, flushed at half full

    def writes(pages: range) -> tuple[np.ndarray, np.ndarray]:
        addrs = [page * PAGE + line * LINE for page in pages for line in range(64)]
        return twin.run(addrs, Op.WRITE, gap_ns=1_000)

    append_ns = twin.c.latencies.log_append_ns
    got, want = writes(range(0, 100))
    assert (got == want).all() and (want == append_ns).all()
    assert applied(twin.knobs, FlushThrottle(program_interval_ns=100_000))
    got, want = writes(range(100, 200))
    assert applied(twin.knobs, FlushThrottle(program_interval_ns=0))
    after, after_want = writes(range(200, 300))
    off = twin.entries("flush-throttle")[-1]
    print(f"flush throttle: appends {want.mean():.0f} ns -> {got.mean():.0f} ns (max {got.max()}), "
          f"{off['full_stalls_during']} stalls, {off['full_stall_ns_during']} ns")
    assert (want == append_ns).all()
    # a flush of ~15 pages now gives a page's space back each 100 us (page by page, as
    # SkyByte's flush); appends come one a us, so once the log is full each waits for
    # the next page: never longer than one interval
    assert off["full_stalls_during"] >= 3 and 50_000 < got.max() <= 100_000 + append_ns
    assert int((got - append_ns).sum()) == off["full_stall_ns_during"]  # every stall is on an append
    # off: as without it (the log's flushes fall a few appends apart, so its rare
    # GC-caused stall too: compare the means)
    assert np.median(after) == append_ns and after.mean() == pytest.approx(after_want.mean(), rel=0.01)


def test_knobs_that_do_not_fit_the_design_are_rejected_not_raised() -> None:
    base = Twin()
    cases: list[tuple[FirmwareKnob, str]] = [
        (FlushThrottle(program_interval_ns=100), r"has no write log \(write_log.enabled is false\)"),
        (DieFault(mode="slow", die=8, factor=2),
         r"die 8 does not exist: the attached design has 8 dies \(0..7; 4 channels x 2 dies each\)"),
        (DieFault(mode="restore", channel=4), r"channel 4 does not exist: .* 4 flash channels \(0..3\)"),
        (GcStorm(blocks=1, dies=(0, 9)), "die 9 does not exist"),
    ]
    shape = dataclasses.replace(
        DeviceShape.of_profile(load_profile("base-cssd", SMALL)), name="the attached design"
    )
    assert shape == base.knobs.shape
    for knob, message in cases:
        assert not applied(base.knobs, knob)
        assert re.search(message, base.knobs.log[-1]["rejected"])
        with pytest.raises(InputError, match=message):  # the same check when it is sent
            check_fits(knob, shape)
    dram = KnobController(Controller.from_profile(load_profile("dram-only")))
    assert not applied(dram, GcStorm(duration_ms=1)) and "dram-only" in dram.log[-1]["rejected"]
    with pytest.raises(InputError, match="one flash channel has no parity stripe"):
        one_channel = load_profile("base-cssd", {"flash.channels": 1})
        check_fits(DieFault(mode="fail", die=0), DeviceShape.of_profile(one_channel))


@pytest.mark.parametrize(
    "knob",
    [GcStorm(duration_ms=2.5), GcStorm(blocks=3, dies=(4, 1)), DieFault(mode="slow", channel=2, factor=3.5),
     DieFault(mode="fail", die=7), DieFault(mode="restore", die=7), FlushThrottle(program_interval_ns=5_000)],
)
def test_knobs_travel_as_json_lines(knob: FirmwareKnob) -> None:
    assert knob_from_dict(json.loads(json.dumps(knob_to_dict(knob)))) == knob

"""Firmware knobs: validated, applied to a controller, spikes end on the modelled clock;
the firmware process's control file hands over only complete lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from cxlssd.errors import InputError
from cxlssd.firmware.controller import Controller
from cxlssd.firmware.knobs import FlashLatency, KnobController, LatencySpike, LinkLatency, knob_from_dict
from cxlssd.firmware.profile import load_profile
from cxlssd.firmware.serve import ControlFile

PAGE = 4096


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
        ({"kind": "flash-latency", "read_ns": 0}, "read_ns must be an integer number of ns in 1.."),
        ({"kind": "flash-latency", "read_ns": 2.5}, "read_ns must be an integer"),
        ({"kind": "link-latency", "extra_ns": -1}, "extra_ns must be"),
        ({"kind": "latency-spike", "extra_ns": 100, "duration_ms": 0}, "duration_ms must be"),
        ({"kind": "latency-spike", "extra_ns": 100, "duration_ms": 5, "colour": 1}, "unknown field"),
        ({"kind": "gc-party"}, "not a firmware knob"),
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

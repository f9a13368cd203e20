"""Firmware knobs: latency and behaviour changes applied to a running firmware.

``./cxlssd inject --instance NAME flash-latency --read-ns 20000`` (or
``inject(platform, FlashLatency(read_ns=20000))``) appends the knob as a JSON
line to the control file of the instance's firmware process; the process
applies it in its serving thread before the next chunk of requests, so it
takes effect for requests the guest makes from then on.

| knob | effect |
| --- | --- |
| ``flash-latency`` | flash read / program / erase time per page or block, ns |
| ``link-latency`` | extra CXL link latency on every device access, ns (0 restores) |
| ``latency-spike`` | extra link latency for the next N ms of modelled time, then back to normal |

A spike's modelled time starts at the first chunk of requests it applies to and
ends at the first chunk served after the firmware's clock (the latest request
start it has seen) passed its end: the granularity is a ring chunk, a few
microseconds of modelled time in a live run. Knob runs are not replayable
from their trace (the trace has no knob events); the results list every knob
with the modelled time it took effect and, for a spike, ended.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from cxlssd.errors import InputError
from cxlssd.firmware.controller import Controller

MAX_NS = 10**9  # 1 s per access: anything above is a typo


def _check_ns(name: str, value: object, zero_ok: bool = False) -> None:
    low = 0 if zero_ok else 1
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_NS:
        raise InputError(f"{name} must be an integer number of ns in {low}..{MAX_NS}, got {value!r}")


@dataclass(frozen=True)
class FlashLatency:
    kind: ClassVar[str] = "flash-latency"
    read_ns: int | None = None
    program_ns: int | None = None
    erase_ns: int | None = None

    def __post_init__(self) -> None:
        given = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        if not given:
            raise InputError("flash-latency needs at least one of --read-ns, --program-ns, --erase-ns")
        for name, value in given.items():
            _check_ns(name, value)


@dataclass(frozen=True)
class LinkLatency:
    kind: ClassVar[str] = "link-latency"
    extra_ns: int = 0

    def __post_init__(self) -> None:
        _check_ns("extra_ns", self.extra_ns, zero_ok=True)


@dataclass(frozen=True)
class LatencySpike:
    kind: ClassVar[str] = "latency-spike"
    extra_ns: int = 0
    duration_ms: float = 0.0

    def __post_init__(self) -> None:
        _check_ns("extra_ns", self.extra_ns)
        if isinstance(self.duration_ms, bool) or not isinstance(self.duration_ms, int | float) or not (
            0 < self.duration_ms <= 60_000
        ):
            raise InputError(
                f"duration_ms must be 0 < ms <= 60000 of modelled time, got {self.duration_ms!r}"
            )


FirmwareKnob = FlashLatency | LinkLatency | LatencySpike
KNOBS: dict[str, type[FlashLatency] | type[LinkLatency] | type[LatencySpike]] = {
    k.kind: k for k in (FlashLatency, LinkLatency, LatencySpike)
}


def knob_to_dict(knob: FirmwareKnob) -> dict[str, Any]:
    return {"kind": knob.kind, **{k: v for k, v in dataclasses.asdict(knob).items() if v is not None}}


def knob_from_dict(raw: object) -> FirmwareKnob:
    """A knob from its JSON form; :class:`InputError` naming what is wrong."""
    if not isinstance(raw, dict) or raw.get("kind") not in KNOBS:
        raise InputError(f"not a firmware knob: {raw!r}; kinds: {', '.join(KNOBS)}")
    cls = KNOBS[raw["kind"]]
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(raw) - fields - {"kind"}
    if unknown:
        raise InputError(f"{raw['kind']}: unknown field(s) {sorted(unknown)}; known: {sorted(fields)}")
    return cls(**{k: v for k, v in raw.items() if k != "kind"})


class KnobController:
    """Applies knobs to one controller, starts and ends spikes on its modelled clock,
    and keeps the log of what happened (modelled times in ns)."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.base_link_ns = controller.latencies.cxl_link_ns
        self.extra_ns = 0  # the link-latency knob's
        self.spike_ns = 0
        self.spike_duration_ns = 0
        self.spike_requests_at = 0  # the controller's request count when the spike was applied
        self.spike_end_ns: int | None = None
        self.log: list[dict[str, Any]] = []
        self.scheduled: list[tuple[float, FirmwareKnob]] = []  # (at_ms, knob), by time
        self.t0_ns: int | None = None  # the first request's start: scenario time 0

    def _set_link(self) -> None:
        self.controller.set_latencies(cxl_link_ns=self.base_link_ns + self.extra_ns + self.spike_ns)

    def apply(self, knob: FirmwareKnob) -> None:
        if isinstance(knob, FlashLatency):
            timeline = self.controller.flash_timeline()
            for name in ("read_ns", "program_ns", "erase_ns"):
                value = getattr(knob, name)
                if value is not None:
                    setattr(timeline, name, value)
        elif isinstance(knob, LinkLatency):
            self.extra_ns = knob.extra_ns
            self._set_link()
        else:
            # The spike's modelled time starts with the first request it applies to
            # (the firmware's clock is the last request's, stale while the guest idles).
            self.spike_ns, self.spike_duration_ns = knob.extra_ns, round(knob.duration_ms * 1e6)
            self.spike_requests_at, self.spike_end_ns = self.controller.counters.requests, None
            self._set_link()
        self.log.append({**knob_to_dict(knob), "applied_after_requests": self.controller.counters.requests})

    def schedule(self, knob: FirmwareKnob, at_ms: float) -> None:
        """Apply ``knob`` ``at_ms`` of modelled time after the first request (a scenario)."""
        if isinstance(at_ms, bool) or not isinstance(at_ms, int | float) or not 0 <= at_ms <= 3_600_000:
            raise InputError(f"at_ms must be 0..3600000 ms of modelled time, got {at_ms!r}")
        self.scheduled.append((float(at_ms), knob))
        self.scheduled.sort(key=lambda entry: entry[0])

    def tick(self) -> None:
        """Apply scheduled knobs that are due, start or end a spike (before every chunk)."""
        requests, now = self.controller.counters.requests, self.controller.now_ns
        if self.t0_ns is None and requests:
            self.t0_ns = now
        while self.scheduled and self.t0_ns is not None and now >= self.t0_ns + self.scheduled[0][0] * 1e6:
            self.apply(self.scheduled.pop(0)[1])
        if not self.spike_ns:
            return
        if self.spike_end_ns is None:
            if requests > self.spike_requests_at:
                self.spike_end_ns = now + self.spike_duration_ns
                self.log.append({"kind": "latency-spike-start", "at_ns": now})
        elif now >= self.spike_end_ns:
            self.spike_ns, self.spike_end_ns = 0, None
            self._set_link()
            self.log.append({"kind": "latency-spike-end", "at_ns": now,
                             "requests_during": requests - self.spike_requests_at})

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
| ``gc-storm`` | forced garbage collection on all (or chosen) dies for N ms, or N blocks per die |
| ``die-fault`` | a die (or a channel's dies) slowed by a factor, failed, or restored |
| ``flush-throttle`` | at most one write-log flush program per N ns (0 restores) |

A spike's modelled time starts at the first chunk of requests it applies to and
ends at the first chunk served after the firmware's clock (the latest request
start it has seen) passed its end: the granularity is a ring chunk, a few
microseconds of modelled time in a live run that keeps up, more when the firmware
lags the guest (a chunk holds up to 64 Ki requests). A GC storm starts the same way;
until it stops (``duration_ms`` later, or at once for ``blocks``), every host read
on a chosen die first tops the die's background work up to one erase with blocks
collected by force (a block whose pages are all valid is relocated too): reads
always find GC in progress, whatever the chunk size (:mod:`.flash`). The storm
ends, and is logged as ended, at the first chunk after its queued work is
estimated done (host reads after that can delay it by their own read time).

Knob runs are not replayable from their trace (the trace has no knob events); the
results list every knob with the modelled time it took effect and, for a spike or
a storm, started and ended.

A knob is checked twice: against the values alone when it is built, and
against the design (:func:`check_fits`: flash, write log, die and channel
indexes) when it is sent and again when it is applied. A knob the running
firmware cannot take (also: a state it cannot reach, such as a second failed die
in a parity stripe) is logged and recorded as ``rejected`` with the reason in the
results; the guest's run goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import AfterValidator, Field, StrictFloat, StrictInt, field_validator, model_validator

from cxlssd.errors import CxlssdError, InputError
from cxlssd.firmware.controller import Controller
from cxlssd.firmware.flash import FlashBackend, check_rebuildable
from cxlssd.firmware.profile import Profile
from cxlssd.models import Cli, ConfigModel
from cxlssd.yamlfile import short_repr

log = logging.getLogger(__name__)

MAX_NS = 10**9  # 1 s per access: anything above is a typo
MAX_DURATION_MS = 60_000
MAX_FACTOR = 1000.0
MAX_STORM_BLOCKS = 10_000
DIE_MODES = ("slow", "fail", "restore")


def _ns_in(low: int) -> AfterValidator:
    def check(value: int) -> int:
        if not low <= value <= MAX_NS:
            raise ValueError(f"{value!r} is out of range: give a whole number of ns in {low}..{MAX_NS}")
        return value

    return AfterValidator(check)


def _duration(value: float) -> float:
    if not 0 < value <= MAX_DURATION_MS:  # also rejects NaN
        raise ValueError(f"{value!r} is out of range: give 0 < ms <= {MAX_DURATION_MS} of modelled time")
    return value


def _index(value: int) -> int:
    if value < 0:
        raise ValueError(f"{value!r} is not an index: give a non-negative integer")
    return value


Ns = Annotated[StrictInt, _ns_in(1)]
NsOrZero = Annotated[StrictInt, _ns_in(0)]
DurationMs = Annotated[StrictFloat, AfterValidator(_duration)]
Index = Annotated[StrictInt, AfterValidator(_index)]


class _Knob(ConfigModel):
    """A knob's values are checked when it is built; a problem is an InputError (a
    control-file line or a scenario entry names it)."""

    error_class: ClassVar[type[CxlssdError]] = InputError
    kind: ClassVar[str]


class FlashLatency(_Knob):
    """Firmware knob: flash read/program/erase time."""

    kind: ClassVar[str] = "flash-latency"
    read_ns: Ns | None = Field(default=None, description="flash read time per page, ns")
    program_ns: Ns | None = Field(default=None, description="flash program time per page, ns")
    erase_ns: Ns | None = Field(default=None, description="flash erase time per block, ns")

    @model_validator(mode="after")
    def _some(self) -> Self:
        if self.read_ns is None and self.program_ns is None and self.erase_ns is None:
            raise ValueError("needs at least one of read_ns, program_ns, erase_ns "
                             "(--read-ns, --program-ns, --erase-ns)")
        return self


class LinkLatency(_Knob):
    """Firmware knob: extra CXL link latency (0 restores)."""

    kind: ClassVar[str] = "link-latency"
    extra_ns: NsOrZero = Field(description="extra latency on every device access, ns (0 restores)")


class LatencySpike(_Knob):
    """Firmware knob: extra link latency for N ms of modelled time."""

    kind: ClassVar[str] = "latency-spike"
    extra_ns: Ns = Field(description="extra latency on every device access, ns")
    duration_ms: DurationMs = Field(description="how long, ms of modelled time")


class GcStorm(_Knob):
    """Firmware knob: forced garbage collection for N ms of modelled time (or N blocks).
    On ``dies`` (None: all), for ``duration_ms``, or ``blocks`` blocks on each die at
    once (exactly one of the two)."""

    kind: ClassVar[str] = "gc-storm"
    cli_one_of: ClassVar[tuple[tuple[str, ...], ...]] = (("duration_ms", "blocks"),)
    duration_ms: DurationMs | None = Field(
        default=None, description="keep the dies collecting this long (modelled)"
    )
    blocks: StrictInt | None = Field(default=None, description="collect this many blocks on each die at once")
    dies: Annotated[tuple[Index, ...] | None, Cli(metavar="D,D,...")] = Field(
        default=None, description="die indexes (default: every die)"
    )

    @field_validator("blocks")
    @classmethod
    def _blocks(cls, value: int | None) -> int | None:
        if value is not None and not 1 <= value <= MAX_STORM_BLOCKS:
            raise ValueError(f"{value!r} is out of range: give 1..{MAX_STORM_BLOCKS} blocks per die")
        return value

    @field_validator("dies")
    @classmethod
    def _dies(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("give a non-empty list of die indexes (or leave dies unset: all)")
        return tuple(sorted(set(value)))

    @model_validator(mode="after")
    def _one_size(self) -> Self:
        if (self.duration_ms is None) == (self.blocks is None):
            raise ValueError("needs exactly one of --duration-ms (modelled time) and --blocks (per die)")
        return self


class DieFault(_Knob):
    """Firmware knob: slow down, fail or restore a flash die (or a channel's dies).
    ``mode`` slow (array times x ``factor``), fail or restore ``die``, or every die of
    ``channel`` (exactly one of the two)."""

    kind: ClassVar[str] = "die-fault"
    cli_one_of: ClassVar[tuple[tuple[str, ...], ...]] = (("die", "channel"), ("factor", "mode"))
    mode: Annotated[Literal["slow", "fail", "restore"],
                    Cli(flag="", presets=(("--fail", "fail"), ("--restore", "restore")))] = Field(
        default="slow", description="slow, fail (no new writes, its pages rebuilt on read) or restore"
    )
    die: Index | None = Field(default=None, description="die index (die d is on channel d % channels)")
    channel: Index | None = Field(default=None, description="every die of this flash channel")
    factor: Annotated[StrictFloat | None, Cli(flag="--slow", metavar="FACTOR")] = Field(
        default=None, description="slow: multiply its read/program/erase times by this"
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (self.die is None) == (self.channel is None):
            raise ValueError("needs exactly one of --die and --channel")
        if self.mode != "slow":
            if self.factor is not None:
                raise ValueError(f"factor is for mode slow (--slow FACTOR), not {self.mode}")
        elif self.factor is None or not 1 < self.factor <= MAX_FACTOR:
            raise ValueError(f"mode slow needs a latency factor 1 < factor <= {MAX_FACTOR:g} "
                             f"(--restore brings the die back), got {self.factor!r}")
        return self


class FlushThrottle(_Knob):
    """Firmware knob: at most one write-log flush program per N ns (0 restores)."""

    kind: ClassVar[str] = "flush-throttle"
    cli_one_of: ClassVar[tuple[tuple[str, ...], ...]] = (("program_interval_ns",),)
    program_interval_ns: Annotated[NsOrZero, Cli(flag="--interval-ns", presets=(("--off", 0),))] = Field(
        default=0, description="ns between flush programs (0, --off: stop throttling)"
    )


FirmwareKnob = FlashLatency | LinkLatency | LatencySpike | GcStorm | DieFault | FlushThrottle
KNOBS: dict[str, type[FirmwareKnob]] = {
    k.kind: k for k in (FlashLatency, LinkLatency, LatencySpike, GcStorm, DieFault, FlushThrottle)
}


def knob_to_dict(knob: FirmwareKnob) -> dict[str, Any]:
    """The knob's JSON form: its kind and the fields that are set."""
    return {"kind": knob.kind, **knob.model_dump(mode="json", exclude_none=True)}


def knob_from_dict(raw: object, where: str = "") -> FirmwareKnob:
    """A knob from its JSON form; :class:`InputError` naming what is wrong (and ``where``)."""
    if not isinstance(raw, dict) or raw.get("kind") not in KNOBS:
        raise InputError(f"not a firmware knob: {short_repr(raw)}; kinds: {', '.join(KNOBS)}")
    return KNOBS[raw["kind"]].parse({k: v for k, v in raw.items() if k != "kind"}, where)


# -- the design a knob is sent to ------------------------------------------------


@dataclass(frozen=True)
class DeviceShape:
    """What checking a knob needs to know of a design."""

    name: str
    flash: bool  # False: dram-only
    channels: int
    dies_per_channel: int
    write_log: bool

    @property
    def n_dies(self) -> int:
        return self.channels * self.dies_per_channel

    @classmethod
    def of_profile(cls, profile: Profile) -> DeviceShape:
        return cls(
            name=f"design {profile.name}", flash=profile["kind"] != "dram-only",
            channels=profile["flash.channels"], dies_per_channel=profile["flash.dies_per_channel"],
            write_log=bool(profile["write_log.enabled"]),
        )

    @classmethod
    def of_controller(cls, controller: Controller) -> DeviceShape:
        flash = controller.flash
        channels = flash.timeline.channels if flash is not None else 0
        return cls(
            name="the attached design", flash=flash is not None, channels=channels,
            dies_per_channel=flash.timeline.n_dies // channels if flash is not None else 0,
            write_log=controller.log is not None,
        )

    def dies_of(self, knob: DieFault) -> list[int]:
        """The dies ``knob`` acts on (its die, or its channel's: die ``d`` is on channel ``d % channels``)."""
        if knob.die is not None:
            if knob.die >= self.n_dies:
                raise InputError(
                    f"die-fault: die {knob.die} does not exist: {self.name} has {self.n_dies} dies "
                    f"(0..{self.n_dies - 1}; {self.channels} channels x {self.dies_per_channel} dies each)"
                )
            return [knob.die]
        assert knob.channel is not None
        if knob.channel >= self.channels:
            raise InputError(
                f"die-fault: channel {knob.channel} does not exist: {self.name} has {self.channels} "
                f"flash channels (0..{self.channels - 1})"
            )
        return list(range(knob.channel, self.n_dies, self.channels))


def check_fits(knob: FirmwareKnob, shape: DeviceShape) -> None:
    """InputError if ``knob`` cannot apply to the design ``shape`` describes."""
    if isinstance(knob, LinkLatency | LatencySpike):
        return
    if not shape.flash:
        raise InputError(f"{knob.kind}: {shape.name} is dram-only: it has no flash; use a cxl-ssd design")
    if isinstance(knob, FlushThrottle) and not shape.write_log:
        raise InputError(
            f"flush-throttle: {shape.name} has no write log (write_log.enabled is false); "
            "use a design with one, e.g. skybyte-w or skybyte-full"
        )
    if isinstance(knob, GcStorm) and knob.dies is not None and max(knob.dies) >= shape.n_dies:
        raise InputError(
            f"gc-storm: die {max(knob.dies)} does not exist: {shape.name} has {shape.n_dies} dies "
            f"(0..{shape.n_dies - 1})"
        )
    if isinstance(knob, DieFault):
        shape.dies_of(knob)
        if knob.mode == "fail":
            check_rebuildable(shape.channels)


# -- applying knobs to a controller ------------------------------------------------


@dataclass
class _Storm:
    """A GC storm's progress (modelled times in ns)."""

    knob: GcStorm
    dies: list[int]
    requests_at: int  # the controller's request count when it was applied
    start_ns: int | None = None
    stop_ns: int = 0  # no new storm work from then on
    end_ns: int | None = None  # its work estimated done (known once stopped)


class KnobController:
    """Applies knobs to one controller, starts and ends spikes and GC storms on its
    modelled clock, and keeps the log of what happened (modelled times in ns)."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.shape = DeviceShape.of_controller(controller)
        self.base_link_ns = controller.latencies.cxl_link_ns
        self.extra_ns = 0  # the link-latency knob's
        self.spike_ns = 0
        self.spike_duration_ns = 0
        self.spike_requests_at = 0  # the controller's request count when the spike was applied
        self.spike_end_ns: int | None = None
        self.storm: _Storm | None = None
        self.throttle_stalls_at: tuple[int, int] | None = None  # log stalls when throttling began
        self.log: list[dict[str, Any]] = []
        self.scheduled: list[tuple[float, FirmwareKnob]] = []  # (at_ms, knob), by time
        self.t0_ns: int | None = None  # the first request's start: scenario time 0
        self._handlers: dict[type, Callable[[Any], dict[str, Any]]] = {
            FlashLatency: self._flash_latency, LinkLatency: self._link_latency,
            LatencySpike: self._latency_spike, GcStorm: self._gc_storm, DieFault: self._die_fault,
            FlushThrottle: self._flush_throttle,
        }

    @property
    def _flash(self) -> FlashBackend:
        assert self.controller.flash is not None  # check_fits made sure
        return self.controller.flash

    def _record(self, kind: str, **entry: Any) -> None:
        self.log.append({"kind": kind, "at_ns": self.controller.now_ns, **entry})

    def check(self, knob: FirmwareKnob) -> None:
        """InputError if ``knob`` cannot apply to this controller's design."""
        check_fits(knob, self.shape)

    def apply(self, knob: FirmwareKnob) -> None:
        """Apply ``knob`` now; if this firmware cannot take it, log that and record it
        as rejected (with the reason) instead: a live run goes on."""
        entry = knob_to_dict(knob)
        kind = entry.pop("kind")
        entry["applied_after_requests"] = self.controller.counters.requests
        try:
            self.check(knob)
            entry.update(self._handlers[type(knob)](knob))
        except InputError as error:
            log.error("firmware knob %s rejected: %s", kind, error)
            self._record(kind, **entry, rejected=str(error))
            return
        self._record(kind, **entry)

    def _set_link(self) -> None:
        self.controller.set_latencies(cxl_link_ns=self.base_link_ns + self.extra_ns + self.spike_ns)

    def _flash_latency(self, knob: FlashLatency) -> dict[str, Any]:
        self.controller.flash_timeline().set_timings(**knob.model_dump(exclude_none=True))
        return {}

    def _link_latency(self, knob: LinkLatency) -> dict[str, Any]:
        self.extra_ns = knob.extra_ns
        self._set_link()
        return {}

    def _latency_spike(self, knob: LatencySpike) -> dict[str, Any]:
        # The spike's modelled time starts with the first request it applies to
        # (the firmware's clock is the last request's, stale while the guest idles).
        self.spike_ns, self.spike_duration_ns = knob.extra_ns, round(knob.duration_ms * 1e6)
        self.spike_requests_at, self.spike_end_ns = self.controller.counters.requests, None
        self._set_link()
        return {}

    def _gc_storm(self, knob: GcStorm) -> dict[str, Any]:
        if self.storm is not None:  # a new storm replaces the one in progress
            self._end_storm(self.storm, replaced=True)
        dies = list(knob.dies) if knob.dies is not None else list(range(self.shape.n_dies))
        self.storm = _Storm(knob, dies, self.controller.counters.requests)
        return {}

    def _die_fault(self, knob: DieFault) -> dict[str, Any]:
        dies = self.shape.dies_of(knob)
        if knob.mode == "slow":
            assert knob.factor is not None
            self._flash.slow_dies(dies, knob.factor)
        elif knob.mode == "fail":
            self._flash.fail_dies(dies)
        else:
            self._flash.restore_dies(dies)
        return {"dies": dies}

    def _flush_throttle(self, knob: FlushThrottle) -> dict[str, Any]:
        wlog = self.controller.log
        assert wlog is not None  # check_fits made sure
        wlog.program_interval_ns = knob.program_interval_ns
        stalls = (wlog.counters.full_stalls, wlog.counters.full_stall_ns)
        if knob.program_interval_ns:
            if self.throttle_stalls_at is None:
                self.throttle_stalls_at = stalls
            return {}
        if self.throttle_stalls_at is None:
            return {}
        began, self.throttle_stalls_at = self.throttle_stalls_at, None
        return {"full_stalls_during": stalls[0] - began[0], "full_stall_ns_during": stalls[1] - began[1]}

    def schedule(self, knob: FirmwareKnob, at_ms: float) -> None:
        """Apply ``knob`` ``at_ms`` of modelled time after the first request (a scenario)."""
        if isinstance(at_ms, bool) or not isinstance(at_ms, int | float) or not 0 <= at_ms <= 3_600_000:
            raise InputError(f"at_ms must be 0..3600000 ms of modelled time, got {at_ms!r}")
        self.scheduled.append((float(at_ms), knob))
        self.scheduled.sort(key=lambda entry: entry[0])

    def tick(self) -> None:
        """Apply scheduled knobs that are due, start or end a spike or a storm,
        keep a storm's dies busy (before every chunk)."""
        requests, now = self.controller.counters.requests, self.controller.now_ns
        if self.t0_ns is None and requests:
            self.t0_ns = now
        while self.scheduled and self.t0_ns is not None and now >= self.t0_ns + self.scheduled[0][0] * 1e6:
            self.apply(self.scheduled.pop(0)[1])
        if self.spike_ns:
            self._tick_spike(requests, now)
        if self.storm is not None:
            self._tick_storm(self.storm, requests, now)

    def _tick_spike(self, requests: int, now: int) -> None:
        if self.spike_end_ns is None:
            if requests > self.spike_requests_at:
                self.spike_end_ns = now + self.spike_duration_ns
                self._record("latency-spike-start")
        elif now >= self.spike_end_ns:
            self.spike_ns, self.spike_end_ns = 0, None
            self._set_link()
            self._record("latency-spike-end", requests_during=requests - self.spike_requests_at)

    def _tick_storm(self, storm: _Storm, requests: int, now: int) -> None:
        flash = self._flash
        if storm.start_ns is None:
            if requests <= storm.requests_at:
                return
            storm.start_ns = now
            self._record("gc-storm-start", dies=len(storm.dies))
            if storm.knob.blocks is not None:
                storm.stop_ns = now
                flash.begin_storm(storm.dies, storm.stop_ns)
                for die in storm.dies:
                    flash.storm_collect(die, now, storm.knob.blocks)
            else:
                assert storm.knob.duration_ms is not None
                storm.stop_ns = now + round(storm.knob.duration_ms * 1e6)
                flash.begin_storm(storm.dies, storm.stop_ns)
                for die in storm.dies:
                    flash.storm_top_up(die, now)
        if now < storm.stop_ns:
            return
        if storm.end_ns is None:  # stopped: its work is done when every die's backlog is
            storm.end_ns = max(flash.timeline.background(die, now, 0) for die in storm.dies)
        if now >= storm.end_ns:
            self._end_storm(storm)

    def _end_storm(self, storm: _Storm, replaced: bool = False) -> None:
        self.storm = None
        work = self._flash.end_storm()
        self._record(
            "gc-storm-end", started_at_ns=storm.start_ns, gc_stopped_at_ns=storm.stop_ns,
            blocks_collected=work.blocks, pages_moved=work.pages_moved,
            dies_without_work=sorted(work.dies_without_work),
            requests_during=self.controller.counters.requests - storm.requests_at,
            **({"replaced": True} if replaced else {}),
        )

"""QMP injections in scenario files, and what the guest showed of them.

A workload's ``inject:`` list may hold, besides firmware knobs at modelled
times (``at_ms``), QEMU's CXL injections (docs/inject.md): poison,
uncorrectable and correctable errors, general-media, DRAM and memory-module
events. QEMU's events happen in wall-clock time, not on the modelled clock, so
they are timed by the workload's command instead: ``at: start`` (before it
starts), ``after_s: S`` (S seconds of wall-clock time after it started) or
``at: end`` (after it returned)::

    inject:
      - {at: start, kind: poison, dpa: 0x200000, length: 128}
      - {after_s: 1, kind: general-media, dpa: 0x201000, event_type: invalid-address}
      - {at: end, kind: memory-module, event_type: temperature-change, temperature: 87}

:class:`QmpScenario` sends them around a point's command and then records,
for each, the guest's trace event that shows it (the poison list is read
first), the guest's new kernel-log lines, and clears the poison it injected
so that the next point (another design, another repetition) can inject it again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field, SerializeAsAny, field_validator, model_validator

from cxlssd.errors import ConfigError, CxlssdError
from cxlssd.experiments import observe
from cxlssd.firmware.knobs import KNOBS, FirmwareKnob
from cxlssd.lifecycle import Lifecycle
from cxlssd.models import ConfigModel, number_in, validate_as
from cxlssd.platform.inject import (
    KINDS,
    Correctable,
    DeviceView,
    DramEvent,
    GeneralMediaEvent,
    Injection,
    MemoryModuleEvent,
    Poison,
    RunningInstance,
    Uncorrectable,
    inject,
    prepare,
    unmask_corrected_internal_errors,
)
from cxlssd.yamlfile import short_repr

if TYPE_CHECKING:
    from cxlssd.platform.machine import Platform

log = logging.getLogger(__name__)

TIMING_KEYS = ("at", "after_s")  # a QMP injection's times, by the workload's command
MAX_AFTER_S = 3600.0
MAX_AT_MS = 3_600_000.0
# The guest reads an event log within a second of the interrupt (docs/inject.md);
# under a loaded 2-core host it can take longer.
OBSERVE_TIMEOUT_S = 30.0


class QmpEvent(ConfigModel):
    """One QMP injection of a scenario: at the command's start or end, or ``after_s``
    seconds of wall-clock time after it started (``at`` is then ``"after"``)."""

    reader_fields: ClassVar[frozenset[str]] = frozenset({"injection"})  # the entry's other keys
    # SerializeAsAny: a record holds the injection's own fields, not just Injection's.
    injection: SerializeAsAny[Injection]
    at: Literal["start", "end", "after"] = Field(
        description="start or end: around the workload's command (after: what after_s means)"
    )
    after_s: Annotated[float, number_in(0, MAX_AFTER_S, "seconds")] = Field(
        default=0.0, description="instead of at: wall-clock seconds after the workload starts"
    )

    @model_validator(mode="before")
    @classmethod
    def _one_time(cls, raw: object) -> object:
        """A file gives exactly one of ``at`` and ``after_s``; the latter means at "after"."""
        if not isinstance(raw, dict):
            return raw
        if ("after_s" in raw) == ("at" in raw and raw["at"] != "after"):
            raise ValueError(f"{_kind_of(raw.get('injection'))} needs one of after_s: SECONDS (after the "
                             "workload starts) or at: start|end")
        return {**raw, "at": "after"} if "after_s" in raw else raw

    @field_validator("at", mode="before")
    @classmethod
    def _start_or_end(cls, at: object) -> object:
        if at not in ("start", "end", "after"):
            raise ValueError(f"expected start or end, got {short_repr(at)} "
                             "(use after_s: SECONDS for a time in between)")
        return at

    @property
    def when(self) -> str:
        return f"after {self.after_s:g} s" if self.at == "after" else f"at {self.at}"

    @property
    def takes_down_cxl(self) -> bool:
        """An uncorrectable error makes the guest reset the link and lose the device's
        region until it reboots (docs/inject.md): later points need a fresh guest."""
        return isinstance(self.injection, Uncorrectable)


def _kind_of(injection: object) -> str:
    return str(getattr(injection, "kind", "the injection"))


class TimedKnob(ConfigModel):
    """A scenario's firmware knob, applied ``at_ms`` of modelled time after the point's
    first request."""

    reader_fields: ClassVar[frozenset[str]] = frozenset({"knob"})  # the entry's other keys
    at_ms: Annotated[float, number_in(0, MAX_AT_MS, "ms")] = Field(
        description="modelled ms after the point's first request"
    )
    knob: FirmwareKnob


def scenario_entry(raw: object) -> TimedKnob | QmpEvent:
    """A workload's ``inject:`` entry (a firmware knob with at_ms, or a QMP injection with
    at or after_s), validated by its kind's model; a :class:`ValueError` (the caller's
    model adds the key path) or the kind model's problem at its key."""
    kind = raw.get("kind") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or not isinstance(kind, str) or (kind not in KNOBS and kind not in KINDS):
        raise ValueError(f"kind {short_repr(kind)} is not a firmware knob ({', '.join(KNOBS)}; timed by "
                         f"at_ms) or a QMP injection ({', '.join(KINDS)}; timed by after_s or at)")
    if kind in KNOBS:
        if "at_ms" not in raw:
            raise ValueError(f"{kind} is a firmware knob: it needs at_ms "
                             "(modelled ms after the first request)")
        knob = validate_as(KNOBS[kind], {k: v for k, v in raw.items() if k not in ("kind", "at_ms")})
        return TimedKnob(at_ms=raw["at_ms"], knob=knob)
    if "at_ms" in raw:
        raise ValueError(f"{kind} is a QEMU injection, and QEMU's events are not on the modelled clock: "
                         "time it with after_s (wall-clock seconds after the workload starts) "
                         "or at: start|end")
    injection = validate_as(KINDS[kind], {k: v for k, v in raw.items() if k not in ("kind", *TIMING_KEYS)})
    return QmpEvent.model_validate({"injection": injection, **{k: raw[k] for k in TIMING_KEYS if k in raw}})


# One entry of a workload's inject: list.
ScenarioEntry = Annotated[TimedKnob | QmpEvent, BeforeValidator(scenario_entry)]


def check_events(events: Sequence[QmpEvent], devices: Sequence[DeviceView], where: str) -> None:
    """What needs the platform's devices (index, address range), and poison ranges that
    overlap (QEMU refuses the second): checked before anything runs."""
    for i, event in enumerate(events):
        try:
            prepare(event.injection, devices, "the experiment's platform")
        except ConfigError as error:
            raise ConfigError(f"{where}[{i}]: {error}".replace("use --device", "set device: to")) from None
    poisons = [(e.injection.device, e.injection.dpa, e.injection.length)
               for e in events if isinstance(e.injection, Poison)]
    for n, (device, dpa, length) in enumerate(poisons):
        for other_device, other_dpa, other_length in poisons[n + 1:]:
            if device == other_device and dpa < other_dpa + other_length and other_dpa < dpa + length:
                raise ConfigError(
                    f"{where}: poison {dpa:#x}+{length:#x} overlaps poison {other_dpa:#x}+{other_length:#x} "
                    "on the same device (QEMU refuses overlapping poison); merge them or move one"
                )


def expected_trace(injection: Injection) -> str:
    """A regex of the guest's trace event that shows ``injection`` (docs/inject.md)."""
    if isinstance(injection, Poison):
        return rf"cxl_poison: .*trace_type=List .*dpa={injection.dpa:#x} dpa_length={injection.length:#x}"
    if isinstance(injection, GeneralMediaEvent):
        return rf"cxl_general_media: .* dpa={injection.dpa:x} "
    if isinstance(injection, DramEvent):
        return rf"cxl_dram: .* dpa={injection.dpa:x} "
    if isinstance(injection, MemoryModuleEvent):
        return rf"cxl_memory_module: .* device_temp={injection.temperature} "
    if isinstance(injection, Correctable):
        return r"cxl_aer_correctable_error: "
    return r"cxl_aer_uncorrectable_error: "


class QmpScenario(Lifecycle):
    """Sends a point's QMP injections around its command (``with`` it around the
    command; :meth:`prepare` before, optionally) and then gathers what the guest
    showed (:meth:`observations`)."""

    def __init__(self, platform: Platform, events: Sequence[QmpEvent]) -> None:
        self.platform = platform
        self.events = list(events)
        self._instance: RunningInstance | None = None
        self._t0 = 0.0
        self._since_uptime_s = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._done: dict[int, dict[str, Any]] = {}
        self._prepared = False

    def _memdevs(self, kind: type[Injection], indexes: Sequence[int] | None = None) -> list[str]:
        """The guest's memdevs (``mem0``) of the devices that injections of ``kind`` (among
        ``indexes``, default all) target."""
        chosen = range(len(self.events)) if indexes is None else indexes
        devices = sorted({self.events[i].injection.device for i in chosen
                          if isinstance(self.events[i].injection, kind)})
        return [self.platform.devices[d].memdev for d in devices]

    def prepare(self) -> None:
        """Get the guest ready to show the events (before the firmware attaches: the guest
        runs its commands faster with the plugin dormant): CXL tracing on and its buffer
        emptied, the kernel log's current time noted, corrected errors unmasked."""
        guest = self.platform.guest()
        observe.enable_cxl_tracing(guest, clear=True)
        self._since_uptime_s = observe.uptime_s(guest)
        for memdev in self._memdevs(Correctable):
            # PCIe masks corrected internal errors by default: unmasked, the guest sees them.
            unmask_corrected_internal_errors(guest, memdev)
        self._prepared = True

    def _begin(self) -> None:
        if not self._prepared:
            self.prepare()
        # QMP through the instance's second socket: the timer thread has its own connection.
        self._instance = RunningInstance.find(self.platform.name)
        self._t0 = time.monotonic()
        self._send_due("start")
        if any(e.at == "after" for e in self.events):
            self._thread = threading.Thread(target=self._timer, name="qmp-scenario", daemon=True)
            self._thread.start()

    def _end(self, error: BaseException | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        ended_s = time.monotonic() - self._t0
        for i, event in enumerate(self.events):
            if event.at == "after" and i not in self._done:
                self._done[i] = {"sent": False, "reason": f"the workload ended after {ended_s:.1f} s, "
                                 f"before {event.after_s:g} s"}
        if error is None:
            self._send_due("end")

    def _timer(self) -> None:
        pending = sorted((i for i, e in enumerate(self.events) if e.at == "after"),
                         key=lambda i: self.events[i].after_s)
        for i in pending:
            if self._stop.wait(max(0.0, self._t0 + self.events[i].after_s - time.monotonic())):
                return
            self._send(i)

    def _send_due(self, at: str) -> None:
        for i, event in enumerate(self.events):
            if event.at == at:
                self._send(i)

    def _send(self, index: int) -> None:
        event = self.events[index]
        assert self._instance is not None
        sent_s = time.monotonic() - self._t0
        try:
            record = inject(self._instance, event.injection).as_dict()
            outcome: dict[str, Any] = {"sent": True, "sent_s": round(sent_s, 3), "record": record}
            log.info("injected %s %s (%.1f s after the workload started)", event.injection.kind,
                     event.when, sent_s)
        except CxlssdError as error:  # QEMU refused it (e.g. poison already there): say so, go on
            outcome = {"sent": False, "reason": str(error)}
            log.warning("injection %s %s failed: %s", event.injection.kind, event.when, error)
        with self._lock:
            self._done[index] = outcome

    def observations(self) -> dict[str, Any]:
        """Per injection: when it was sent and the guest's trace line showing it (None if
        none appeared within the timeout); the CXL trace events and kernel-log lines of
        the point; then the injected poison is cleared."""
        guest = self.platform.guest()
        sent = [i for i in range(len(self.events)) if self._done.get(i, {}).get("sent")]
        down = any(self.events[i].takes_down_cxl for i in sent)
        for memdev in [] if down else self._memdevs(Poison, sent):
            observe.trigger_poison_list(guest, memdev)
        lines = observe.wait_for_trace(guest, [expected_trace(self.events[i].injection) for i in sent],
                                       OBSERVE_TIMEOUT_S)
        seen = dict(zip(sent, lines, strict=True))
        injections = []
        for i, event in enumerate(self.events):
            outcome = self._done.get(i, {"sent": False, "reason": "the run stopped before its time"})
            entry = {"kind": event.injection.kind, "when": event.when,
                     "injection": event.injection.model_dump(), **outcome}
            if entry["sent"]:
                entry["observed"] = seen[i]
                if seen[i] is None:
                    log.warning("the guest showed no trace of %s %s within %.0f s", event.injection.kind,
                                event.when, OBSERVE_TIMEOUT_S)
            injections.append(entry)
        result = {
            "injections": injections,
            "trace": observe.trace_lines(guest),
            "kernel_log": observe.kernel_log_since(guest, self._since_uptime_s),
            "ok": all(e["sent"] and e["observed"] is not None for e in injections),
        }
        if not down:
            for i in sent:
                injection = self.events[i].injection
                if isinstance(injection, Poison):
                    memdev = self.platform.devices[injection.device].memdev
                    observe.clear_poison(guest, memdev, injection.dpa, injection.length)
        return result

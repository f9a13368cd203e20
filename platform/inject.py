"""Run-time fault injection through QEMU's CXL QMP commands (issue 7, QMP part).

Each kind of injection is a small frozen dataclass. Everything that can be checked
without the device is checked when it is built (known enum values, 64-byte
alignment, field widths); everything that needs the device (index exists, address
inside it) is checked by :func:`inject` before anything is sent. A problem is a
:class:`~cxlssd.errors.ConfigError` naming it and the fix; nothing reaches QEMU.

Targets: a :class:`~cxlssd.platform.machine.Platform` of this process (its QMP
connection), or a running instance by name from any process
(:class:`RunningInstance`: the instance's second QMP socket ``inject.sock``, since
QEMU's QMP socket serves one client at a time and the platform holds the first).

QMP argument names, types and enums are those of QEMU 10.0's ``qapi/cxl.json``,
checked against ``query-qmp-schema`` of the installed QEMU 10.0.2. The event
``type``/``transaction-type``/``descriptor``/status values QEMU passes through
unchecked (uint8); the tables here are CXL r3.0's (Tables 8-42..8-45), the same the
guest kernel (6.12) decodes in its ``cxl_*`` trace events. What the guest shows for
each kind is in docs/inject.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import json
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from cxlssd.errors import ConfigError, GuestError
from cxlssd.firmware.knobs import FirmwareKnob, knob_to_dict
from cxlssd.lifecycle import pid_alive
from cxlssd.paths import runtime_root
from cxlssd.platform.live import control_path, firmware_pid_path
from cxlssd.platform.machine import pid_file_alive

if TYPE_CHECKING:
    from cxlssd.platform.machine import Platform
    from cxlssd.platform.ssh import GuestSSH

# The device ids are given in platform/qemu.py (``id=cxl-vmem<i>``).
QOM_PATH_FORMAT = "/machine/peripheral/cxl-vmem{index}"
CACHELINE = 64  # QEMU requires poison start and length in 64-byte units
QMP_TIMEOUT_S = 15.0  # the inject socket serves one client at a time

# CxlEventLog (qapi/cxl.json); the value is the Event Record Severity, flags bits [1:0].
EVENT_LOGS: Mapping[str, int] = {"informational": 0, "warning": 1, "failure": 2, "fatal": 3}
# CxlUncorErrorType and CxlCorErrorType (qapi/cxl.json, QEMU 10.0).
UNCORRECTABLE_TYPES = (
    "cache-data-parity", "cache-address-parity", "cache-be-parity", "cache-data-ecc",
    "mem-data-parity", "mem-address-parity", "mem-be-parity", "mem-data-ecc",
    "reinit-threshold", "rsvd-encoding", "poison-received", "receiver-overflow",
    "internal", "cxl-ide-tx", "cxl-ide-rx",
)
CORRECTABLE_TYPES = (
    "cache-data-ecc", "mem-data-ecc", "crc-threshold", "retry-threshold",
    "cache-poison-received", "mem-poison-received", "physical",
)
HEADER_LOG_DWORDS = 32  # QEMU silently drops header dwords beyond 32

# CXL r3.0 Table 8-42, Event Record Flags above the severity bits.
RECORD_FLAGS: Mapping[str, int] = {
    "permanent": 1 << 2, "maintenance-needed": 1 << 3,
    "performance-degraded": 1 << 4, "hardware-replacement-needed": 1 << 5,
}
# Tables 8-43/8-44: Memory Event Descriptor bits.
DESCRIPTOR_BITS: Mapping[str, int] = {
    "uncorrectable": 1 << 0, "threshold": 1 << 1, "poison-list-overflow": 1 << 2,
}
# Tables 8-43/8-44: the low 6 bits of the Physical Address are flags.
DPA_VOLATILE, DPA_NOT_REPAIRABLE = 1 << 0, 1 << 1
GENERAL_MEDIA_TYPES: Mapping[str, int] = {
    "ecc-error": 0, "invalid-address": 1, "data-path-error": 2,
}
DRAM_TYPES: Mapping[str, int] = {
    "ecc-error": 0, "scrub-media-ecc-error": 1, "invalid-address": 2, "data-path-error": 3,
}
TRANSACTION_TYPES: Mapping[str, int] = {
    "unknown": 0, "host-read": 1, "host-write": 2, "host-scan-media": 3,
    "host-inject-poison": 4, "internal-media-scrub": 5, "internal-media-management": 6,
}
# Table 8-45 (event type) and Table 8-100 (health info).
MEMORY_MODULE_TYPES: Mapping[str, int] = {
    "health-status-change": 0, "media-status-change": 1, "life-used-change": 2,
    "temperature-change": 3, "data-path-error": 4, "lsa-error": 5,
}
HEALTH_STATUS_BITS: Mapping[str, int] = {
    "maintenance-needed": 1 << 0, "performance-degraded": 1 << 1, "replacement-needed": 1 << 2,
}
MEDIA_STATUS: Mapping[str, int] = {
    "normal": 0, "not-ready": 1, "write-persistency-lost": 2, "all-data-lost": 3,
    "write-persistency-loss-power-loss": 4, "write-persistency-loss-shutdown": 5,
    "write-persistency-loss-imminent": 6, "all-data-loss-power-loss": 7,
    "all-data-loss-shutdown": 8, "all-data-loss-imminent": 9,
}


# -- value checks ------------------------------------------------------------------


def _did_you_mean(value: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(value, known, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _name_or_number(what: str, value: int | str, known: Mapping[str, int]) -> int:
    """An enum given by name (``ecc-error``) or by number (0, ``0x0``); must be known."""
    listing = ", ".join(f"{name} ({number})" for name, number in known.items())
    number = value
    if isinstance(value, str):
        if value in known:
            return known[value]
        try:
            number = int(value, 0)
        except ValueError:
            raise ConfigError(
                f"{what} {value!r} is unknown{_did_you_mean(value, list(known))}; known: {listing}"
            ) from None
    if isinstance(number, bool) or number not in known.values():
        raise ConfigError(f"{what} {value} is not a known value; use one of {listing}")
    return int(number)


def _unsigned(what: str, value: int, bits: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << bits:
        raise ConfigError(
            f"{what} {value!r} does not fit the {bits}-bit field; use 0..{(1 << bits) - 1:#x}"
        )
    return value


def _mask(what: str, value: int, allowed: Mapping[str, int]) -> int:
    """A bit mask whose set bits must all be defined in ``allowed``."""
    every = sum(allowed.values())
    if not isinstance(value, int) or isinstance(value, bool) or value < 0 or value & ~every:
        bits = ", ".join(f"{name}={bit:#x}" for name, bit in allowed.items())
        raise ConfigError(f"{what} {value!r} sets undefined bits; combine {bits} (at most {every:#x})")
    return value


def _cacheline_aligned(what: str, value: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{what} {value!r} must be a non-negative address, e.g. 0x1000")
    if value % CACHELINE:
        down = value - value % CACHELINE
        raise ConfigError(
            f"{what} {value:#x} is not 64-byte aligned (QEMU requires it); "
            f"use {down:#x} or {down + CACHELINE:#x}"
        )
    return value


# -- the device an injection targets -------------------------------------------------


@dataclass(frozen=True)
class DeviceView:
    """What an injection needs to know about a CXL device: its QOM path and size,
    and (once the guest has set it up) where the guest sees it."""

    index: int
    size_bytes: int
    memdev: str | None = None
    region: str | None = None
    hpa_base: int | None = None
    dpa_base: int = 0

    @property
    def qom_path(self) -> str:
        return QOM_PATH_FORMAT.format(index=self.index)

    def hpa(self, dpa: int) -> int | None:
        """The guest physical address of ``dpa`` (1-way interleave), if the region is up."""
        return None if self.hpa_base is None else self.hpa_base + dpa - self.dpa_base

    def check_range(self, what: str, dpa: int, length: int) -> None:
        if dpa + length > self.size_bytes:
            size_mib = self.size_bytes >> 20
            raise ConfigError(
                f"{what} {dpa:#x}+{length:#x} is outside device {self.index} ({size_mib} MiB: "
                f"DPA 0x0..{self.size_bytes - 1:#x}); use an address below "
                f"{self.size_bytes - length:#x}"
            )


# -- injection kinds -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Injection:
    """Base of every injection kind: ``device`` is the CXL device index (0 = first)."""

    kind: ClassVar[str]
    command: ClassVar[str]
    device: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.device, int) or self.device < 0:
            raise ConfigError(f"device {self.device!r} must be a device index (0, 1, ...)")

    def check_device(self, device: DeviceView) -> None:
        """Checks that need the device (address range); nothing by default."""

    def arguments(self) -> dict[str, Any]:
        """The QMP arguments except ``path``."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class Poison(Injection):
    """Poison ``length`` bytes at device physical address ``dpa`` (both 64-byte units).
    The guest reads the device's poison list through the mailbox."""

    kind: ClassVar[str] = "poison"
    command: ClassVar[str] = "cxl-inject-poison"
    dpa: int
    length: int = CACHELINE

    def __post_init__(self) -> None:
        super().__post_init__()
        _cacheline_aligned("poison DPA", self.dpa)
        if not isinstance(self.length, int) or self.length <= 0 or self.length % CACHELINE:
            raise ConfigError(
                f"poison length {self.length!r} must be a positive multiple of 64 bytes "
                "(QEMU's unit), e.g. 64 or 4096"
            )

    def check_device(self, device: DeviceView) -> None:
        device.check_range("poison DPA", self.dpa, self.length)

    def arguments(self) -> dict[str, Any]:
        return {"start": self.dpa, "length": self.length}


@dataclass(frozen=True, kw_only=True)
class UncorrectableError:
    """One uncorrectable CXL RAS error and its header log (up to 32 dwords)."""

    error_type: str
    header: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.error_type not in UNCORRECTABLE_TYPES:
            raise ConfigError(
                f"uncorrectable error type {self.error_type!r} is unknown"
                f"{_did_you_mean(str(self.error_type), UNCORRECTABLE_TYPES)}; "
                f"known: {', '.join(UNCORRECTABLE_TYPES)}"
            )
        if len(self.header) > HEADER_LOG_DWORDS:
            raise ConfigError(
                f"uncorrectable error header has {len(self.header)} dwords; "
                f"the header log holds at most {HEADER_LOG_DWORDS}"
            )
        for dword in self.header:
            _unsigned("uncorrectable error header dword", dword, 32)


@dataclass(frozen=True, kw_only=True)
class Uncorrectable(Injection):
    """Uncorrectable CXL RAS errors, reported by AER as an uncorrectable internal
    error (fatal severity by default): the guest resets the link and takes the
    device's memory offline (see docs/inject.md)."""

    kind: ClassVar[str] = "uncorrectable"
    command: ClassVar[str] = "cxl-inject-uncorrectable-errors"
    errors: tuple[UncorrectableError, ...]

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.errors:
            raise ConfigError("an uncorrectable injection needs at least one error type, e.g. mem-data-ecc")

    def arguments(self) -> dict[str, Any]:
        return {"errors": [{"type": e.error_type, "header": list(e.header)} for e in self.errors]}


@dataclass(frozen=True, kw_only=True)
class Correctable(Injection):
    """One correctable CXL RAS error, reported by AER as a corrected internal error.
    The guest sees it only if that error is unmasked in the device's AER capability
    (:func:`unmask_corrected_internal_errors`; the PCIe default masks it)."""

    kind: ClassVar[str] = "correctable"
    command: ClassVar[str] = "cxl-inject-correctable-error"
    error_type: str

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.error_type not in CORRECTABLE_TYPES:
            raise ConfigError(
                f"correctable error type {self.error_type!r} is unknown"
                f"{_did_you_mean(str(self.error_type), CORRECTABLE_TYPES)}; "
                f"known: {', '.join(CORRECTABLE_TYPES)}"
            )

    def arguments(self) -> dict[str, Any]:
        return {"type": self.error_type}


@dataclass(frozen=True, kw_only=True)
class _Event(Injection):
    """Common part of the event records: the log they go to and the record flags."""

    log: str = "informational"
    # Event Record Flags; None = just the severity of ``log`` (bits [1:0]).
    flags: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.log not in EVENT_LOGS:
            raise ConfigError(
                f"event log {self.log!r} is unknown{_did_you_mean(str(self.log), list(EVENT_LOGS))}; "
                f"known: {', '.join(EVENT_LOGS)}"
            )
        if self.flags is not None:
            _mask(f"{self.kind} flags", self.flags, {"severity": 0x3, **RECORD_FLAGS})

    def _common(self) -> dict[str, Any]:
        flags = EVENT_LOGS[self.log] if self.flags is None else self.flags
        return {"log": self.log, "flags": flags}


@dataclass(frozen=True, kw_only=True)
class _MediaEvent(_Event):
    """Common part of the general-media and DRAM event records (Tables 8-43, 8-44)."""

    dpa: int
    descriptor: int = DESCRIPTOR_BITS["uncorrectable"]
    event_type: int | str = "ecc-error"
    transaction_type: int | str = "host-read"
    volatile: bool = True  # the platform's devices are volatile
    not_repairable: bool = False
    channel: int | None = None
    rank: int | None = None
    _types: ClassVar[Mapping[str, int]] = GENERAL_MEDIA_TYPES

    def __post_init__(self) -> None:
        super().__post_init__()
        _cacheline_aligned(f"{self.kind} DPA", self.dpa)
        _mask(f"{self.kind} descriptor", self.descriptor, DESCRIPTOR_BITS)
        _name_or_number(f"{self.kind} event type", self.event_type, self._types)
        _name_or_number(f"{self.kind} transaction type", self.transaction_type, TRANSACTION_TYPES)
        for name in ("channel", "rank"):
            value = getattr(self, name)
            if value is not None:
                _unsigned(f"{self.kind} {name}", value, 8)

    def check_device(self, device: DeviceView) -> None:
        device.check_range(f"{self.kind} DPA", self.dpa, CACHELINE)

    def _media(self) -> dict[str, Any]:
        address = self.dpa | (DPA_VOLATILE if self.volatile else 0)
        address |= DPA_NOT_REPAIRABLE if self.not_repairable else 0
        arguments = {
            **self._common(),
            "dpa": address,
            "descriptor": self.descriptor,
            "type": _name_or_number("event type", self.event_type, self._types),
            "transaction-type": _name_or_number(
                "transaction type", self.transaction_type, TRANSACTION_TYPES
            ),
        }
        for name in ("channel", "rank"):
            if getattr(self, name) is not None:
                arguments[name] = getattr(self, name)
        return arguments


@dataclass(frozen=True, kw_only=True)
class GeneralMediaEvent(_MediaEvent):
    """A General Media Event record (CXL r3.0 8.2.9.2.1.1), signalled by interrupt."""

    kind: ClassVar[str] = "general-media"
    command: ClassVar[str] = "cxl-inject-general-media-event"
    log: str = "failure"
    device_mask: int | None = None  # QMP "device": the devices of the rank (24 bits)
    component_id: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.device_mask is not None:
            _unsigned("general-media device mask", self.device_mask, 24)
        if self.component_id is not None and (
            not self.component_id.isascii() or not 0 < len(self.component_id) <= 15
        ):
            raise ConfigError(
                f"general-media component id {self.component_id!r} must be 1-15 ASCII characters "
                "(QEMU copies at most 15 into the 16-byte field)"
            )

    def arguments(self) -> dict[str, Any]:
        arguments = self._media()
        if self.device_mask is not None:
            arguments["device"] = self.device_mask
        if self.component_id is not None:
            arguments["component-id"] = self.component_id
        return arguments


@dataclass(frozen=True, kw_only=True)
class DramEvent(_MediaEvent):
    """A DRAM Event record (CXL r3.0 8.2.9.2.1.2), signalled by interrupt."""

    kind: ClassVar[str] = "dram"
    command: ClassVar[str] = "cxl-inject-dram-event"
    _types: ClassVar[Mapping[str, int]] = DRAM_TYPES
    log: str = "failure"
    nibble_mask: int | None = None
    bank_group: int | None = None
    bank: int | None = None
    row: int | None = None
    column: int | None = None
    correction_mask: tuple[int, ...] = field(default=())

    # QMP name, record width in bits (Table 8-44)
    _optional: ClassVar[Mapping[str, tuple[str, int]]] = {
        "nibble_mask": ("nibble-mask", 24), "bank_group": ("bank-group", 8),
        "bank": ("bank", 8), "row": ("row", 24), "column": ("column", 16),
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, (_, bits) in self._optional.items():
            value = getattr(self, name)
            if value is not None:
                _unsigned(f"dram {name.replace('_', '-')}", value, bits)
        if len(self.correction_mask) > 4:
            raise ConfigError(
                f"dram correction mask has {len(self.correction_mask)} words; the record holds at most 4"
            )
        for word in self.correction_mask:
            _unsigned("dram correction mask word", word, 64)

    def arguments(self) -> dict[str, Any]:
        arguments = self._media()
        for name, (qmp_name, _) in self._optional.items():
            if getattr(self, name) is not None:
                arguments[qmp_name] = getattr(self, name)
        if self.correction_mask:
            arguments["correction-mask"] = list(self.correction_mask)
        return arguments


@dataclass(frozen=True, kw_only=True)
class MemoryModuleEvent(_Event):
    """A Memory Module Event record (CXL r3.0 8.2.9.2.1.3): a device health snapshot."""

    kind: ClassVar[str] = "memory-module"
    command: ClassVar[str] = "cxl-inject-memory-module-event"
    event_type: int | str = "health-status-change"
    health_status: int = 0
    media_status: int | str = "normal"
    additional_status: int = 0
    life_used: int = 0
    temperature: int = 25
    dirty_shutdown_count: int = 0
    corrected_volatile_error_count: int = 0
    corrected_persistent_error_count: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        _name_or_number("memory-module event type", self.event_type, MEMORY_MODULE_TYPES)
        _mask("memory-module health status", self.health_status, HEALTH_STATUS_BITS)
        _name_or_number("memory-module media status", self.media_status, MEDIA_STATUS)
        status = _unsigned("memory-module additional status", self.additional_status, 6)
        # bits [1:0] life used, [3:2] temperature: 0 normal, 1 warning, 2 critical, 3 reserved
        if status & 0x3 == 0x3 or (status >> 2) & 0x3 == 0x3:
            raise ConfigError(
                f"memory-module additional status {status:#x} uses the reserved value 3 in "
                "bits [1:0] (life used) or [3:2] (temperature); use 0 normal, 1 warning, 2 critical"
            )
        if not isinstance(self.life_used, int) or not 0 <= self.life_used <= 100:
            raise ConfigError(f"memory-module life used {self.life_used!r} must be a percentage 0..100")
        if not isinstance(self.temperature, int) or not -(1 << 15) <= self.temperature < 1 << 15:
            raise ConfigError(
                f"memory-module temperature {self.temperature!r} must fit 16 bits signed (degrees C)"
            )
        for name in (
            "dirty_shutdown_count", "corrected_volatile_error_count", "corrected_persistent_error_count"
        ):
            _unsigned(f"memory-module {name.replace('_', '-')}", getattr(self, name), 32)

    def arguments(self) -> dict[str, Any]:
        return {
            **self._common(),
            "type": _name_or_number("event type", self.event_type, MEMORY_MODULE_TYPES),
            "health-status": self.health_status,
            "media-status": _name_or_number("media status", self.media_status, MEDIA_STATUS),
            "additional-status": self.additional_status,
            "life-used": self.life_used,
            "temperature": self.temperature,
            "dirty-shutdown-count": self.dirty_shutdown_count,
            "corrected-volatile-error-count": self.corrected_volatile_error_count,
            "corrected-persistent-error-count": self.corrected_persistent_error_count,
        }


KINDS: Mapping[str, type[Injection]] = {
    kind.kind: kind
    for kind in (Poison, Uncorrectable, Correctable, GeneralMediaEvent, DramEvent, MemoryModuleEvent)
}


# -- targets -------------------------------------------------------------------------


def running_instances() -> list[str]:
    """Names of the instances of this runtime root whose platform and QEMU are alive."""
    names = []
    for rundir in sorted(runtime_root().iterdir()):
        if (
            (rundir / "instance.json").is_file()
            and pid_file_alive(rundir / "owner.pid")
            and pid_file_alive(rundir / "qemu.pid")
        ):
            names.append(rundir.name)
    return names


@dataclass(frozen=True)
class RunningInstance:
    """A platform instance running in another process, reached through its
    ``inject.sock`` QMP endpoint; found by name (``default-ab12cd``)."""

    name: str
    inject_socket: Path
    devices: tuple[DeviceView, ...]

    @classmethod
    def find(cls, name: str) -> RunningInstance:
        running = running_instances()
        if name not in running:
            listing = ", ".join(running) if running else "none"
            raise ConfigError(
                f"instance {name!r} is not running (running instances: {listing}); "
                "start one with ./cxlssd guest shell or a Platform, and pass its name"
            )
        info = json.loads((runtime_root() / name / "instance.json").read_text())
        if "inject_socket" not in info:
            raise ConfigError(
                f"instance {name!r} was started without an inject endpoint (an older cxlssd); restart it"
            )
        devices = tuple(
            DeviceView(
                index=d["index"], size_bytes=d["size_bytes"], memdev=d.get("memdev"),
                region=d.get("region"), hpa_base=d.get("hpa_base"), dpa_base=d.get("dpa_base", 0),
            )
            for d in info.get("devices", [])
        )
        return cls(name=name, inject_socket=Path(info["inject_socket"]), devices=devices)

    def execute(self, command: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return asyncio.run(self._execute(command, arguments))

    async def _execute(self, command: str, arguments: dict[str, Any]) -> dict[str, Any]:
        from qemu.qmp import ConnectError, QMPClient, QMPError

        client = QMPClient(f"cxlssd-inject-{os.getpid()}")
        try:
            await asyncio.wait_for(client.connect(str(self.inject_socket)), QMP_TIMEOUT_S)
            return await _raw_reply(client, command, arguments)
        except TimeoutError:
            raise GuestError(
                f"instance {self.name}'s QMP endpoint {self.inject_socket} did not answer within "
                f"{QMP_TIMEOUT_S:.0f} s (another inject still connected, or QEMU is stuck); retry"
            ) from None
        except (OSError, ConnectError, QMPError) as error:
            raise GuestError(
                f"cannot talk to instance {self.name} over {self.inject_socket} ({error}); "
                "is it still running?"
            ) from None
        finally:
            with contextlib.suppress(Exception):
                await client.disconnect()


async def _raw_reply(client: Any, command: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """QEMU's reply as a dict: ``{"return": ...}`` or ``{"error": {"desc": ...}}``."""
    from qemu.qmp import ExecuteError

    try:
        result = await asyncio.wait_for(client.execute(command, arguments), QMP_TIMEOUT_S)
    except ExecuteError as error:
        return {"error": {"class": error.error_class, "desc": str(error)}}
    return {"return": result}


@dataclass(frozen=True)
class InjectionRecord:
    """What was sent, to whom, and (when the region is up) the guest physical address."""

    instance: str
    kind: str
    command: str
    arguments: dict[str, Any]
    hpa: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _platform_devices(platform: Platform) -> tuple[DeviceView, ...]:
    found = {d.index: d for d in platform.devices}
    views = []
    for index, config in enumerate(platform.config.cxl_devices):
        d = found.get(index)
        views.append(
            DeviceView(
                index=index, size_bytes=config.size_bytes,
                memdev=d.memdev if d else None, region=d.region if d else None,
                hpa_base=d.hpa_base if d else None, dpa_base=d.dpa_base if d else 0,
            )
        )
    return tuple(views)


def prepare(
    injection: Injection, devices: Sequence[DeviceView], instance: str
) -> tuple[DeviceView, dict[str, Any]]:
    """Check ``injection`` against the instance's devices; the device and the full
    QMP arguments (with ``path``). Raises :class:`ConfigError`; sends nothing."""
    by_index = {d.index: d for d in devices}
    if injection.device not in by_index:
        indexes = ", ".join(str(i) for i in sorted(by_index)) or "none"
        raise ConfigError(
            f"device {injection.device} does not exist: instance {instance} has {len(by_index)} "
            f"CXL device(s) (index {indexes}); use --device with one of them"
        )
    device = by_index[injection.device]
    injection.check_device(device)
    return device, {"path": device.qom_path, **injection.arguments()}


@dataclass(frozen=True)
class FirmwareKill:
    """A process fault: SIGKILL the firmware attached to the instance. The run using it
    stops at once with an error naming the cause (docs/live.md); nothing is left running."""

    kind: ClassVar[str] = "firmware-kill"


def _attached(target: Platform | RunningInstance, path: Callable[[Path], Path]) -> Path:
    """``path(rundir)`` of the firmware attached to ``target``; ConfigError if none is."""
    rundir = runtime_root() / target.name if isinstance(target, RunningInstance) else target.rundir
    found = path(rundir) if rundir is not None else None
    if found is None or not found.exists():
        raise ConfigError(
            f"no firmware is attached to instance {target.name}: this acts on a running "
            "firmware; attach one first (./cxlssd guest exec --design NAME, ./cxlssd run)"
        )
    return found


def kill_firmware(target: Platform | RunningInstance) -> InjectionRecord:
    """SIGKILL the firmware process attached to ``target``."""
    pid_file = _attached(target, firmware_pid_path)
    pid = int(pid_file.read_text())
    if not pid_alive(pid):
        raise ConfigError(f"the firmware of instance {target.name} (pid {pid}) is already gone")
    os.kill(pid, signal.SIGKILL)
    return InjectionRecord(
        instance=target.name, kind=FirmwareKill.kind, command="SIGKILL", arguments={"pid": pid}
    )


def send_knob(
    target: Platform | RunningInstance, knob: FirmwareKnob, at_ms: float | None = None
) -> InjectionRecord:
    """Hand ``knob`` to the firmware attached to ``target`` (its control file); with
    ``at_ms``, the firmware applies it that long (modelled) after its first request."""
    control = _attached(target, control_path)
    arguments = knob_to_dict(knob) if at_ms is None else {**knob_to_dict(knob), "at_ms": at_ms}
    with open(control, "a") as stream:  # one short line: a single append, never interleaved
        stream.write(json.dumps(arguments) + "\n")
    return InjectionRecord(
        instance=target.name, kind=knob.kind, command="firmware-knob", arguments=arguments
    )


def inject(
    target: Platform | RunningInstance | str, injection: Injection | FirmwareKnob | FirmwareKill
) -> InjectionRecord:
    """Validate ``injection`` against ``target``'s devices, then send it over QMP (or,
    for a firmware knob, to the attached firmware).
    ``target``: a Platform of this process, a RunningInstance, or an instance name."""
    if isinstance(target, str):
        target = RunningInstance.find(target)
    if isinstance(injection, FirmwareKill):
        return kill_firmware(target)
    if not isinstance(injection, Injection):
        return send_knob(target, injection)
    if isinstance(target, RunningInstance):
        device, arguments = prepare(injection, target.devices, target.name)
        reply = target.execute(injection.command, arguments)
        name = target.name
    else:
        device, arguments = prepare(injection, _platform_devices(target), target.name)
        reply = target.qmp.cmd_raw(injection.command, arguments)
        name = target.name
    if "error" in reply:
        raise ConfigError(
            f"QEMU refused {injection.command} on {name} device {device.index}: "
            f"{reply['error'].get('desc', reply['error'])}"
            + (
                "; poison ranges must not overlap poison injected before"
                if "Overlap" in str(reply["error"])
                else ""
            )
        )
    dpa = getattr(injection, "dpa", None)
    return InjectionRecord(
        instance=name,
        kind=injection.kind,
        command=injection.command,
        arguments=arguments,
        hpa=device.hpa(dpa) if dpa is not None else None,
    )


# -- guest side ------------------------------------------------------------------------

# Clears Corrected Internal Error (bit 14) in the AER Correctable Error Mask (and Status) of the
# memdev's PCI function. PCIe masks it by default and Linux leaves it masked for
# endpoints, so without this QEMU records correctable CXL errors but sends no message.
_UNMASK_SCRIPT = r"""
import os, struct, sys
pci = os.path.basename(os.path.dirname(os.path.realpath(f"/sys/bus/cxl/devices/{sys.argv[1]}")))
fd = os.open(f"/sys/bus/pci/devices/{pci}/config", os.O_RDWR)
offset = 0x100
while offset:
    header = struct.unpack("<I", os.pread(fd, 4, offset))[0]
    if header & 0xFFFF == 1:  # AER extended capability
        os.pwrite(fd, struct.pack("<I", 1 << 14), offset + 0x10)  # clear a stale status (RW1C)
        mask = struct.unpack("<I", os.pread(fd, 4, offset + 0x14))[0]
        os.pwrite(fd, struct.pack("<I", mask & ~(1 << 14)), offset + 0x14)
        print(pci)
        sys.exit(0)
    offset = header >> 20
sys.exit(f"{pci} has no AER capability")
"""


def unmask_corrected_internal_errors(guest: GuestSSH, memdev: str) -> str:
    """Let correctable CXL errors of ``memdev`` (``mem0``) reach the guest's AER
    driver; returns the device's PCI address."""
    status, out, err = guest.run(["python3", "-c", _UNMASK_SCRIPT, memdev])
    if status != 0:
        raise GuestError(f"cannot unmask corrected internal errors of {memdev}: {err.decode().strip()}")
    return out.decode().strip()

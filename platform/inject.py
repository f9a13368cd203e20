"""Run-time fault injection through QEMU's CXL QMP commands (issue 7, QMP part),
and dynamic capacity add/release on a DCD (``dc-add``, ``dc-release``).

Each kind of injection is a frozen configuration model (:mod:`cxlssd.models`): its
fields, their descriptions and checks are the one definition the CLI's options
(``platform/inject_commands.py``) and the scenarios' YAML (``experiments/scenario.py``)
are made from. Everything that can be checked without the device is checked when it
is built (known enum values, 64-byte or DC block alignment, field widths); everything
that needs the device (index exists, address inside it, DC regions, read from QEMU's
QOM) is checked by :func:`inject` before anything is sent. A problem is a
:class:`~cxlssd.errors.ConfigError` naming the field, the value and the fix; nothing
reaches QEMU.

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

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from cxlssd.errors import ConfigError, GuestError
from cxlssd.firmware.knobs import DeviceShape, FirmwareKnob, check_fits, knob_to_dict
from cxlssd.firmware.profile import Profile, load_profile
from cxlssd.lifecycle import ProcessId
from cxlssd.models import Cli, ConfigModel
from cxlssd.paths import runtime_root
from cxlssd.platform.config import DC_MAX_REGIONS, CxlDeviceConfig
from cxlssd.platform.live import attached_firmware_path, control_path
from cxlssd.platform.machine import pid_file_alive
from cxlssd.validation import did_you_mean, format_size, size_bytes
from cxlssd.yamlfile import short_repr

if TYPE_CHECKING:
    from cxlssd.platform.machine import Platform
    from cxlssd.platform.ssh import GuestSSH

# The device ids are given in platform/qemu.py (``id=cxl-vmem<i>``).
QOM_PATH_FORMAT = "/machine/peripheral/cxl-vmem{index}"
CACHELINE = 64  # QEMU requires poison start and length in 64-byte units
# QEMU 10.0 gives every DC region this block size (cxl_create_dc_regions); extent
# offsets and lengths must be multiples of it.
DC_BLOCK_BYTES = 2 << 20
DC_MAX_EXTENTS = 512  # QEMU's CXL_NUM_EXTENTS_SUPPORTED, per device
# Why QEMU refuses a dynamic-capacity request about a pending extent: the host has not
# answered the add (Add Dynamic Capacity Response, opcode 4802h), and this guest kernel
# never does.
DC_PENDING_HINT = (
    "the host has not accepted the extents added there: the guest kernel (6.12) has no DCD "
    "support and never answers a dc-add, so they stay pending while the instance runs "
    "(docs/inject.md, Dynamic capacity)"
)
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


# -- value checks (validators: the value and the fix; the model adds the key path) ----


def _name_or_number(what: str, known: Mapping[str, int], value: int | str) -> int:
    """An enum given by name (``ecc-error``) or by number (0, ``0x0``); must be known."""
    listing = ", ".join(f"{name} ({number})" for name, number in known.items())
    number = value
    if isinstance(value, str):
        if value in known:
            return known[value]
        try:
            number = int(value, 0)
        except ValueError:
            raise ValueError(
                f"{what} {value!r} is unknown{did_you_mean(value, list(known))}; known: {listing}"
            ) from None
    if isinstance(number, bool) or number not in known.values():
        raise ValueError(f"{what} {value} is not a known value; use one of {listing}")
    return int(number)


def _checked_name_or_number(what: str, known: Mapping[str, int]) -> AfterValidator:
    """Checks a name or number and keeps it as given (records show the name)."""
    def check(value: int | str) -> int | str:
        _name_or_number(what, known, value)
        return value

    return AfterValidator(check)


def _known_name(what: str, known: Sequence[str]) -> AfterValidator:
    def check(value: str) -> str:
        if value not in known:
            raise ValueError(f"{what} {value!r} is unknown{did_you_mean(value, known)}; "
                             f"known: {', '.join(known)}")
        return value

    return AfterValidator(check)


def _unsigned(bits: int) -> AfterValidator:
    def check(value: int) -> int:
        if not 0 <= value < 1 << bits:
            raise ValueError(f"{value!r} does not fit the {bits}-bit field; use 0..{(1 << bits) - 1:#x}")
        return value

    return AfterValidator(check)


def _bit_names(names: Mapping[str, int]) -> BeforeValidator:
    """A bit mask may be given as comma-separated bit names (``permanent,maintenance-needed``)."""
    def from_names(value: object) -> object:
        if not isinstance(value, str):
            return value
        with contextlib.suppress(ValueError):
            return int(value, 0)
        unknown = [name for name in value.split(",") if name not in names]
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not one of {', '.join(names)} (or give a number)")
        return sum({names[name] for name in value.split(",")})

    return BeforeValidator(from_names)


def _defined_bits(allowed: Mapping[str, int]) -> AfterValidator:
    """A bit mask whose set bits must all be defined in ``allowed``."""
    every = sum(allowed.values())

    def check(value: int) -> int:
        if value < 0 or value & ~every:
            bits = ", ".join(f"{name}={bit:#x}" for name, bit in allowed.items())
            raise ValueError(f"{value!r} sets undefined bits; combine {bits} (at most {every:#x})")
        return value

    return AfterValidator(check)


def _multiple_of(unit_bytes: int, negative: str, not_multiple: str) -> AfterValidator:
    """A non-negative multiple of ``unit_bytes`` (else ``value`` plus ``negative``, or plus
    ``not_multiple`` and the two nearest multiples)."""
    def check(value: int) -> int:
        if value < 0:
            raise ValueError(f"{value!r} {negative}")
        if value % unit_bytes:
            down = value - value % unit_bytes
            raise ValueError(f"{value:#x} {not_multiple}; use {down:#x} or {down + unit_bytes:#x}")
        return value

    return AfterValidator(check)


def _device_index(value: int) -> int:
    if value < 0:
        raise ValueError(f"{value!r} must be a device index (0, 1, ...)")
    return value


Dpa = Annotated[StrictInt, _multiple_of(CACHELINE, "must be a non-negative address, e.g. 0x1000",
                                          "is not 64-byte aligned (QEMU requires it)")]
U6 = Annotated[StrictInt, _unsigned(6)]
U8 = Annotated[StrictInt, _unsigned(8)]
U16 = Annotated[StrictInt, _unsigned(16)]
U24 = Annotated[StrictInt, _unsigned(24)]
U32 = Annotated[StrictInt, _unsigned(32)]
U64 = Annotated[StrictInt, _unsigned(64)]
# Bit masks: a number or bit names (the CLI passes the text on: the model reads names).
EventFlags = Annotated[StrictInt, _bit_names(RECORD_FLAGS), _defined_bits({"severity": 0x3, **RECORD_FLAGS}),
                       Cli(parse=str)]
Descriptor = Annotated[StrictInt, _bit_names(DESCRIPTOR_BITS), _defined_bits(DESCRIPTOR_BITS), Cli(parse=str)]
HealthStatus = Annotated[StrictInt, _bit_names(HEALTH_STATUS_BITS), _defined_bits(HEALTH_STATUS_BITS),
                         Cli(parse=str)]
NameOrNumber = StrictInt | StrictStr
TransactionType = Annotated[NameOrNumber, _checked_name_or_number("transaction type", TRANSACTION_TYPES)]


# -- the device an injection targets -------------------------------------------------


@dataclass(frozen=True)
class DcLayout:
    """A DCD's dynamic capacity as QEMU lays it out: ``regions`` DC regions of
    ``region_bytes`` each, one after the other from DPA ``base_dpa`` (after the
    static capacity), every one with 2 MiB blocks."""

    regions: int
    region_bytes: int
    base_dpa: int

    def region_dpa(self, region: int) -> int:
        return self.base_dpa + region * self.region_bytes

    @classmethod
    def of_config(cls, device: CxlDeviceConfig) -> DcLayout | None:
        """The layout QEMU gives ``device`` (``platform/qemu.py``); None if not a DCD."""
        dynamic = device.dynamic_capacity
        if dynamic is None:
            return None
        return cls(regions=dynamic.regions, region_bytes=dynamic.region_bytes, base_dpa=device.size_bytes)


@dataclass(frozen=True)
class DeviceView:
    """What an injection needs to know about a CXL device: its QOM path and (static)
    size, (once the guest has set it up) where the guest sees it, and, for dynamic
    capacity kinds, its DC layout (None: not a DCD)."""

    index: int
    size_bytes: int
    memdev: str | None = None
    region: str | None = None
    hpa_base: int | None = None
    dpa_base: int = 0
    dynamic_capacity: DcLayout | None = None

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

_DEVICE_HELP = "CXL device index (0 = the first)"


class Injection(ConfigModel):
    """Base of every injection kind: ``device`` is the CXL device index (0 = first)."""

    kind: ClassVar[str]
    command: ClassVar[str]
    # Words of a QEMU refusal, and what to tell the user about it.
    refusal_hints: ClassVar[Mapping[str, str]] = {}
    # Whether check_device needs DeviceView.dynamic_capacity (read from QEMU first).
    needs_dc_layout: ClassVar[bool] = False
    device: Annotated[StrictInt, AfterValidator(_device_index)] = Field(default=0, description=_DEVICE_HELP)

    def check_device(self, device: DeviceView) -> None:
        """Checks that need the device (address range); nothing by default."""

    def arguments(self) -> dict[str, Any]:
        """The QMP arguments except ``path``."""
        raise NotImplementedError


class Poison(Injection):
    """Poison a device address range: ``length`` bytes at device physical address
    ``dpa`` (both 64-byte units). The guest reads the device's poison list through the
    mailbox."""

    kind: ClassVar[str] = "poison"
    command: ClassVar[str] = "cxl-inject-poison"
    refusal_hints: ClassVar[Mapping[str, str]] = {
        "Overlap": "poison ranges must not overlap poison injected before"
    }
    dpa: Dpa = Field(description="device physical address, 64-byte aligned")
    length: StrictInt = Field(default=CACHELINE, description="bytes, a multiple of 64")

    @field_validator("length")
    @classmethod
    def _length(cls, value: int) -> int:
        if value <= 0 or value % CACHELINE:
            raise ValueError(
                f"{value!r} must be a positive multiple of 64 bytes (QEMU's unit), e.g. 64 or 4096"
            )
        return value

    def check_device(self, device: DeviceView) -> None:
        device.check_range("poison DPA", self.dpa, self.length)

    def arguments(self) -> dict[str, Any]:
        return {"start": self.dpa, "length": self.length}


class UncorrectableError(ConfigModel):
    """One uncorrectable CXL RAS error and its header log (up to 32 dwords); in YAML
    also just its type (``mem-data-ecc``)."""

    label: ClassVar[str] = "uncorrectable error"
    error_type: Annotated[StrictStr, _known_name("uncorrectable error type", UNCORRECTABLE_TYPES)] = Field(
        description=f"error type: {', '.join(UNCORRECTABLE_TYPES)}"
    )
    header: Annotated[tuple[U32, ...], Cli(metavar="DW,DW,...")] = Field(
        default=(), description="header log dwords (at most 32)"
    )

    @model_validator(mode="before")
    @classmethod
    def _type_alone(cls, raw: object) -> object:
        if isinstance(raw, str):
            return {"error_type": raw}
        if not isinstance(raw, Mapping | UncorrectableError):
            raise ValueError("an uncorrectable error is a type such as mem-data-ecc, or "
                             f"{{error_type: TYPE, header: [DWORDS]}}; got {short_repr(raw)}")
        return raw

    @field_validator("header")
    @classmethod
    def _header(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if len(value) > HEADER_LOG_DWORDS:
            raise ValueError(f"{len(value)} dwords; the header log holds at most {HEADER_LOG_DWORDS}")
        return value


class Uncorrectable(Injection):
    """Uncorrectable RAS error(s): AER fatal, the guest resets the link and loses the
    region. Reported by AER as an uncorrectable internal error (fatal severity by
    default): the guest takes the device's memory offline (see docs/inject.md)."""

    kind: ClassVar[str] = "uncorrectable"
    command: ClassVar[str] = "cxl-inject-uncorrectable-errors"
    errors: Annotated[
        tuple[UncorrectableError, ...], Cli(flag="--type", metavar="TYPE", item_key="error_type")
    ] = Field(description="one or more errors: each an error type, or {error_type, header}")

    @field_validator("errors")
    @classmethod
    def _some(cls, value: tuple[UncorrectableError, ...]) -> tuple[UncorrectableError, ...]:
        if not value:
            raise ValueError("an uncorrectable injection needs at least one error type, e.g. mem-data-ecc")
        return value

    def arguments(self) -> dict[str, Any]:
        return {"errors": [{"type": e.error_type, "header": list(e.header)} for e in self.errors]}


class Correctable(Injection):
    """A correctable RAS error, reported by AER as a corrected internal error. The
    guest sees it only if that error is unmasked in the device's AER capability
    (:func:`unmask_corrected_internal_errors`; the PCIe default masks it)."""

    kind: ClassVar[str] = "correctable"
    command: ClassVar[str] = "cxl-inject-correctable-error"
    error_type: Annotated[StrictStr, _known_name("correctable error type", CORRECTABLE_TYPES),
                          Cli(flag="--type", metavar="TYPE")] = Field(
        description=f"error type: {', '.join(CORRECTABLE_TYPES)}"
    )

    def arguments(self) -> dict[str, Any]:
        return {"type": self.error_type}


def _names(known: Mapping[str, int] | Sequence[str]) -> str:
    return ", ".join(known)


class _Event(Injection):
    """Common part of the event records: the log they go to and the record flags."""

    log: Annotated[StrictStr, _known_name("event log", list(EVENT_LOGS))] = Field(
        default="informational", description=f"event log: {_names(EVENT_LOGS)}"
    )
    # Event Record Flags; None = just the severity of ``log`` (bits [1:0]).
    flags: EventFlags | None = Field(
        default=None,
        description=f"event record flags: a number or {_names(RECORD_FLAGS)} (default: the log's severity)",
    )

    def _common(self) -> dict[str, Any]:
        flags = EVENT_LOGS[self.log] if self.flags is None else self.flags
        return {"log": self.log, "flags": flags}


class _MediaEvent(_Event):
    """Common part of the general-media and DRAM event records (Tables 8-43, 8-44)."""

    _types: ClassVar[Mapping[str, int]]
    log: Annotated[StrictStr, _known_name("event log", list(EVENT_LOGS))] = Field(
        default="failure", description=f"event log: {_names(EVENT_LOGS)}"
    )
    dpa: Dpa = Field(description="device physical address, 64-byte aligned")
    descriptor: Descriptor = Field(
        default=DESCRIPTOR_BITS["uncorrectable"], description=f"a number or {_names(DESCRIPTOR_BITS)}"
    )
    transaction_type: TransactionType = Field(
        default="host-read", description=f"{_names(TRANSACTION_TYPES)} or a number"
    )
    volatile: StrictBool = Field(
        default=True, description="the address's volatile flag (set: the platform's devices are volatile)"
    )
    not_repairable: StrictBool = Field(default=False, description="set the address's not-repairable flag")
    channel: U8 | None = Field(default=None, description="channel (8 bits)")
    rank: U8 | None = Field(default=None, description="rank (8 bits)")

    def check_device(self, device: DeviceView) -> None:
        device.check_range(f"{self.kind} DPA", self.dpa, CACHELINE)

    def _media(self, event_type: int | str) -> dict[str, Any]:
        address = self.dpa | (DPA_VOLATILE if self.volatile else 0)
        address |= DPA_NOT_REPAIRABLE if self.not_repairable else 0
        arguments = {
            **self._common(),
            "dpa": address,
            "descriptor": self.descriptor,
            "type": _name_or_number("event type", self._types, event_type),
            "transaction-type": _name_or_number("transaction type", TRANSACTION_TYPES, self.transaction_type),
        }
        for name in ("channel", "rank"):
            if getattr(self, name) is not None:
                arguments[name] = getattr(self, name)
        return arguments


class GeneralMediaEvent(_MediaEvent):
    """A general media event record (CXL r3.0 8.2.9.2.1.1), signalled by interrupt
    (default log: failure)."""

    kind: ClassVar[str] = "general-media"
    command: ClassVar[str] = "cxl-inject-general-media-event"
    _types: ClassVar[Mapping[str, int]] = GENERAL_MEDIA_TYPES
    event_type: Annotated[NameOrNumber, _checked_name_or_number("event type", GENERAL_MEDIA_TYPES),
                          Cli(flag="--type")] = Field(
        default="ecc-error", description=f"{_names(GENERAL_MEDIA_TYPES)} or a number"
    )
    device_mask: U24 | None = Field(
        default=None, description="QMP device: the devices of the rank (24-bit mask)"
    )
    component_id: StrictStr | None = Field(default=None, description="1-15 ASCII characters")

    @field_validator("component_id")
    @classmethod
    def _component_id(cls, value: str | None) -> str | None:
        if value is not None and (not value.isascii() or not 0 < len(value) <= 15):
            raise ValueError(f"{short_repr(value)} must be 1-15 ASCII characters "
                             "(QEMU copies at most 15 into the 16-byte field)")
        return value

    def arguments(self) -> dict[str, Any]:
        arguments = self._media(self.event_type)
        if self.device_mask is not None:
            arguments["device"] = self.device_mask
        if self.component_id is not None:
            arguments["component-id"] = self.component_id
        return arguments


class DramEvent(_MediaEvent):
    """A DRAM event record (CXL r3.0 8.2.9.2.1.2), signalled by interrupt (default
    log: failure)."""

    kind: ClassVar[str] = "dram"
    command: ClassVar[str] = "cxl-inject-dram-event"
    _types: ClassVar[Mapping[str, int]] = DRAM_TYPES
    event_type: Annotated[NameOrNumber, _checked_name_or_number("event type", DRAM_TYPES),
                          Cli(flag="--type")] = Field(
        default="ecc-error", description=f"{_names(DRAM_TYPES)} or a number"
    )
    nibble_mask: U24 | None = Field(default=None, description="24 bits")
    bank_group: U8 | None = Field(default=None, description="8 bits")
    bank: U8 | None = Field(default=None, description="8 bits")
    row: U24 | None = Field(default=None, description="24 bits")
    column: U16 | None = Field(default=None, description="16 bits")
    correction_mask: tuple[U64, ...] = Field(default=(), description="up to 4 64-bit words")

    @field_validator("correction_mask")
    @classmethod
    def _correction_mask(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if len(value) > 4:
            raise ValueError(f"{len(value)} words; the record holds at most 4")
        return value

    def arguments(self) -> dict[str, Any]:
        arguments = self._media(self.event_type)
        for name in ("nibble_mask", "bank_group", "bank", "row", "column"):
            if getattr(self, name) is not None:
                arguments[name.replace("_", "-")] = getattr(self, name)
        if self.correction_mask:
            arguments["correction-mask"] = list(self.correction_mask)
        return arguments


class MemoryModuleEvent(_Event):
    """A memory module event record (CXL r3.0 8.2.9.2.1.3): a device health snapshot
    (default log: informational)."""

    kind: ClassVar[str] = "memory-module"
    command: ClassVar[str] = "cxl-inject-memory-module-event"
    event_type: Annotated[NameOrNumber, _checked_name_or_number("event type", MEMORY_MODULE_TYPES),
                          Cli(flag="--type")] = Field(
        default="health-status-change", description=f"{_names(MEMORY_MODULE_TYPES)} or a number"
    )
    health_status: HealthStatus = Field(default=0, description=f"a number or {_names(HEALTH_STATUS_BITS)}")
    media_status: Annotated[NameOrNumber, _checked_name_or_number("media status", MEDIA_STATUS)] = Field(
        default="normal", description=f"{_names(MEDIA_STATUS)} or a number"
    )
    additional_status: U6 = Field(
        default=0, description="bits [1:0] life used, [3:2] temperature (0 normal 1 warning 2 critical), "
        "4 volatile / 5 persistent corrected-error-count warning"
    )
    life_used: StrictInt = Field(default=0, description="percent 0..100")
    temperature: StrictInt = Field(default=25, description="degrees C")
    dirty_shutdown_count: U32 = Field(default=0, description="dirty shutdowns (32 bits)")
    corrected_volatile_error_count: Annotated[U32, Cli(flag="--corrected-volatile-errors")] = Field(
        default=0, description="corrected volatile errors (32 bits)"
    )
    corrected_persistent_error_count: Annotated[U32, Cli(flag="--corrected-persistent-errors")] = Field(
        default=0, description="corrected persistent errors (32 bits)"
    )

    @field_validator("additional_status")
    @classmethod
    def _additional_status(cls, status: int) -> int:
        # bits [1:0] life used, [3:2] temperature: 0 normal, 1 warning, 2 critical, 3 reserved
        if status & 0x3 == 0x3 or (status >> 2) & 0x3 == 0x3:
            raise ValueError(
                f"{status:#x} uses the reserved value 3 in bits [1:0] (life used) or [3:2] "
                "(temperature); use 0 normal, 1 warning, 2 critical"
            )
        return status

    @field_validator("life_used")
    @classmethod
    def _life_used(cls, value: int) -> int:
        if not 0 <= value <= 100:
            raise ValueError(f"{value!r} must be a percentage 0..100")
        return value

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, value: int) -> int:
        if not -(1 << 15) <= value < 1 << 15:
            raise ValueError(f"{value!r} must fit 16 bits signed (degrees C)")
        return value

    def arguments(self) -> dict[str, Any]:
        return {
            **self._common(),
            "type": _name_or_number("event type", MEMORY_MODULE_TYPES, self.event_type),
            "health-status": self.health_status,
            "media-status": _name_or_number("media status", MEDIA_STATUS, self.media_status),
            "additional-status": self.additional_status,
            "life-used": self.life_used,
            "temperature": self.temperature,
            "dirty-shutdown-count": self.dirty_shutdown_count,
            "corrected-volatile-error-count": self.corrected_volatile_error_count,
            "corrected-persistent-error-count": self.corrected_persistent_error_count,
        }


DcBlockMultiple = Annotated[StrictInt, _multiple_of(
    DC_BLOCK_BYTES, "must be a non-negative byte count",
    f"is not a multiple of the DC block size {format_size(DC_BLOCK_BYTES)} (QEMU's)")]


class DcExtent(ConfigModel):
    """``length`` bytes of a DC region from ``offset`` (bytes from the region's start),
    both multiples of QEMU's 2 MiB DC block."""

    label: ClassVar[str] = "DC extent"
    offset: DcBlockMultiple
    length: DcBlockMultiple

    @field_validator("length")
    @classmethod
    def _not_empty(cls, value: int) -> int:
        if value == 0:
            raise ValueError(f"the extent has length 0; give a multiple of {format_size(DC_BLOCK_BYTES)}")
        return value


def _as_extent(value: object) -> object:
    """Extents may come as (offset, length) pairs too (Python, a scenario's YAML)."""
    if isinstance(value, DcExtent | Mapping):
        return value
    if isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 2:
        return {"offset": value[0], "length": value[1]}
    raise ValueError(f"extent {short_repr(value)} is not an offset and a length, e.g. "
                     "DcExtent(offset=0, length=2 << 20) or {offset: 0, length: 2097152}")


def extent_option(text: str) -> dict[str, int]:
    """``OFFSET:LENGTH`` on the command line, each a number or a size (``0:2MiB``)."""
    offset, colon, length = text.partition(":")
    if not colon:
        raise argparse.ArgumentTypeError(f"{text!r} is not OFFSET:LENGTH, e.g. 0:2MiB or 0x400000:0x200000")
    return {"offset": _byte_count(offset), "length": _byte_count(length)}


def _byte_count(text: str) -> int:
    """A number (``0x400000``) or a size with a binary unit (``4MiB``); 0 allowed."""
    with contextlib.suppress(ValueError):
        return int(text, 0)
    try:
        return size_bytes(text, minimum_bytes=0)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a byte count (a number, hex as 0x..., or with KiB/MiB/GiB, e.g. 2MiB)"
        ) from None


class _DynamicCapacity(Injection):
    """Common part of dc-add and dc-release: extents of one DC region of a DCD,
    prescriptive (the extents given, the only policy QEMU 10.0 implements), for
    host 0 (the platform's devices have one host)."""

    needs_dc_layout: ClassVar[bool] = True
    policy_argument: ClassVar[str]
    region: StrictInt = Field(default=0, description="DC region index")
    extents: Annotated[
        tuple[Annotated[DcExtent, BeforeValidator(_as_extent)], ...],
        Cli(flag="--extent", metavar="OFFSET:LENGTH", parse=extent_option, repeat=True),
    ] = Field(description="bytes from the region's start and length, multiples of 2MiB (QEMU's DC block), "
              "e.g. 0:2MiB or 0x400000:0x200000; repeatable")

    @field_validator("region")
    @classmethod
    def _region(cls, value: int) -> int:
        if not 0 <= value < DC_MAX_REGIONS:
            raise ValueError(f"{value!r} must be a DC region index 0..{DC_MAX_REGIONS - 1}")
        return value

    @field_validator("extents")
    @classmethod
    def _extents(cls, extents: tuple[DcExtent, ...]) -> tuple[DcExtent, ...]:
        if not 0 < len(extents) <= DC_MAX_EXTENTS:
            raise ValueError(f"needs 1..{DC_MAX_EXTENTS} extents, got {len(extents)}; e.g. --extent 0:2MiB")
        ordered = sorted(extents, key=lambda e: e.offset)
        for first, second in itertools.pairwise(ordered):
            if first.offset + first.length > second.offset:
                raise ValueError(f"extents {_extent_text(first)} and {_extent_text(second)} overlap; "
                                 "give each block of the region once")
        return extents

    def check_device(self, device: DeviceView) -> None:
        layout = device.dynamic_capacity
        if layout is None:
            raise ConfigError(
                f"device {device.index} is not a dynamic capacity device (it has no DC region), so "
                f"{self.kind} cannot apply; boot a platform whose device has dynamic_capacity, e.g. "
                "--config platform/configs/dcd.yaml"
            )
        if self.region >= layout.regions:
            raise ConfigError(
                f"{self.kind}: DC region {self.region} does not exist: device {device.index} has "
                f"{layout.regions} DC region(s) (index {_index_range(layout.regions)}); "
                "use --region with one of them"
            )
        for extent in self.extents:
            if extent.offset + extent.length > layout.region_bytes:
                last = layout.region_bytes - extent.length
                fix = f"use an offset up to {last:#x}" if last >= 0 else "use a shorter extent"
                raise ConfigError(
                    f"{self.kind} extent {_extent_text(extent)} is beyond the end of DC region "
                    f"{self.region} ({format_size(layout.region_bytes)}: offsets "
                    f"0x0..{layout.region_bytes - 1:#x}, DPA {layout.region_dpa(self.region):#x}.."
                    f"{layout.region_dpa(self.region + 1) - 1:#x}); {fix}"
                )

    def arguments(self) -> dict[str, Any]:
        return {
            "host-id": 0,
            self.policy_argument: "prescriptive",
            "region": self.region,
            "extents": [{"offset": e.offset, "len": e.length} for e in self.extents],
        }


def _index_range(count: int) -> str:
    return "0" if count == 1 else f"0..{count - 1}"


def _extent_text(extent: DcExtent) -> str:
    return f"{extent.offset:#x}+{extent.length:#x}"


class DcAdd(_DynamicCapacity):
    """Offer extents of a DC region to the host (one Dynamic Capacity event record
    per extent, type Add Capacity). They stay pending in QEMU until the host accepts them."""

    kind: ClassVar[str] = "dc-add"
    command: ClassVar[str] = "cxl-add-dynamic-capacity"
    policy_argument: ClassVar[str] = "selection-policy"
    refusal_hints: ClassVar[Mapping[str, str]] = {"pending": DC_PENDING_HINT}


class DcRelease(_DynamicCapacity):
    """Ask the host to give extents of a DC region back (a Dynamic Capacity Release
    event). QEMU accepts it only for extents the host accepted before."""

    kind: ClassVar[str] = "dc-release"
    command: ClassVar[str] = "cxl-release-dynamic-capacity"
    policy_argument: ClassVar[str] = "removal-policy"
    refusal_hints: ClassVar[Mapping[str, str]] = {
        "pending": DC_PENDING_HINT,
        "non-existing": "no accepted extent covers that range (add it with dc-add first)",
    }


KINDS: Mapping[str, type[Injection]] = {
    kind.kind: kind
    for kind in (
        Poison, Uncorrectable, Correctable, GeneralMediaEvent, DramEvent, MemoryModuleEvent,
        DcAdd, DcRelease,
    )
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
                f"instance {short_repr(name)} is not running (running instances: {listing}); "
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
        return self.execute_all([(command, arguments)])[0]

    def execute_all(self, commands: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        """QEMU's replies to ``commands``, sent in order over one connection."""
        return asyncio.run(self._execute(commands))

    async def _execute(self, commands: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
        from qemu.qmp import ConnectError, QMPClient, QMPError

        client = QMPClient(f"cxlssd-inject-{os.getpid()}")
        try:
            await asyncio.wait_for(client.connect(str(self.inject_socket)), QMP_TIMEOUT_S)
            return [await _raw_reply(client, command, arguments) for command, arguments in commands]
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
                dynamic_capacity=DcLayout.of_config(config),
            )
        )
    return tuple(views)


def _target_device(injection: Injection, devices: Sequence[DeviceView], instance: str) -> DeviceView:
    by_index = {d.index: d for d in devices}
    if injection.device not in by_index:
        indexes = ", ".join(str(i) for i in sorted(by_index)) or "none"
        raise ConfigError(
            f"device {injection.device} does not exist: instance {instance} has {len(by_index)} "
            f"CXL device(s) (index {indexes}); use --device with one of them"
        )
    return by_index[injection.device]


def prepare(
    injection: Injection, devices: Sequence[DeviceView], instance: str
) -> tuple[DeviceView, dict[str, Any]]:
    """Check ``injection`` against the instance's devices; the device and the full
    QMP arguments (with ``path``). Raises :class:`ConfigError`; sends nothing."""
    device = _target_device(injection, devices, instance)
    injection.check_device(device)
    return device, {"path": device.qom_path, **injection.arguments()}


def _qmp(
    target: Platform | RunningInstance, commands: Sequence[tuple[str, dict[str, Any]]]
) -> list[dict[str, Any]]:
    """QEMU's raw replies (``{"return": ...}`` or ``{"error": ...}``) to ``commands``."""
    if isinstance(target, RunningInstance):
        return target.execute_all(commands)
    return [target.qmp.cmd_raw(command, arguments) for command, arguments in commands]


def _qom_values(target: Platform | RunningInstance, properties: Sequence[tuple[str, str]]) -> list[Any]:
    replies = _qmp(target, [("qom-get", {"path": path, "property": name}) for path, name in properties])
    for (path, name), reply in zip(properties, replies, strict=True):
        if "error" in reply:
            raise GuestError(
                f"QEMU of instance {target.name} cannot read {path} property {name!r} "
                f"({reply['error'].get('desc', reply['error'])}); is it QEMU >= 10.0?"
            )
    return [reply["return"] for reply in replies]


def read_dc_layout(target: Platform | RunningInstance, device: DeviceView) -> DcLayout | None:
    """The DC regions of ``device`` as QEMU has them (QOM: ``num-dc-regions`` and the
    size of the ``volatile-dc-memdev`` backend, split evenly); None if it has none."""
    regions, backend = _qom_values(
        target, [(device.qom_path, "num-dc-regions"), (device.qom_path, "volatile-dc-memdev")]
    )
    if not regions or not backend:
        return None
    (size_bytes,) = _qom_values(target, [(backend, "size")])
    # The DC regions follow the static capacity (no persistent memdev on this platform).
    return DcLayout(regions=regions, region_bytes=size_bytes // regions, base_dpa=device.size_bytes)


class FirmwareKill(ConfigModel):
    """Process fault: SIGKILL the firmware attached to the instance. The run using it
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
    """SIGKILL the firmware process attached to ``target``: the very process its session
    recorded (pid and start time), never another that reused the pid."""
    attached = json.loads(_attached(target, attached_firmware_path).read_text())
    firmware = ProcessId.parse(f"{attached.get('pid')} {attached.get('start_ticks')}")
    if firmware is None or not firmware.kill(signal.SIGKILL):
        raise ConfigError(
            f"the firmware of instance {target.name} (pid {attached.get('pid')}) is already gone"
        )
    return InjectionRecord(
        instance=target.name, kind=FirmwareKill.kind, command="SIGKILL", arguments={"pid": firmware.pid}
    )


def attached_profile(target: Platform | RunningInstance) -> Profile | None:
    """The design of the firmware attached to ``target``, as its session recorded it;
    None if it cannot be read (the firmware then checks the knob alone)."""
    try:
        attached = json.loads(_attached(target, attached_firmware_path).read_text())
        return load_profile(attached["design"], attached["overrides"])
    except (ConfigError, OSError, ValueError, KeyError, TypeError):
        return None


def send_knob(
    target: Platform | RunningInstance, knob: FirmwareKnob, at_ms: float | None = None
) -> InjectionRecord:
    """Check ``knob`` against the design of the firmware attached to ``target``, then
    hand it over (the firmware's control file); with ``at_ms``, the firmware applies
    it that long (modelled) after its first request."""
    control = _attached(target, control_path)
    profile = attached_profile(target)
    if profile is not None:
        check_fits(knob, DeviceShape.of_profile(profile))  # InputError: nothing is sent
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
    name = target.name
    devices: Sequence[DeviceView] = (
        target.devices if isinstance(target, RunningInstance) else _platform_devices(target)
    )
    if injection.needs_dc_layout:
        # Checked against QEMU's own view (a RunningInstance knows no config, and this
        # also catches a device QEMU built otherwise than the config says).
        device = _target_device(injection, devices, name)
        devices = [replace(device, dynamic_capacity=read_dc_layout(target, device))]
    device, arguments = prepare(injection, devices, name)
    (reply,) = _qmp(target, [(injection.command, arguments)])
    if "error" in reply:
        refusal = str(reply["error"].get("desc", reply["error"]))
        hints = [hint for words, hint in injection.refusal_hints.items() if words in refusal]
        raise ConfigError(
            f"QEMU refused {injection.command} on {name} device {device.index}: "
            + "; ".join([refusal, *hints])
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

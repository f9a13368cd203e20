"""CLI of run-time injection: ``./cxlssd inject --instance NAME KIND [options]``."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Mapping

from cxlssd.errors import ConfigError
from cxlssd.firmware.knobs import KNOBS, FirmwareKnob, knob_from_dict
from cxlssd.platform.inject import (
    CORRECTABLE_TYPES,
    DESCRIPTOR_BITS,
    DRAM_TYPES,
    EVENT_LOGS,
    GENERAL_MEDIA_TYPES,
    HEALTH_STATUS_BITS,
    MEDIA_STATUS,
    MEMORY_MODULE_TYPES,
    RECORD_FLAGS,
    TRANSACTION_TYPES,
    UNCORRECTABLE_TYPES,
    Correctable,
    DcAdd,
    DcExtent,
    DcRelease,
    DramEvent,
    FirmwareKill,
    GeneralMediaEvent,
    Injection,
    MemoryModuleEvent,
    Poison,
    Uncorrectable,
    UncorrectableError,
    inject,
)
from cxlssd.validation import parse_size

log = logging.getLogger(__name__)

EXAMPLES = """examples:
  ./cxlssd inject --instance default-ab12cd poison --dpa 0x1000 --length 64
  ./cxlssd inject --instance default-ab12cd general-media --dpa 0x2000 --type ecc-error
  ./cxlssd inject --instance default-ab12cd correctable --type mem-data-ecc
  ./cxlssd inject --instance dcd-ab12cd dc-add --region 0 --extent 0:2MiB --extent 4MiB:4MiB
  ./cxlssd inject --instance default-ab12cd gc-storm --duration-ms 50      (a firmware knob)
  ./cxlssd inject --instance default-ab12cd die-fault --channel 3 --slow 4
the instance name is printed when a platform boots (runtime dir /dev/shm/cxlssd-$UID/NAME);
details, and what the guest shows for each kind: docs/inject.md"""


def _number(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (decimal, or hex as 0x...)") from None


def _numbers(text: str) -> tuple[int, ...]:
    return tuple(_number(part) for part in text.split(",") if part)


def _byte_count(text: str) -> int:
    """A number (``0x400000``) or a size with a binary unit (``4MiB``); 0 allowed."""
    try:
        return int(text, 0)
    except ValueError:
        pass
    try:
        return parse_size(text, "", minimum_bytes=0)
    except ConfigError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a byte count (a number, hex as 0x..., or with KiB/MiB/GiB, e.g. 2MiB)"
        ) from None


def _extent(text: str) -> DcExtent:
    """``OFFSET:LENGTH``, each a byte count."""
    offset, colon, length = text.partition(":")
    if not colon:
        raise argparse.ArgumentTypeError(f"{text!r} is not OFFSET:LENGTH, e.g. 0:2MiB or 0x400000:0x200000")
    return DcExtent(offset=_byte_count(offset), length=_byte_count(length))


def _bits_parser(names: Mapping[str, int]) -> Callable[[str], int]:
    """A number, or a comma-separated list of bit names."""

    def parse(text: str) -> int:
        try:
            return int(text, 0)
        except ValueError:
            pass
        value = 0
        for name in text.split(","):
            if name not in names:
                raise argparse.ArgumentTypeError(
                    f"{name!r} is not one of {', '.join(names)} (or give a number)"
                )
            value |= names[name]
        return value

    return parse


def _known(values: Mapping[str, int] | tuple[str, ...]) -> str:
    return ", ".join(values)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "inject",
        help="inject a CXL fault or event into a running instance (QEMU QMP)",
        description="Inject a CXL fault or event into a running platform instance, at run time. "
        "Every injection is checked (device, address range, 64-byte or DC block alignment, "
        "DC regions, known types) "
        "before anything is sent.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--instance", required=True, metavar="NAME", help="running instance name")
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="KIND")

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--device", type=_number, default=0, help="CXL device index (default 0)")

    poison = kinds.add_parser("poison", parents=[common], help="poison a device address range")
    poison.add_argument("--dpa", type=_number, required=True, help="device physical address, 64-byte aligned")
    poison.add_argument("--length", type=_number, default=64, help="bytes, a multiple of 64 (default 64)")

    unc = kinds.add_parser(
        "uncorrectable", parents=[common],
        help="uncorrectable RAS error(s): AER fatal, the guest resets the link and loses the region",
    )
    unc.add_argument(
        "--type", dest="error_types", action="append", required=True, metavar="TYPE",
        help=f"error type, repeatable: {_known(UNCORRECTABLE_TYPES)}",
    )
    unc.add_argument("--header", type=_numbers, default=(), metavar="DW,DW,...",
                     help="header log dwords (at most 32) for each error")

    cor = kinds.add_parser("correctable", parents=[common], help="a correctable RAS error")
    cor.add_argument("--type", dest="error_type", required=True, metavar="TYPE",
                     help=f"error type: {_known(CORRECTABLE_TYPES)}")

    event = argparse.ArgumentParser(add_help=False)
    event.add_argument("--log", default=None, help=f"event log: {_known(EVENT_LOGS)}")
    event.add_argument("--flags", type=_bits_parser(RECORD_FLAGS), default=None,
                       help=f"event record flags: number or {_known(RECORD_FLAGS)} "
                       "(default: the log's severity)")

    media = argparse.ArgumentParser(add_help=False)
    media.add_argument("--dpa", type=_number, required=True, help="device physical address, 64-byte aligned")
    media.add_argument("--descriptor", type=_bits_parser(DESCRIPTOR_BITS), default=None,
                       help=f"number or {_known(DESCRIPTOR_BITS)} (default uncorrectable)")
    media.add_argument("--transaction-type", default=None,
                       help=f"{_known(TRANSACTION_TYPES)} or a number (default host-read)")
    media.add_argument("--not-repairable", action="store_true", help="set the address's not-repairable flag")
    media.add_argument("--channel", type=_number)
    media.add_argument("--rank", type=_number)

    gm = kinds.add_parser("general-media", parents=[common, event, media],
                          help="a general media event record (default log: failure)")
    gm.add_argument("--type", dest="event_type", default=None,
                    help=f"{_known(GENERAL_MEDIA_TYPES)} or a number (default ecc-error)")
    gm.add_argument("--device-mask", type=_number, help="devices of the rank (24-bit mask)")
    gm.add_argument("--component-id", help="1-15 ASCII characters")

    dram = kinds.add_parser("dram", parents=[common, event, media],
                            help="a DRAM event record (default log: failure)")
    dram.add_argument("--type", dest="event_type", default=None,
                      help=f"{_known(DRAM_TYPES)} or a number (default ecc-error)")
    for name, help_text in (
        ("--nibble-mask", "24 bits"), ("--bank-group", "8 bits"), ("--bank", "8 bits"),
        ("--row", "24 bits"), ("--column", "16 bits"),
    ):
        dram.add_argument(name, type=_number, help=help_text)
    dram.add_argument("--correction-mask", type=_numbers, default=(), metavar="W,W,...",
                      help="up to 4 64-bit words")

    mm = kinds.add_parser("memory-module", parents=[common, event],
                          help="a memory module event record (default log: informational)")
    mm.add_argument("--type", dest="event_type", default="health-status-change",
                    help=f"{_known(MEMORY_MODULE_TYPES)} or a number")
    mm.add_argument("--health-status", type=_bits_parser(HEALTH_STATUS_BITS), default=0,
                    help=f"number or {_known(HEALTH_STATUS_BITS)}")
    mm.add_argument("--media-status", default="normal", help=f"{_known(MEDIA_STATUS)} or a number")
    mm.add_argument("--additional-status", type=_number, default=0,
                    help="bits [1:0] life used, [3:2] temperature (0 normal 1 warning 2 critical), "
                    "4 volatile / 5 persistent corrected-error-count warning")
    mm.add_argument("--life-used", type=_number, default=0, help="percent 0..100")
    mm.add_argument("--temperature", type=_number, default=25, help="degrees C")
    mm.add_argument("--dirty-shutdown-count", type=_number, default=0)
    mm.add_argument("--corrected-volatile-errors", type=_number, default=0)
    mm.add_argument("--corrected-persistent-errors", type=_number, default=0)

    extents = argparse.ArgumentParser(add_help=False)
    extents.add_argument("--region", type=_number, default=0, help="DC region index (default 0)")
    extents.add_argument(
        "--extent", dest="extents", type=_extent, action="append", required=True, metavar="OFFSET:LENGTH",
        help="bytes from the region's start and length, multiples of 2MiB (QEMU's DC block), "
        "e.g. 0:2MiB or 0x400000:0x200000; repeatable",
    )
    dc_add = kinds.add_parser(
        "dc-add", parents=[common, extents],
        help="dynamic capacity: offer extents of a DC region to the host (a DCD, e.g. configs/dcd.yaml)",
    )
    dc_release = kinds.add_parser(
        "dc-release", parents=[common, extents],
        help="dynamic capacity: ask the host to release extents it accepted",
    )

    # Firmware knobs: sent to the firmware attached to the instance (docs/inject.md).
    flash = kinds.add_parser("flash-latency", help="firmware knob: flash read/program/erase time")
    flash.add_argument("--read-ns", type=_number)
    flash.add_argument("--program-ns", type=_number)
    flash.add_argument("--erase-ns", type=_number)
    link = kinds.add_parser("link-latency", help="firmware knob: extra CXL link latency (0 restores)")
    link.add_argument("--extra-ns", type=_number, required=True)
    spike = kinds.add_parser(
        "latency-spike", help="firmware knob: extra link latency for N ms of modelled time"
    )
    spike.add_argument("--extra-ns", type=_number, required=True)
    spike.add_argument("--duration-ms", type=float, required=True)
    storm = kinds.add_parser(
        "gc-storm", help="firmware knob: forced garbage collection for N ms of modelled time (or N blocks)"
    )
    storm_size = storm.add_mutually_exclusive_group(required=True)
    storm_size.add_argument("--duration-ms", type=float, help="keep the dies collecting this long (modelled)")
    storm_size.add_argument("--blocks", type=_number, help="collect this many blocks on each die at once")
    storm.add_argument("--dies", type=_numbers, metavar="D,D,...", help="die indexes (default: every die)")
    die = kinds.add_parser(
        "die-fault", help="firmware knob: slow down, fail or restore a flash die (or a channel's dies)"
    )
    where = die.add_mutually_exclusive_group(required=True)
    where.add_argument("--die", type=_number, help="die index (die d is on channel d %% channels)")
    where.add_argument("--channel", type=_number, help="every die of this flash channel")
    what = die.add_mutually_exclusive_group(required=True)
    what.add_argument("--slow", type=float, metavar="FACTOR", help="multiply its read/program/erase times")
    what.add_argument("--fail", action="store_true", help="fail it: no new writes, its pages rebuilt on read")
    what.add_argument("--restore", action="store_true", help="bring it back to normal")
    throttle = kinds.add_parser(
        "flush-throttle", help="firmware knob: at most one write-log flush program per N ns"
    )
    rate = throttle.add_mutually_exclusive_group(required=True)
    rate.add_argument("--interval-ns", type=_number, help="ns between flush programs (0 restores)")
    rate.add_argument("--off", action="store_true", help="stop throttling")

    kill = kinds.add_parser(
        "firmware-kill", help="process fault: SIGKILL the firmware attached to the instance"
    )

    for kind_parser in (
        poison, unc, cor, gm, dram, mm, dc_add, dc_release, flash, link, spike, storm, die, throttle, kill
    ):
        kind_parser.set_defaults(handler=run_inject)
    for knob_parser, fields in (
        (flash, _given("read_ns", "program_ns", "erase_ns")), (link, _given("extra_ns")),
        (spike, _given("extra_ns", "duration_ms")), (storm, _given("duration_ms", "blocks", "dies")),
        (die, _die_fault_fields), (throttle, _throttle_fields),
    ):
        knob_parser.set_defaults(knob_fields=fields)


def _given(*names: str) -> Callable[[argparse.Namespace], dict[str, object]]:
    """The knob fields of these options, those the user gave."""
    return lambda args: _optional(args, *names)


def _die_fault_fields(args: argparse.Namespace) -> dict[str, object]:
    mode = "fail" if args.fail else "restore" if args.restore else "slow"
    return {"mode": mode, "factor": args.slow, **_optional(args, "die", "channel")}


def _throttle_fields(args: argparse.Namespace) -> dict[str, object]:
    return {"program_interval_ns": 0 if args.off else args.interval_ns}


def _optional(args: argparse.Namespace, *names: str) -> dict[str, object]:
    """The options the user gave (so the dataclass defaults apply to the others)."""
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def build_injection(args: argparse.Namespace) -> Injection | FirmwareKnob | FirmwareKill:
    """The injection the parsed command line asks for (checked as it is built)."""
    if args.kind == FirmwareKill.kind:
        return FirmwareKill()
    if args.kind in KNOBS:
        fields = {k: v for k, v in args.knob_fields(args).items() if v is not None}
        return knob_from_dict({"kind": args.kind, **fields})  # InputError names a bad value
    device = args.device
    if args.kind == "poison":
        return Poison(device=device, dpa=args.dpa, length=args.length)
    if args.kind == "uncorrectable":
        return Uncorrectable(
            device=device,
            errors=tuple(UncorrectableError(error_type=t, header=args.header) for t in args.error_types),
        )
    if args.kind == "correctable":
        return Correctable(device=device, error_type=args.error_type)
    if args.kind in (DcAdd.kind, DcRelease.kind):
        dynamic = DcAdd if args.kind == DcAdd.kind else DcRelease
        return dynamic(device=device, region=args.region, extents=tuple(args.extents))
    if args.kind in ("general-media", "dram"):
        options = _optional(
            args, "log", "flags", "descriptor", "event_type", "transaction_type", "channel", "rank"
        )
        if args.kind == "general-media":
            return GeneralMediaEvent(
                device=device, dpa=args.dpa, not_repairable=args.not_repairable,
                **_optional(args, "device_mask", "component_id"), **options,  # type: ignore[arg-type]
            )
        return DramEvent(
            device=device, dpa=args.dpa, not_repairable=args.not_repairable,
            correction_mask=args.correction_mask,
            **_optional(args, "nibble_mask", "bank_group", "bank", "row", "column"), **options,  # type: ignore[arg-type]
        )
    return MemoryModuleEvent(
        device=device,
        event_type=args.event_type,
        health_status=args.health_status,
        media_status=args.media_status,
        additional_status=args.additional_status,
        life_used=args.life_used,
        temperature=args.temperature,
        dirty_shutdown_count=args.dirty_shutdown_count,
        corrected_volatile_error_count=args.corrected_volatile_errors,
        corrected_persistent_error_count=args.corrected_persistent_errors,
        **_optional(args, "log", "flags"),  # type: ignore[arg-type]
    )


def run_inject(args: argparse.Namespace) -> int:
    injection = build_injection(args)
    record = inject(args.instance, injection)
    where = f" (guest physical address {record.hpa:#x})" if record.hpa is not None else ""
    target = f"device {injection.device}" if isinstance(injection, Injection) else "firmware"
    log.info("injected %s into %s %s%s", record.kind, record.instance, target, where)
    print(json.dumps(record.as_dict()))
    return 0

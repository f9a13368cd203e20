"""CLI of run-time injection: ``./cxlssd inject --instance NAME KIND [options]``."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable, Mapping

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

log = logging.getLogger(__name__)

EXAMPLES = """examples:
  ./cxlssd inject --instance default-ab12cd poison --dpa 0x1000 --length 64
  ./cxlssd inject --instance default-ab12cd general-media --dpa 0x2000 --type ecc-error
  ./cxlssd inject --instance default-ab12cd correctable --type mem-data-ecc
the instance name is printed when a platform boots (runtime dir /dev/shm/cxlssd-$UID/NAME);
details, and what the guest shows for each kind: docs/inject.md"""


def _number(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (decimal, or hex as 0x...)") from None


def _numbers(text: str) -> tuple[int, ...]:
    return tuple(_number(part) for part in text.split(",") if part)


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
        "Every injection is checked (device, address range, 64-byte alignment, known types) "
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

    kill = kinds.add_parser(
        "firmware-kill", help="process fault: SIGKILL the firmware attached to the instance"
    )

    for kind_parser in (poison, unc, cor, gm, dram, mm, flash, link, spike, kill):
        kind_parser.set_defaults(handler=run_inject)


def _optional(args: argparse.Namespace, *names: str) -> dict[str, object]:
    """The options the user gave (so the dataclass defaults apply to the others)."""
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def build_injection(args: argparse.Namespace) -> Injection | FirmwareKnob | FirmwareKill:
    """The injection the parsed command line asks for (checked as it is built)."""
    if args.kind == FirmwareKill.kind:
        return FirmwareKill()
    if args.kind in KNOBS:
        options = {k: v for k, v in vars(args).items() if k in ("read_ns", "program_ns", "erase_ns",
                                                                 "extra_ns", "duration_ms") and v is not None}
        return knob_from_dict({"kind": args.kind, **options})  # InputError names a bad value
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

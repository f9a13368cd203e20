"""CLI of run-time injection: ``./cxlssd inject --instance NAME KIND [options]``.

Every kind's options are made from its model's fields (:func:`cxlssd.models.add_options`:
names, types, help, required or not, choices), so the command line, the scenarios' YAML
and the Python API take the same values and give the same messages."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Mapping

from cxlssd.firmware.knobs import KNOBS, FirmwareKnob
from cxlssd.models import ConfigModel, add_options, cli_spelling, options_input
from cxlssd.platform.inject import KINDS, FirmwareKill, Injection, inject

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

# QMP injections, firmware knobs (sent to the firmware attached to the instance), the process fault.
COMMANDS: Mapping[str, type[Injection | FirmwareKnob | FirmwareKill]] = {
    **KINDS, **KNOBS, FirmwareKill.kind: FirmwareKill
}


def summary(model: type[ConfigModel]) -> str:
    """A kind's one-line help: the first sentence of its model's docstring."""
    text = " ".join((model.__doc__ or "").split()).replace("``", "")
    return text.split(". ")[0].rstrip(".")


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
    for kind, model in COMMANDS.items():
        kind_parser = kinds.add_parser(kind, help=summary(model), description=model.__doc__)
        add_options(kind_parser, model)
        kind_parser.set_defaults(handler=run_inject)


def build_injection(args: argparse.Namespace) -> Injection | FirmwareKnob | FirmwareKill:
    """The injection the parsed command line asks for, checked as it is built: a problem
    is the model's error naming the option."""
    model = COMMANDS[args.kind]
    return model.parse(options_input(args, model), spell=cli_spelling(model))


def run_inject(args: argparse.Namespace) -> int:
    injection = build_injection(args)
    record = inject(args.instance, injection)
    where = f" (guest physical address {record.hpa:#x})" if record.hpa is not None else ""
    target = f"device {injection.device}" if isinstance(injection, Injection) else "firmware"
    log.info("injected %s into %s %s%s", record.kind, record.instance, target, where)
    print(json.dumps(record.as_dict()))
    return 0

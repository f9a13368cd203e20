"""The ``cxlssd`` command line: one sub-command per area of the platform.

Each area module exposes ``register(subparsers)``, which adds its sub-commands
and sets ``handler`` (a function taking the parsed arguments and returning the
exit status) on each of them.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from cxlssd.errors import CxlssdError

log = logging.getLogger("cxlssd")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every area's sub-commands registered."""
    from cxlssd import setup_commands
    from cxlssd.firmware import commands as firmware_commands
    from cxlssd.platform import commands as platform_commands

    parser = argparse.ArgumentParser(
        prog="cxlssd",
        description="Emulated memory-semantic CXL-SSD research platform.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for area in (setup_commands, platform_commands, firmware_commands):
        area.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the chosen command, and map expected errors to exit codes."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(message)s" if not args.verbose else "%(asctime)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        status: int = args.handler(args)
    except CxlssdError as error:
        log.error("error: %s", error)
        return error.exit_code
    except KeyboardInterrupt:
        log.error("interrupted")
        return 130
    return status

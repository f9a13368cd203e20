"""The ``cxlssd`` command line: one sub-command per area of the platform.

Each area module exposes ``register(subparsers)``, which adds its sub-commands
and sets ``handler`` (a function taking the parsed arguments and returning the
exit status) on each of them.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence

from cxlssd.errors import CxlssdError
from cxlssd.yamlfile import shorten

log = logging.getLogger("cxlssd")


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with every area's sub-commands registered."""
    from cxlssd import setup_commands
    from cxlssd.experiments import commands as experiment_commands
    from cxlssd.firmware import commands as firmware_commands
    from cxlssd.platform import commands as platform_commands
    from cxlssd.platform import inject_commands

    parser = argparse.ArgumentParser(
        prog="cxlssd",
        description="Emulated memory-semantic CXL-SSD research platform.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for area in (setup_commands, platform_commands, inject_commands, firmware_commands, experiment_commands):
        area.register(subparsers)
    return parser


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the chosen command, and map expected errors to exit codes."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    # `test` hands every option it does not know to pytest (argparse's REMAINDER
    # cannot start with an option); anything else must be fully understood.
    if unknown and getattr(args, "pytest_args", None) is None:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if unknown:
        args.pytest_args = [*unknown, *args.pytest_args]
    # A polite kill (SIGTERM) or a closed terminal (SIGHUP) must clean up like Ctrl-C:
    # stop QEMU, remove the runtime files (guest-sized backing files in /dev/shm).
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_keyboard_interrupt)
    # Ctrl-C too when started with SIGINT ignored (a background job of a script, nohup
    # under some shells): Python then keeps it ignored, and a SIGINT sent on purpose
    # would leave the guest booting on.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(message)s" if not args.verbose else "%(asctime)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Connection chatter and the PDF writer's font subsetting: not the user's business.
    for chatty in ("paramiko", "qemu.qmp", "fontTools"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    try:
        status: int = args.handler(args)
    except CxlssdError as error:
        log.error("error: %s", error)
        return error.exit_code
    except KeyboardInterrupt:
        log.error("interrupted")
        return 130
    except (MemoryError, RecursionError, OSError) as error:
        # What an input can still cause past the checks (a file too large for memory, a
        # disk that fills up): one line, the traceback only with -v.
        log.debug("traceback:", exc_info=True)
        log.error("error: %s", _describe(error))
        return CxlssdError.exit_code
    return status


def _describe(error: BaseException) -> str:
    """One line for an unexpected resource error."""
    if isinstance(error, MemoryError):
        return "out of memory (the input asks for more than this host has); rerun with -v for details"
    if isinstance(error, RecursionError):
        return "an input is nested too deeply to process; rerun with -v for details"
    assert isinstance(error, OSError)
    where = f": {shorten(str(error.filename), 200)}" if error.filename else ""
    return f"{error.strerror or error}{where}"

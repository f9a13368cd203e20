"""``cxlssd setup`` and ``cxlssd test``: build what the platform needs, run the checks.

The Debian packages and the venv are installed by the ``./cxlssd`` bootstrap
before Python starts; these commands build the rest (guest image, TCG plugin) and run the
project's checks (ruff, mypy, pytest) in that order.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys

from cxlssd.guest.image import ensure_image
from cxlssd.paths import REPO_ROOT
from cxlssd.platform.plugin.build import ensure_plugin
from cxlssd.platform.qemu import check_qemu

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    setup = subparsers.add_parser("setup", help="install and build everything the platform needs")
    setup.set_defaults(handler=run_setup)

    test = subparsers.add_parser(
        "test",
        help="set up, then run ruff, mypy and pytest",
        description="Extra arguments go to pytest, e.g. `./cxlssd test -m 'not slow'`.",
    )
    test.add_argument("pytest_args", nargs=argparse.REMAINDER, help="arguments passed to pytest")
    test.set_defaults(handler=run_tests)


def run_setup(args: argparse.Namespace) -> int:
    qemu = check_qemu()
    log.info("QEMU %s at %s", qemu.version_text, qemu.binary)
    image = ensure_image()
    log.info("guest image: %s", image.rootfs.parent)
    log.info("TCG plugin: %s", ensure_plugin())
    return 0


def run_tests(args: argparse.Namespace) -> int:
    run_setup(args)
    checks = [
        ("ruff", [sys.executable, "-P", "-m", "ruff", "check", "."]),
        ("mypy", [sys.executable, "-P", "-m", "mypy"]),
    ]
    for name, argv in checks:
        log.info("== %s", name)
        if subprocess.run(argv, cwd=REPO_ROOT).returncode != 0:
            log.error("error: %s found problems (see above)", name)
            return 1
    log.info("== pytest")
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    # -P: the repo root's platform/ folder must not shadow the standard library module.
    return subprocess.run(
        [sys.executable, "-P", "-m", "pytest", *pytest_args], cwd=REPO_ROOT
    ).returncode

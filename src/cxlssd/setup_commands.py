"""``cxlssd setup`` and ``cxlssd test``: build what the platform needs, run the checks.

The Debian packages and the venv are installed by the ``./cxlssd`` bootstrap
before Python starts; these commands build the rest (guest image, TCG plugin) and run the
project's checks (ruff, mypy, pytest) in that order. Optional dependencies (extras of
pyproject.toml, e.g. ``cluster``: Ray) are installed into the venv when first used
(:func:`ensure_extra`); ``test`` installs them all, so every test can run.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

import cxlssd
from cxlssd import CHECKOUT_ROOT
from cxlssd.errors import InputError, PrerequisiteError
from cxlssd.guest.image import ensure_image
from cxlssd.platform.plugin.build import ensure_plugin
from cxlssd.platform.qemu import check_qemu

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    setup = subparsers.add_parser("setup", help="install and build everything the platform needs")
    setup.add_argument("--cluster", action="store_true",
                       help="also install Ray, for running experiments on a Ray cluster (a node's setup)")
    setup.set_defaults(handler=run_setup)

    test = subparsers.add_parser(
        "test",
        help="set up, then run ruff, mypy and pytest",
        description="Extra arguments go to pytest, e.g. `./cxlssd test -m slow` (the opt-in slow tier) "
                    "or `./cxlssd test --full` (every tier).",
    )
    test.add_argument("pytest_args", nargs=argparse.REMAINDER, help="arguments passed to pytest")
    test.set_defaults(handler=run_tests)


def run_setup(args: argparse.Namespace) -> int:
    qemu = check_qemu()
    log.info("QEMU %s at %s", qemu.version_text, qemu.binary)
    image = ensure_image()
    log.info("guest image: %s", image.rootfs.parent)
    log.info("TCG plugin: %s", ensure_plugin())
    if getattr(args, "cluster", False):
        ensure_extra("cluster")
    return 0


# Extras the tests need: installed by ``test``.
TEST_EXTRAS = ("cluster",)


def ensure_extra(name: str) -> None:
    """Install the optional dependencies ``name`` of pyproject.toml into this venv,
    unless every one is there at a version in its range. A :class:`PrerequisiteError`
    (with pip's exit status; its output is above) if pip fails."""
    missing = [r for r in extra_requirements(name) if not _installed(Requirement(r))]
    if not missing:
        return
    log.info("installing %s (the %s extra; first use only)", ", ".join(missing), name)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", *missing]
    status = subprocess.run(pip).returncode
    if status != 0:
        raise PrerequisiteError(f"pip could not install {', '.join(missing)} (exit status {status}; "
                                "its message is above)")


def extra_requirements(name: str) -> list[str]:
    """The requirements of the optional dependencies ``name``: pyproject.toml's in a
    checkout, the installed package's metadata otherwise."""
    if CHECKOUT_ROOT is not None:
        project = tomllib.loads((CHECKOUT_ROOT / "pyproject.toml").read_text())["project"]
        return list(project["optional-dependencies"][name])
    requirements = [Requirement(r) for r in importlib.metadata.requires("cxlssd") or []]
    extra = [r for r in requirements if r.marker is not None and r.marker.evaluate({"extra": name})]
    for requirement in extra:
        requirement.marker = None
    return [str(r) for r in extra]


def _installed(requirement: Requirement) -> bool:
    try:
        version = importlib.metadata.version(requirement.name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return requirement.specifier.contains(version, prereleases=True)


def run_tests(args: argparse.Namespace) -> int:
    checkout = CHECKOUT_ROOT
    if checkout is None:
        raise InputError("`cxlssd test` runs the project's tests, which only a source checkout holds: "
                         "clone the repository and run ./cxlssd test there")
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    if selects_guest_tests(pytest_args):
        run_setup(args)
    else:
        log.info("no test that runs QEMU is selected: QEMU and the guest image are not needed")
    for extra in TEST_EXTRAS:
        ensure_extra(extra)
    checks = [
        ("ruff", [sys.executable, "-m", "ruff", "check", "."]),
        ("mypy", [sys.executable, "-m", "cxlssd.typecheck"]),
    ]
    for name, argv in checks:
        log.info("== %s", name)
        if subprocess.run(argv, cwd=checkout, env=cxlssd.child_env()).returncode != 0:
            log.error("error: %s found problems (see above)", name)
            return 1
    log.info("== pytest")
    return run_to_its_end([sys.executable, "-m", "pytest", *pytest_args], cwd=checkout)


def run_to_its_end(argv: list[str], cwd: Path | None = None) -> int:
    """Run ``argv`` and wait for it to end, also when interrupted: Ctrl-C reaches the child
    as well (the terminal signals the whole process group) and it stops its guests and
    removes its runtime files before it exits, which ``subprocess.run`` would cut short by
    killing it. A SIGTERM or SIGHUP of ours is passed on to it as SIGINT; a SIGINT sent to
    this process alone is not (send it to the process group)."""
    child = subprocess.Popen(argv, cwd=cwd)

    def pass_on(signum: int, frame: object) -> None:
        child.send_signal(signal.SIGINT)

    handled = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {signum: signal.getsignal(signum) for signum in handled}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGHUP, pass_on)
    try:
        return child.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def selects_guest_tests(pytest_args: list[str]) -> bool:
    """Whether ``pytest_args`` select a test marked ``guest`` (one that runs QEMU), so the
    run needs QEMU and the guest image: pytest collects the selection narrowed to
    ``guest`` tests (a few seconds) and says whether anything is left. Paths, ``-k`` and
    ``-m`` all count; a selection that collection cannot settle needs them."""
    rest, markexpr = [], None
    arguments = iter(pytest_args)
    for argument in arguments:
        if argument == "-m":
            markexpr = next(arguments, "")
        elif argument.startswith("-m") and not argument.startswith("--"):
            markexpr = argument[2:]
        else:
            rest.append(argument)
    narrowed = "guest" if markexpr is None else f"({markexpr}) and guest"
    collect = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
               *rest, "-m", narrowed]
    status = subprocess.run(collect, cwd=CHECKOUT_ROOT, capture_output=True).returncode
    return status != PYTEST_NO_TESTS_COLLECTED


PYTEST_NO_TESTS_COLLECTED = 5  # pytest's exit status when the selection is empty

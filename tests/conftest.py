"""Shared fixtures: an isolated runtime dir for the session, one booted guest per
session, and a leak check after every test (no QEMU, socket or /dev/shm file of
the platform may outlive the test that started it)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# CI gets one try: the same examples every run there (Hypothesis' advice); local
# runs explore new random examples each time.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

REPO = Path(__file__).resolve().parents[1]
# Every test, and every ./cxlssd the tests start, uses this private runtime root.
RUNTIME = Path(f"/dev/shm/cxlssd-test-{os.getpid()}")
os.environ["CXLSSD_RUNTIME"] = str(RUNTIME)


def platform_processes() -> list[str]:
    """Command lines of live processes started from the test runtime dir (QEMU)."""
    found = subprocess.run(["pgrep", "-a", "-f", str(RUNTIME)], capture_output=True, text=True)
    return [line for line in found.stdout.splitlines() if "pgrep" not in line]


def platform_namespaces(owner_pid: int | None = None) -> list[str]:
    """Network namespaces of the platform (``platform/network.py``) owned by this test
    process (or ``owner_pid``), found where ``ip netns`` keeps them."""
    prefix = f"cxlssd-{os.getuid()}-{owner_pid or os.getpid()}-"
    netns_dir = Path("/run/netns")
    names = [p.name for p in netns_dir.iterdir()] if netns_dir.is_dir() else []
    return sorted(name for name in names if name.startswith(prefix))


def leftovers(allowed: set[str]) -> list[str]:
    entries = {p.name for p in RUNTIME.iterdir()} if RUNTIME.exists() else set()
    stray = [f"runtime dir {name}" for name in sorted(entries - allowed)]
    processes = [p for p in platform_processes() if not any(name in p for name in allowed)]
    namespaces = [n for n in platform_namespaces() if not any(name in n for name in allowed)]
    return stray + [f"process {p}" for p in processes] + [f"network namespace {n}" for n in namespaces]


_live_instances: set[str] = set()


@pytest.fixture(scope="session")
def live_instances() -> set[str]:
    """Names a longer-lived fixture adds while its instances (or network namespace)
    run, and removes after stopping them: the leak check allows them meanwhile."""
    return _live_instances


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    yield
    assert leftovers(_live_instances) == [], "the test left platform state behind"


# Tests that stay out of the default run's time budget: they run when ``-m`` or ``-k``
# names their marker, or with ``--full``. ``slow``: tests that boot guests of their own
# (about a minute each on a fast host, three on a slow one) or repeat a live mechanism
# the default run already covers at length; ``cluster``: a Ray cluster on loopback
# (1-3 min, 2.5-7.5 with the live one); ``campaign``: the live fault campaign (four
# guest boots).
OPT_IN_MARKERS = ("slow", "cluster", "campaign")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true",
                     help=f"also run the opt-in tiers ({', '.join(OPT_IN_MARKERS)})")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("full"):
        return
    named = f"{config.getoption('markexpr')} {config.getoption('keyword')}"
    opt_out = [marker for marker in OPT_IN_MARKERS if marker not in named]
    deselected = [item for item in items if any(item.get_closest_marker(m) for m in opt_out)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


def pytest_sessionstart(session: pytest.Session) -> None:
    # a session killed outright (SIGKILL, a CI timeout) had no teardown: its root still
    # holds a guest's 1 GiB CXL backing file in /dev/shm
    from cxlssd.platform.machine import reap_dead_sessions

    reaped = reap_dead_sessions(RUNTIME.parent, "cxlssd-test-")
    if reaped:
        print(f"reaped the runtime of test sessions that were killed: {', '.join(reaped)}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    remaining = leftovers(set())
    shutil.rmtree(RUNTIME, ignore_errors=True)
    if remaining:
        session.exitstatus = 1
        print(f"\nLEAK after the session: {remaining}")


@pytest.fixture(scope="session")
def default_platform() -> Iterator[object]:
    """The default platform, booted once for the whole session."""
    from cxlssd.platform.config import load_config
    from cxlssd.platform.machine import Platform

    with Platform(load_config()) as platform:
        _live_instances.add(platform.name)
        yield platform
    _live_instances.discard(platform.name)


def _run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / "cxlssd"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the ./cxlssd entry point as a user would: ``cli("guest", "exec", ...)``."""
    return _run_cli

"""Several guests started together on one network, and stopped together.

``MultiPlatform(load_multi_config(path))`` is a context manager like ``Platform``:
``launch()`` checks everything first (host memory for all guests at once, the bridge
subnet against the host's addresses and routes), creates the bridge network if the
config asks for one (``network.py``), boots every guest concurrently, and gives each
its bridge address; ``shutdown()`` stops every guest and then removes the network.
Any failure, Ctrl-C or SIGTERM (the CLI turns it into Ctrl-C) during either leaves
nothing behind: no QEMU, no runtime dir, no namespace, tap or bridge.

Each guest is booted by its own *owner thread*, which stays alive until the guest
is shut down: QEMU's ``PR_SET_PDEATHSIG`` fires when the thread that started it
exits, not the process.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cxlssd.errors import ConfigError, GuestError
from cxlssd.guest.image import GuestImage, ensure_image
from cxlssd.lifecycle import Lifecycle
from cxlssd.paths import runtime_root
from cxlssd.platform.config import MultiPlatformConfig
from cxlssd.platform.machine import Platform, check_host_capacity, reap_stale_instances
from cxlssd.platform.network import GuestNetwork, check_subnet_free
from cxlssd.platform.qemu import bridge_nic_argv, check_qemu

log = logging.getLogger(__name__)

NET_SETUP_SCRIPT = Path(__file__).resolve().parents[1] / "guest" / "net_setup.py"
# How often the main thread looks at the guests while they boot or stop.
POLL_S = 0.5
START_POLL_S = 0.05


class _GuestOwner(threading.Thread):
    """Boots one guest, then waits (keeping QEMU's parent thread alive) until told to end."""

    def __init__(self, platform: Platform, release: threading.Event) -> None:
        super().__init__(name=f"guest-{platform.name}", daemon=True)
        self.platform = platform
        self.release = release
        self.booted = threading.Event()  # launch() returned or raised
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.platform.launch()
        except BaseException as error:  # handed to the main thread
            self.error = error
        finally:
            self.booted.set()
        self.release.wait()


class MultiPlatform(Lifecycle):
    """The guests of a :class:`MultiPlatformConfig`, each a :class:`Platform`."""

    def __init__(self, config: MultiPlatformConfig, image: GuestImage | None = None) -> None:
        self.config = config
        self.name = f"{config.name}-{secrets.token_hex(3)}"
        self._image = image
        self.platforms: dict[str, Platform] = {}
        self.network: GuestNetwork | None = None
        self._owners: list[_GuestOwner] = []
        self._release = threading.Event()

    def _begin(self) -> None:
        self.launch()

    def _end(self, error: BaseException | None) -> None:
        self.shutdown()

    def __getitem__(self, guest: str) -> Platform:
        return self.platforms[guest]

    def __iter__(self) -> Iterator[Platform]:
        return iter(self.platforms.values())

    def launch(self) -> None:
        """Check, create the network, boot all guests, configure their bridge NICs.
        On any failure (or Ctrl-C) everything started so far is stopped and removed."""
        config = self.config
        # Reap first: a dead instance's backing files would count against the capacity.
        for name in reap_stale_instances():
            log.info("removed the leftovers of instance %s (its owner had died)", name)
        check_host_capacity(config.platforms, runtime_root())  # all guests at once
        bridge = config.network.mode == "bridge"
        if bridge:
            check_subnet_free(config.network, config.source)
        check_qemu()
        image = self._image or ensure_image()  # once, before the guests: they share it
        try:
            if bridge:
                self.network = GuestNetwork(
                    self.name, config.network,
                    [(g.name, g.address) for g in config.guests if g.address is not None],
                ).create()
            for spec in config.guests:
                extra: list[str] = []
                fds: tuple[int, ...] = ()
                if self.network is not None:
                    port = self.network.ports[spec.name]
                    extra = bridge_nic_argv(port.tap_fd, port.mac, str(port.address))
                    fds = (port.tap_fd,)
                self.platforms[spec.name] = Platform(
                    spec.platform, image=image, extra_qemu_args=extra, pass_fds=fds
                )
            self._boot_all()
            if bridge:
                for platform in self.platforms.values():
                    self._setup_bridge_nic(platform)
        except BaseException:
            self.shutdown()
            raise

    def _boot_all(self) -> None:
        log.info("booting %d guests together: %s", len(self.platforms), ", ".join(self.platforms))
        for platform in self.platforms.values():
            owner = _GuestOwner(platform, self._release)
            self._owners.append(owner)
            owner.start()
            # One guest at a time until its QEMU runs (runtime dir, keys, plugin build:
            # nothing there is shared concurrently), then they all boot together.
            while not owner.booted.wait(START_POLL_S) and not _qemu_started(platform):
                pass
        waiting = list(self._owners)
        while waiting:
            for owner in list(waiting):
                if owner.booted.wait(POLL_S / len(waiting)):
                    waiting.remove(owner)
                    if owner.error is not None:  # stop the others at once (launch's except)
                        raise owner.error

    def _setup_bridge_nic(self, platform: Platform) -> None:
        status, out, err = platform.guest().run(["python3", "-"], stdin=NET_SETUP_SCRIPT.read_bytes())
        if status != 0:
            raise GuestError(
                f"configuring the bridge NIC of guest {platform.name} failed: "
                f"{err.decode(errors='replace').strip()}"
            )
        log.info("guest %s on the bridge: %s", platform.name, out.decode().strip())

    def shutdown(self) -> None:
        """Stop every guest, then remove the network. Safe to call more than once."""
        for platform in self.platforms.values():
            platform.shutdown()
        # A guest still booting fails fast once its QEMU is gone; stop it again in case
        # its QEMU started after the pass above.
        for owner in self._owners:
            while not owner.booted.wait(POLL_S):
                owner.platform.shutdown()
            owner.platform.shutdown()
        self._release.set()
        for owner in self._owners:
            owner.join()
        self._owners.clear()
        self._release = threading.Event()
        if self.network is not None:
            self.network.destroy()
            self.network = None

    # -- use -----------------------------------------------------------------------

    def bridge_address(self, guest: str) -> str:
        """The guest's address on the bridge (no prefix)."""
        if self.network is None or guest not in self.network.ports:
            raise GuestError(f"guest {guest} is not on a bridge network")
        return str(self.network.ports[guest].address.ip)

    def run_live(self, argv: list[str]) -> dict[str, LiveRun]:
        """Run ``argv`` in every guest at once, each with its own design attached live
        (its own firmware process; memory bound to its CXL node, its movable DRAM
        node for ``dram-only``): the side-by-side comparison. Every guest must name a design."""
        designs = live_designs(self.config)
        done: dict[str, tuple[int, bytes, bytes]] = {}
        errors: list[BaseException] = []
        with contextlib.ExitStack() as stack:
            sessions = {name: stack.enter_context(self.platforms[name].attach(design))
                        for name, design in designs.items()}

            def run(name: str) -> None:
                try:
                    done[name] = sessions[name].run(argv)
                except BaseException as error:  # re-raised below, in the caller's thread
                    errors.append(error)

            threads = [threading.Thread(target=run, args=(name,), name=f"live-{name}") for name in sessions]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if errors:
                raise errors[0]
        return {
            name: LiveRun(session.design, *done[name], session.results) for name, session in sessions.items()
        }


def live_designs(config: MultiPlatformConfig) -> dict[str, str]:
    """Each guest's design, for a side-by-side run; a :class:`ConfigError` if one has none."""
    unnamed = [g.name for g in config.guests if g.design is None]
    if unnamed:
        raise ConfigError(f"{config.source}: guests {unnamed} name no design; give each `design: NAME`")
    return {g.name: str(g.design) for g in config.guests}


@dataclass(frozen=True)
class LiveRun:
    """One guest's part of :meth:`MultiPlatform.run_live`."""

    design: str
    status: int
    stdout: bytes
    stderr: bytes
    results: dict[str, Any]


def _qemu_started(platform: Platform) -> bool:
    return platform.rundir is not None and (platform.rundir / "qemu.pid").exists()

"""The firmware attached live to a running platform: its process, and one run's session.

Every platform loads the TCG plugin dormant (it only counts instructions and
watches for ROI markers, so the guest boots at nearly plain-TCG speed). A
:class:`LiveSession` attaches a design for one run::

    with platform.attach("skybyte-full", record=Path("run.trace")) as session:
        platform.guest().run([...], watch=session.check)
    session.results["rois"]   # modelled time and counters per ROI

``start()`` starts the firmware process (``./cxlssd serve-firmware``) on the
plugin's ring, hands the plugin the clock parameters (CPI and frequency from
the platform config, DRAM latency from the design) and switches it to its
active mode (LLC model, device requests, clock); ``stop()`` switches it back,
lets the firmware serve what is left and collects its results. ``check()``
raises :class:`FirmwareError` naming the cause when the firmware process has
died or the plugin gave up on it; the platform then stops the run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import cxlssd
from cxlssd.abi.protocol import RING_ATTACHED
from cxlssd.abi.ring import RequestRing, RingError
from cxlssd.errors import ConfigError, FirmwareError, PlacementError
from cxlssd.firmware.profile import Profile, load_profile, parse_override
from cxlssd.guest.runtime.install import with_guest_env
from cxlssd.lifecycle import Lifecycle, ProcessId, describe_exit
from cxlssd.validation import format_size

if TYPE_CHECKING:
    from cxlssd.platform.machine import Platform

log = logging.getLogger(__name__)

ATTACH_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 600.0  # serving a full ring of flash misses takes a while
LOG_TAIL_CHARS = 2000


def control_path(rundir: Path) -> Path:
    """The control file of the instance's firmware: it exists while one is attached."""
    return rundir / "firmware.control"


def attached_firmware_path(rundir: Path) -> Path:
    """What is attached while a session runs: the firmware's pid (process-fault
    injection kills it), design and overrides (injections are checked against them)."""
    return rundir / "firmware.json"


class FirmwareProcess:
    """``./cxlssd serve-firmware`` as a child process with an explicit lifecycle."""

    def __init__(
        self,
        ring: Path,
        counters: Path,
        pv: Path,
        control: Path,
        design: str,
        overrides: Sequence[str],
        results: Path,
        log_path: Path,
        record: Path | None = None,
        cache_map: Path | None = None,
    ) -> None:
        self.ring = ring
        self.cache_map = cache_map
        self.counters = counters
        self.pv = pv
        self.control = control
        self.design = design
        self.overrides = list(overrides)
        self.results_path = results
        self.log_path = log_path
        self.record = record
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        return self._process.pid if self._process is not None else 0

    def identity(self) -> ProcessId:
        """Who may be signalled as this firmware (``firmware-kill``): pid and start time."""
        if self._process is None:
            raise FirmwareError("the firmware process was never started")
        return ProcessId.of_child(self._process)

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "cxlssd", "serve-firmware", "--ring", str(self.ring),
                "--counters", str(self.counters), "--pv", str(self.pv), "--control", str(self.control),
                "--design", self.design,
                "--results", str(self.results_path)]
        for override in self.overrides:
            argv += ["--set", override]
        if self.record is not None:
            argv += ["--record", str(self.record)]
        if self.cache_map is not None:
            argv += ["--cache-map", str(self.cache_map)]
        return argv

    def launch(self, timeout_s: float = ATTACH_TIMEOUT_S) -> None:
        """Start the process and wait until it is attached to the ring."""
        from cxlssd.platform.machine import die_with_parent

        self.results_path.unlink(missing_ok=True)
        with open(self.log_path, "wb") as out:
            self._process = subprocess.Popen(
                self.argv(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=die_with_parent, env=cxlssd.child_env(),
            )
        deadline = time.monotonic() + timeout_s
        with RequestRing(self.ring, consume=False) as observer:
            while True:
                self.check()
                status = observer.status()
                if status.consumer_pid == self.pid and status.consumer_state == RING_ATTACHED:
                    break
                if time.monotonic() > deadline:
                    self.kill()
                    raise FirmwareError(
                        f"the firmware process did not attach to the plugin's ring within {timeout_s:.0f} s; "
                        f"its log: {self.log_path}"
                    )
                time.sleep(0.05)
        log.info("firmware %s attached (pid %d, log %s)", self.design, self.pid, self.log_path)

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace").strip()[-LOG_TAIL_CHARS:]
        except OSError:
            return "(no log)"

    def check(self) -> None:
        """A :class:`FirmwareError` if the process is no longer running."""
        process = self._process
        if process is not None and process.poll() is not None:
            raise FirmwareError(
                f"the firmware process (design {self.design}, pid {process.pid}) "
                f"{describe_exit(process.returncode)}; the run is stopped. "
                f"Its log ({self.log_path}):\n{self._log_tail() or '(empty)'}"
            )

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> dict[str, Any]:
        """SIGTERM, wait until it has served the rest and written its results; return them."""
        process = self._process
        if process is None:
            raise FirmwareError("the firmware process was never started")
        self.check()
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise FirmwareError(
                f"the firmware process did not finish within {timeout_s:.0f} s of being asked to stop "
                f"(killed); its log: {self.log_path}"
            ) from None
        if process.returncode != 0:
            self.check()
        try:
            results: dict[str, Any] = json.loads(self.results_path.read_text())
        except (OSError, ValueError) as error:
            raise FirmwareError(
                f"the firmware wrote no usable results ({error}); its log: {self.log_path}"
            ) from None
        finally:
            self._process = None
        return results

    def kill(self) -> None:
        """Stop at once (SIGKILL); idempotent. Fault injection uses it too."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()


class LiveSession(Lifecycle):
    """One design attached to a running platform, for one run (see the module doc)."""

    def __init__(
        self,
        platform: Platform,
        design: str,
        overrides: Sequence[str] = (),
        record: Path | None = None,
    ) -> None:
        self.platform = platform
        self.design = design
        self.record = record
        self.results: dict[str, Any] = {}
        if len(platform.devices) != 1:
            raise ConfigError(
                f"the live firmware serves one CXL device; config {platform.config.source} has "
                f"{len(platform.devices)} (use a config with one device for --design runs)"
            )
        device = platform.devices[0]
        # The model's device is the guest's: its capacity unless the caller sets it.
        given = {parse_override(text)[0] for text in overrides}
        self.overrides = list(overrides)
        if "device.capacity_bytes" not in given:
            self.overrides.insert(0, f"device.capacity_bytes={device.size_bytes}")
        self.profile: Profile = load_profile(design, self.overrides)  # bad names fail before anything starts
        self.dram_only = self.profile["kind"] == "dram-only"
        self.promotes = bool(self.profile["migration.enabled"]) and not self.dram_only
        budget = self.profile.capacity_bytes("migration.host_capacity_bytes")
        guest = platform.config.guest
        dram, where, key = ((guest.movable_dram_bytes, "the movable DRAM node", "guest.movable_dram")
                            if guest.movable_dram_bytes else (guest.dram_bytes, "node 0", "guest.dram"))
        if self.promotes and budget > dram:
            raise ConfigError(
                f"migration.host_capacity_bytes ({format_size(budget)}) is larger than the guest's DRAM "
                f"for promoted pages ({where}: {format_size(dram)} in {platform.config.source}); "
                f"lower it (--set migration.host_capacity_bytes=256MiB) or raise {key}"
            )
        self._firmware: FirmwareProcess | None = None
        self.placement = "not started"

    def _begin(self) -> None:
        self.start()

    def _end(self, error: BaseException | None) -> None:
        if error is None:
            self.stop()
        else:
            self.abort()

    @property
    def firmware(self) -> FirmwareProcess:
        if self._firmware is None:
            raise FirmwareError("the live session is not started")
        return self._firmware

    def start(self) -> None:
        platform = self.platform
        files = platform.plugin_files()
        # What a run's physical placement started from (docs/live.md, "Placement"): the
        # nodes its pages can be on, but node 0 (it holds the guest kernel's memory too).
        nodes = [] if self.dram_only else [platform.devices[0].node]
        if platform.dram_node is not None and (self.dram_only or self.promotes):
            nodes.append(platform.dram_node)
        if not nodes:
            self.placement = "not reset: node 0 holds the guest kernel's memory too (guest.movable_dram is 0)"
        else:
            # While the plugin sleeps: offlining may move leftover pages through the device.
            try:
                platform.reset_placement(nodes)
                self.placement = "reset"
            except PlacementError as error:
                self.placement = f"not reset: {error}"
                log.warning("the placement of nodes %s is not reset, so this run's physical pages "
                            "(and conflict misses) may differ from other runs': %s", nodes, error)
            if self.promotes and platform.dram_node is None:
                self.placement += " (promoted pages: node 0, not reset; guest.movable_dram is 0)"
        # Firmware knobs (./cxlssd inject ... flash-latency) are appended here while it runs.
        control = control_path(files.ring.parent)
        control.unlink(missing_ok=True)
        os.close(os.open(control, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        self._firmware = FirmwareProcess(
            files.ring, files.counters, files.pv, control, self.design, self.overrides,
            results=files.ring.with_name("firmware-results.json"),
            log_path=platform.log_dir / "firmware.log", record=self.record, cache_map=files.cache_map,
        )
        try:
            self._firmware.launch()
            identity = self._firmware.identity()
            attached_firmware_path(files.ring.parent).write_text(json.dumps(
                {"pid": identity.pid, "start_ticks": identity.start_ticks, "design": self.design,
                 "overrides": self._firmware.overrides}
            ))
            counters = platform.plugin_counters()
            profile = self.profile
            counters.set_clock(
                platform.config.cpu.insn_ps, profile["latency.host_dram_ns"] * 1000,
                store_miss_write=profile["write_log.enabled"] and profile["write_log.store_miss_to_log"],
                llc_cold_at_roi=profile["cpu.llc_cold_at_roi_begin"],
            )
            counters.set_mode(True)
        except BaseException:
            self.abort()
            raise
        log.info("design %s attached live", self.design)

    @property
    def node(self) -> int:
        """Where the run's memory belongs: the CXL node, or for ``dram-only`` the movable
        DRAM node (node 0 without one)."""
        if self.dram_only:
            return self.platform.dram_node if self.platform.dram_node is not None else 0
        return self.platform.devices[0].node

    def run(
        self,
        argv: Sequence[str],
        bind: bool = True,
        stdout: BinaryIO | None = None,
        stderr: BinaryIO | None = None,
        check: bool = False,
        timeout_s: float | None = None,
    ) -> tuple[int, bytes, bytes]:
        """Run ``argv`` in the guest for this session: the guest runtime on its
        PATH, its memory bound to :attr:`node` (unless ``bind`` is False), under
        the promotion daemon if the design promotes pages (docs/host-os.md), and
        stopped with the cause if the firmware or QEMU dies (:meth:`check`) or
        ``timeout_s`` passes (:class:`GuestTimeout`)."""
        bound = ["numactl", f"--membind={self.node}", *argv] if bind else list(argv)
        if self.promotes:
            bound = ["cxlssd-promote", "--", *bound]
        with self.platform.lost_connection_explained():
            return self.platform.guest().run(
                with_guest_env(bound), stdout=stdout, stderr=stderr, check=check, watch=self.check,
                timeout_s=timeout_s,
            )

    def check(self) -> None:
        """Raise :class:`FirmwareError` if the firmware died or the plugin gave up on it,
        :class:`GuestError` if QEMU died."""
        self.platform.check_running()
        self.firmware.check()
        with RequestRing(self.platform.plugin_files().ring, consume=False) as observer:
            try:
                observer.check()
            except RingError as error:
                raise FirmwareError(f"the plugin gave up on the firmware: {error}") from None

    def stop(self) -> dict[str, Any]:
        """Deactivate the plugin, let the firmware finish, return its results."""
        counters = self.platform.plugin_counters()
        try:
            self.platform.check_running()
            counters.set_mode(False)
            self.results = self.firmware.stop()
        except BaseException:
            self.abort()
            raise
        self.results["plugin"] = {"markers_ignored": counters.markers_ignored}
        self.results["placement"] = self.placement
        self._firmware = None
        self._remove_files()
        return self.results

    def _remove_files(self) -> None:
        rundir = self.platform.plugin_files().ring.parent
        control_path(rundir).unlink(missing_ok=True)
        attached_firmware_path(rundir).unlink(missing_ok=True)

    def abort(self) -> None:
        """Stop the firmware at once and put the plugin back to sleep (best effort)."""
        if self._firmware is not None:
            self._firmware.kill()
            self._firmware = None
        with contextlib.suppress(Exception):
            self._remove_files()
        with contextlib.suppress(Exception):
            self.platform.plugin_counters().set_mode(False, wait_s=10.0)

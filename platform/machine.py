"""A running platform instance: QEMU with CXL devices, QMP, SSH, and its runtime dir.

Lifecycle as in QEMU's own ``QEMUMachine``: ``launch()`` boots and makes the
guest ready (CXL regions onlined as CPU-less NUMA nodes), ``shutdown()`` stops
everything and removes the runtime directory (sockets, keys, device backing
files); the context manager does both, also on errors and Ctrl-C. An instance
whose owner died without cleaning up is reaped by the next launch.

QEMU runs with the cxlssd TCG plugin loaded dormant (``plugin=False`` leaves
it out); once the CXL regions are up their windows are published to it, and
:meth:`Platform.attach` attaches a firmware design for a run (``live.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import secrets
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import paramiko
from qemu.qmp import QMPError
from qemu.qmp.legacy import QEMUMonitorProtocol

from cxlssd.abi.counters import PluginCounters
from cxlssd.abi.protocol import PV_BYTES
from cxlssd.abi.pv import create_page
from cxlssd.errors import FirmwareError, GuestError, GuestTimeout, PlacementError, PrerequisiteError
from cxlssd.guest.image import GuestImage, ensure_image
from cxlssd.guest.runtime.build import ensure_runtime
from cxlssd.guest.runtime.install import install_runtime
from cxlssd.host_os.kmod.build import ensure_module
from cxlssd.host_os.kmod.doorbell import DoorbellServer
from cxlssd.host_os.kmod.load import install_helper, load_helper
from cxlssd.lifecycle import Lifecycle, ProcessId, describe_exit
from cxlssd.paths import cache_dir, runtime_root
from cxlssd.platform.config import PlatformConfig
from cxlssd.platform.kvm import probe_kvm
from cxlssd.platform.live import LiveSession
from cxlssd.platform.plugin.build import ensure_plugin
from cxlssd.platform.qemu import LaunchFiles, QemuBinary, check_qemu, forwarded_ssh_port, qemu_argv
from cxlssd.platform.ssh import GuestSSH, InstanceKeys, wait_for_banner
from cxlssd.validation import format_size

log = logging.getLogger(__name__)

CXL_SETUP_SCRIPT = Path(__file__).resolve().parents[1] / "guest" / "cxl_setup.py"
RESET_PLACEMENT_SCRIPT = CXL_SETUP_SCRIPT.with_name("reset_placement.py")
RESET_PLACEMENT_TIMEOUT_S = 120.0
# pxb-cxl bus numbers: device i sits behind host bridge bus 12 + 8*i (see qemu.py).
FIRST_CXL_BUS, CXL_BUS_STRIDE = 12, 8
SHUTDOWN_TIMEOUT_S = 15.0
SERIAL_TAIL_LINES = 25
# What the guest prints on its serial console once sshd listens (the image's
# ssh.service drop-in, guest/rootfs/etc/systemd/system/ssh.service.d).
SSHD_READY = b"cxlssd: sshd is listening"
KEEP_LOG_DIRS = 20
QEMU_REAP_GRACE_S = 1.0  # a lost guest connection waits this long to see whether QEMU died
PRUNE_AFTER_S = 3600  # only log dirs written to longer ago than this are pruned
PR_SET_PDEATHSIG = 1
# q35 puts guest RAM above 2 GiB at 4 GiB and up, and the movable DRAM node's pc-dimm after it
# (1 GiB-aligned): both DRAMs + 4 GiB bound their addresses (the plugin's promoted-page table is
# sized by it: guest-supplied reports above are ignored).
RAM_TOP_SLACK_BYTES = 4 << 30


@dataclass(frozen=True)
class PluginFiles:
    """The plugin's shared files in the instance's runtime dir, and its JSON at exit."""

    counters: Path
    ring: Path
    pv: Path
    report: Path
    # Which device pages are in SSD DRAM, published by the firmware: with the kernel helper's
    # doorbell the plugin asks the firmware about reads of the others only (docs/host-os.md).
    cache_map: Path | None = None

    def qemu_args(self, config: PlatformConfig, doorbell_fd: int | None = None,
                  promote_fd: int | None = None) -> list[str]:
        """The plugin, and the guest's view of the paravirtual clock page (an
        ivshmem BAR backed by the same file the plugin and the firmware map)."""
        cpu = config.cpu
        options = [
            str(ensure_plugin()), f"shm={self.counters}", f"ring={self.ring}", f"pv={self.pv}",
            f"out={self.report}", "mode=dormant", f"llc={cpu.llc_bytes}", f"llc_ways={cpu.llc_ways}",
            f"insn_ps={cpu.insn_ps}", f"string_bytes={cpu.string_bytes_per_insn}",
            f"ram_top={config.guest.dram_bytes + RAM_TOP_SLACK_BYTES + config.guest.movable_dram_bytes}",
        ]
        if doorbell_fd is not None:
            options.append(f"doorbell_fd={doorbell_fd}")
        if promote_fd is not None:
            options.append(f"promote_fd={promote_fd}")
        if self.cache_map is not None:
            options.append(f"cache_map={self.cache_map}")
        return [
            "-plugin", ",".join(options),
            "-object", f"memory-backend-file,id=cxlssd-pv,share=on,mem-path={self.pv},size={PV_BYTES}",
            "-device", "ivshmem-plain,memdev=cxlssd-pv,bus=pcie.0",
        ]


@dataclass(frozen=True)
class CxlDevice:
    """A CXL device as the guest sees it, and where its data lives on the host."""

    index: int
    memdev: str
    region: str
    node: int
    hpa_base: int
    dpa_base: int
    size_bytes: int
    backing_file: Path

    def backing_offset(self, hpa: int) -> int:
        """File offset (== DPA) holding the guest physical address ``hpa`` (1-way interleave)."""
        if not self.hpa_base <= hpa < self.hpa_base + self.size_bytes:
            raise ValueError(f"HPA {hpa:#x} is outside {self.region}")
        return hpa - self.hpa_base + self.dpa_base


def create_cache_map(path: Path, device_bytes: int) -> None:
    """The cache map of ``device_bytes`` of CXL devices: an int32 per 4 KiB page, all -1
    (not cached) until a firmware publishes its data cache there (``DataCache.published``)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(b"\xff" * (device_bytes // 4096 * 4))


def die_with_parent() -> None:
    """Runs in QEMU's child before exec: SIGKILL QEMU if the platform process dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _remaining_s(deadline: float) -> float:
    """What is left until ``deadline`` (monotonic), at least a moment: the step then
    times out at once if it does not finish right away."""
    return max(deadline - time.monotonic(), 0.1)


def pid_file_alive(pid_file: Path) -> bool:
    """Whether the process ``pid_file`` names (a :class:`ProcessId` record) still runs:
    False if the file is missing or garbled, or its pid now belongs to another process.
    Shared by stale-instance reaping and ``inject``."""
    found = ProcessId.read(pid_file)
    return found is not None and found.alive()


def _is_our_instance(rundir: Path) -> bool:
    """Whether ``rundir`` is an instance dir this user's platform made: a real directory
    (not a symlink) owned by us, holding our owner record (``owner.pid``, a regular file)."""
    try:
        found = rundir.lstat()
    except OSError:
        return False
    uid = os.geteuid()
    return (
        stat.S_ISDIR(found.st_mode) and found.st_uid == uid
        and ProcessId.read(rundir / "owner.pid") is not None
        and (rundir / "owner.pid").lstat().st_uid == uid
    )


def reap_stale_instances(root: Path | None = None) -> list[str]:
    """Remove the runtime dirs of instances whose owner process is gone (killed -9),
    killing their QEMU if that very process survived (pid and start time match).
    Anything without our instance record is left alone. ``root``: another runtime root
    than this session's (verified as :func:`runtime_root` verifies its own). Returns
    the names reaped."""
    reaped = []
    for rundir in runtime_root(root).iterdir():
        if not _is_our_instance(rundir) or pid_file_alive(rundir / "owner.pid"):
            continue
        qemu = ProcessId.read(rundir / "qemu.pid")
        if qemu is not None:
            qemu.kill(signal.SIGKILL)
        shutil.rmtree(rundir, ignore_errors=True)
        reaped.append(rundir.name)
    return reaped


def reap_dead_sessions(parent: Path, prefix: str) -> list[str]:
    """Reap the runtime roots ``parent/PREFIXPID`` of sessions whose process ``PID`` is
    gone (a test session killed outright has no teardown, and its root holds a guest's
    CXL backing file in tmpfs): their stale instances, then the root if that empties
    it. A root that is not a private directory of ours, or whose pid runs, is left
    alone. Returns the roots removed."""
    removed = []
    for root in sorted(parent.glob(f"{prefix}*")):
        pid = root.name.removeprefix(prefix)
        if not pid.isdigit() or ProcessId.of(int(pid)) is not None:
            continue
        try:
            reap_stale_instances(root)
            root.rmdir()
        except (PrerequisiteError, OSError):
            continue
        removed.append(root.name)
    return removed


def check_host_capacity(configs: PlatformConfig | Sequence[PlatformConfig], shm_dir: Path) -> None:
    """Refuse a platform the host cannot back: guest DRAM + CXL memory in RAM,
    the CXL backing files on tmpfs. Several configs: guests started together,
    which must all fit at once (``MultiPlatform``)."""
    group = [configs] if isinstance(configs, PlatformConfig) else list(configs)
    what = (
        group[0].source if len(group) == 1
        else f"{len(group)} guests together ({', '.join(c.name for c in group)})"
    )
    cxl_total = sum(c.cxl_total_bytes for c in group)
    stat = os.statvfs(shm_dir)
    shm_free = stat.f_bavail * stat.f_frsize
    if cxl_total > shm_free:
        raise PrerequisiteError(
            f"{what}: the CXL devices need {format_size(cxl_total)} of "
            f"backing files but {shm_dir} has {shm_free >> 20} MiB free; use smaller cxl_devices sizes"
        )
    meminfo = Path("/proc/meminfo").read_text()
    available = (
        int(next(x for x in meminfo.splitlines() if x.startswith("MemAvailable")).split()[1]) << 10
    )
    need = sum(c.host_memory_bytes for c in group)
    if need > available:
        raise PrerequisiteError(
            f"{what}: guest DRAM + CXL memory is {format_size(need)} but the host has only "
            f"{available >> 20} MiB available; reduce guest.dram, guest.movable_dram or cxl_devices sizes"
        )


class Platform(Lifecycle):
    """One QEMU guest with CXL Type-3 devices, ready for commands over SSH."""

    def __init__(
        self, config: PlatformConfig, image: GuestImage | None = None,
        extra_qemu_args: Sequence[str] = (), plugin: bool = True,
        pass_fds: Sequence[int] = (),
    ) -> None:
        self.config = config
        self.plugin = plugin
        # The guest kernel helper (host_os/kmod/, docs/host-os.md) and its doorbell: with the
        # plugin and guest.kernel_helper (the default). Its first build creates a trixie build
        # root (root, ~3 min, once).
        self.kernel_helper = plugin and config.guest.kernel_helper
        self.doorbell: DoorbellServer | None = None
        # Appended to QEMU's command line (e.g. ``-plugin``); an argv list, never a shell string.
        self.extra_qemu_args = list(extra_qemu_args)
        # Descriptors QEMU inherits, named in extra_qemu_args (a tap: ``-netdev tap,fd=N``).
        self.pass_fds = tuple(pass_fds)
        self.name = f"{config.name}-{secrets.token_hex(3)}"
        # A guest booting in its own thread (multi.py) shuts itself down when its boot
        # fails while the main thread shuts every guest down (Ctrl-C): one at a time, or
        # both closed the doorbell's descriptors (EBADF, measured in CI)
        self._shutdown_lock = threading.RLock()
        self._image = image
        self.rundir: Path | None = None
        self.log_dir = cache_dir() / "logs" / self.name
        self.serial_log = self.log_dir / "serial.log"
        self.devices: list[CxlDevice] = []
        # The movable DRAM node (guest.movable_dram): promoted pages and dram-only runs.
        self.dram_node: int | None = None
        self.ssh: GuestSSH | None = None
        self.boot_seconds: float | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._qmp: QEMUMonitorProtocol | None = None
        self._keys: InstanceKeys | None = None
        self._files: LaunchFiles | None = None
        self._plugin_files: PluginFiles | None = None
        self._counters: PluginCounters | None = None
        self.ssh_port = 0

    # -- lifecycle -----------------------------------------------------------------

    def _begin(self) -> None:
        self.launch()

    def _end(self, error: BaseException | None) -> None:
        self.shutdown()

    def launch(self) -> None:
        """Boot the guest and bring the CXL devices up as NUMA nodes.
        On any failure (or Ctrl-C) everything started so far is stopped."""
        root = runtime_root()
        # Reap first: a dead instance's backing files would count against the capacity.
        for name in reap_stale_instances():
            log.info("removed the leftovers of instance %s (its owner had died)", name)
        check_host_capacity(self.config, root)  # the input first: before minutes of building
        qemu = check_qemu()
        image = self._image or ensure_image()
        runtime = ensure_runtime()  # built before booting: a compiler error costs no boot
        helper = ensure_module(image.kernel) if self.kernel_helper else None
        log.info("%s", probe_kvm().notice())
        try:
            self._start(qemu, image, root)
            started = time.monotonic()
            # guest.boot_timeout_s covers everything up to ready: boot, CXL setup, runtime.
            deadline = started + self.config.guest.boot_timeout_s
            self._wait_until_ready(deadline)
            try:
                self.devices, self.dram_node = self._setup_cxl(deadline)
                self._publish_windows()
                assert self.ssh is not None
                install_runtime(self.ssh, runtime, _remaining_s(deadline))
                if helper is not None:
                    install_helper(self.ssh, helper, _remaining_s(deadline))
                    load_helper(self.ssh, helper)
            except GuestTimeout as error:
                raise self._not_ready(f"({error})") from None
            self._write_instance_file()  # now with what the guest made of each device
            self.boot_seconds = time.monotonic() - started
            log.info(
                "guest %s ready in %.0f s (emulator wall-clock, not a result)",
                self.name,
                self.boot_seconds,
            )
        except BaseException:
            self.shutdown()
            raise

    def _start(self, qemu: QemuBinary, image: GuestImage, root: Path) -> None:
        rundir = root / self.name
        rundir.mkdir(mode=0o700)
        self.rundir = rundir
        ProcessId.of_self().write(rundir / "owner.pid")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._prune_logs()
        self._keys = InstanceKeys.generate(rundir)
        files = LaunchFiles(
            kernel=image.kernel,
            rootfs=image.rootfs,
            qmp_socket=rundir / "qmp.sock",
            serial_log=self.serial_log,
            host_key=self._keys.host_key,
            authorized_keys=self._keys.authorized_keys,
            cxl_backing=tuple(rundir / f"cxl{i}.raw" for i in range(len(self.config.cxl_devices))),
        )
        self._files = files
        argv = [*qemu_argv(qemu, self.config, files), *self.extra_qemu_args]
        pass_fds = self.pass_fds
        if self.plugin:
            # Paths go into QEMU's comma-separated plugin options: the runtime root has no commas.
            cache_map = rundir / "plugin.cachemap" if self.kernel_helper else None
            self._plugin_files = PluginFiles(
                rundir / "plugin.counters", rundir / "plugin.ring", rundir / "plugin.pv",
                self.log_dir / "plugin.json", cache_map=cache_map,
            )
            create_page(self._plugin_files.pv)
            doorbell_fd = promote_fd = None
            if cache_map is not None:
                # The plugin rings vector 0 on a long-delay answer and vector 1 when the
                # mailbox got promotion decisions (docs/host-os.md): QEMU inherits their
                # eventfds, the plugin is told their numbers.
                create_cache_map(cache_map, self.config.cxl_total_bytes)
                self.doorbell = DoorbellServer(rundir / "doorbell.sock", vectors=2)
                self.doorbell.start()
                doorbell_fd, promote_fd = self.doorbell.eventfd(0), self.doorbell.eventfd(1)
                argv += self.doorbell.qemu_args()
                pass_fds = (*pass_fds, doorbell_fd, promote_fd)
            argv += self._plugin_files.qemu_args(self.config, doorbell_fd, promote_fd)
        log.debug("QEMU: %s", argv)
        self._write_instance_file()
        with open(self.log_dir / "qemu.log", "wb") as qemu_log:
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=qemu_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
                pass_fds=pass_fds,
            )
        ProcessId.of_child(self._process).write(rundir / "qemu.pid")
        log.info(
            "booting guest %s (QEMU pid %d, serial log %s)",
            self.name,
            self._process.pid,
            self.serial_log,
        )

    def _write_instance_file(self) -> None:
        """``instance.json``: how other processes (``./cxlssd inject``) reach and check
        this instance. Devices carry the guest's view once the CXL setup has run."""
        assert self.rundir is not None and self._files is not None
        found = {d.index: d for d in self.devices}
        devices = []
        for index, device in enumerate(self.config.cxl_devices):
            entry: dict[str, object] = {"index": index, "size_bytes": device.size_bytes}
            if index in found:
                d = found[index]
                entry.update(memdev=d.memdev, region=d.region, node=d.node,
                             hpa_base=d.hpa_base, dpa_base=d.dpa_base)
            devices.append(entry)
        # Written whole and renamed, so another process never reads half a file.
        staging = self.rundir / "instance.json.tmp"
        staging.write_text(
            json.dumps(
                {
                    "name": self.name,
                    "ssh_port": self.ssh_port,
                    "qmp_socket": str(self._files.qmp_socket),
                    "inject_socket": str(self._files.inject_socket),
                    "config": self.config.source,
                    "devices": devices,
                    "dram_node": self.dram_node,
                }
            )
        )
        staging.replace(self.rundir / "instance.json")

    def check_running(self) -> None:
        """A :class:`GuestError` if QEMU died under the platform (a run's watchdog)."""
        self._check_alive("running")

    @contextlib.contextmanager
    def lost_connection_explained(self) -> Iterator[None]:
        """A connection to the guest lost because QEMU died is that :class:`GuestError`
        (naming QEMU and how it ended), not the socket's "Connection reset by peer"."""
        try:
            yield
        except (OSError, EOFError, paramiko.SSHException):
            # A killed process's sockets close before it can be reaped: give it a moment.
            deadline = time.monotonic() + QEMU_REAP_GRACE_S
            while time.monotonic() < deadline:
                self.check_running()
                time.sleep(0.05)
            raise

    def _check_alive(self, phase: str = "booting") -> None:
        process = self._process
        if process is None:  # shutdown() ran meanwhile (another thread: MultiPlatform)
            raise GuestError(f"guest {self.name} was shut down while {phase}")
        if process.poll() is not None:
            qemu_out = (self.log_dir / "qemu.log").read_text(errors="replace").strip()
            raise GuestError(
                f"QEMU {describe_exit(process.returncode)} while {phase}: "
                f"{qemu_out[-1500:] or '(no output)'}\n{self.serial_tail()}"
            )

    def _not_ready(self, detail: str = "") -> GuestError:
        return GuestError(
            f"guest {self.name} was not ready within {self.config.guest.boot_timeout_s:.0f} s "
            f"(guest.boot_timeout_s in {self.config.source}: boot, CXL setup and runtime install)"
            f"{' ' + detail if detail else ''}; {self.serial_tail()}"
        )

    def _connect_qmp(self, deadline: float) -> QEMUMonitorProtocol:
        """QMP, as soon as QEMU has created its socket."""
        assert self._files is not None
        while True:
            self._check_alive()
            # Not before the socket exists: qemu.qmp logs every failed attempt as an error.
            if self._files.qmp_socket.is_socket():
                qmp = QEMUMonitorProtocol(str(self._files.qmp_socket))
                try:
                    qmp.connect()
                    return qmp
                except QMPError:
                    qmp.close()
            if time.monotonic() > deadline:
                raise self._not_ready("(QEMU never opened its QMP socket)")
            time.sleep(0.1)

    def _wait_until_ready(self, deadline: float) -> None:
        assert self._keys is not None
        self._qmp = self._connect_qmp(deadline)
        # QEMU bound the SSH forward's port itself (port 0); other processes find it here.
        usernet = self._qmp.cmd("human-monitor-command", **{"command-line": "info usernet"})
        self.ssh_port = forwarded_ssh_port(str(usernet))
        self._write_instance_file()
        # Not a TCP probe before sshd listens: QEMU accepts it on the host side at once,
        # and while the guest has no network yet its SYN retries deliver it to sshd
        # seconds after boot, a fork and key exchange inside some program's ROI.
        self._wait_for_serial(SSHD_READY, deadline)
        try:
            wait_for_banner(self.ssh_port, deadline, self._check_alive)
        except TimeoutError:
            raise self._not_ready() from None
        self.ssh = GuestSSH(self.ssh_port, self._keys)
        try:
            self.ssh.connect()
        except (paramiko.SSHException, OSError) as error:
            raise GuestError(
                f"cannot log in to guest {self.name} over SSH ({error}); {self.serial_tail()}"
            ) from None

    def _wait_for_serial(self, line: bytes, deadline: float) -> None:
        """Until the guest has printed ``line`` on its serial console."""
        while True:
            self._check_alive()
            try:
                if line in self.serial_log.read_bytes():
                    return
            except FileNotFoundError:
                pass  # QEMU has not opened it yet
            if time.monotonic() > deadline:
                raise self._not_ready(f"(no '{line.decode()}' on the serial console)")
            time.sleep(0.2)

    def _setup_cxl(self, deadline: float) -> tuple[list[CxlDevice], int | None]:
        assert self.ssh is not None and self._files is not None
        status, out, err = self.ssh.run(
            ["python3", "-", str(len(self.config.cxl_devices))], stdin=CXL_SETUP_SCRIPT.read_bytes(),
            timeout_s=_remaining_s(deadline),
        )
        if status != 0:
            raise GuestError(
                f"setting up the CXL devices in the guest failed: {err.decode().strip()}"
            )
        setup = json.loads(out)
        devices = []
        for found in setup["devices"]:
            index = (found["host_bridge_bus"] - FIRST_CXL_BUS) // CXL_BUS_STRIDE
            devices.append(
                CxlDevice(
                    index=index,
                    memdev=found["memdev"],
                    region=found["region"],
                    node=found["node"],
                    hpa_base=found["hpa_base"],
                    dpa_base=found["dpa_base"],
                    size_bytes=found["size_bytes"],
                    backing_file=self._files.cxl_backing[index],
                )
            )
        devices.sort(key=lambda d: d.index)
        if len(devices) != len(self.config.cxl_devices):
            raise GuestError(
                f"the guest found {len(devices)} CXL devices, the config has {len(self.config.cxl_devices)}"
            )
        dram_node = setup["dram_node"]
        if self.config.guest.movable_dram_bytes and dram_node is None:
            raise GuestError(
                "the guest has no movable DRAM node (a node without CPUs besides the CXL devices') "
                f"although guest.movable_dram is {format_size(self.config.guest.movable_dram_bytes)}"
            )
        return devices, dram_node

    def _publish_windows(self) -> None:
        """Tell the plugin where the guest put each device (its region's HPA range)."""
        if self._plugin_files is None:
            return
        counters = PluginCounters(self._plugin_files.counters)
        counters.open()
        self._counters = counters
        for device in self.devices:
            counters.publish_window(device.hpa_base, device.size_bytes, device.dpa_base)

    def shutdown(self) -> None:
        """Stop QEMU and remove the runtime directory. Safe to call more than once, also
        from two threads at once."""
        with self._shutdown_lock:
            self._shutdown()

    def _shutdown(self) -> None:
        if self._counters is not None:
            self._counters.close()
            self._counters = None
        if self.ssh is not None:
            self.ssh.close()
            self.ssh = None
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            if self._qmp is not None:
                # QEMU may close the socket before answering 'quit'. Bounded: a QEMU (or a
                # QMP client interrupted mid-call) that never answers must not hang shutdown.
                self._qmp.settimeout(SHUTDOWN_TIMEOUT_S)
                with contextlib.suppress(Exception):
                    self._qmp.cmd("quit")
            else:  # not connected yet (boot failed or interrupted): QEMU quits on SIGTERM
                process.terminate()
            try:
                process.wait(timeout=SHUTDOWN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._qmp is not None:
            with contextlib.suppress(Exception):
                self._qmp.close()
            self._qmp = None
        if self.doorbell is not None:
            self.doorbell.stop()
            self.doorbell = None
        if self.rundir is not None:
            shutil.rmtree(self.rundir, ignore_errors=True)
            self.rundir = None

    # -- use -----------------------------------------------------------------------

    @property
    def qmp(self) -> QEMUMonitorProtocol:
        if self._qmp is None:
            raise GuestError(f"instance {self.name} is not running")
        return self._qmp

    def guest(self) -> GuestSSH:
        if self.ssh is None:
            raise GuestError(f"instance {self.name} is not running")
        return self.ssh

    def plugin_files(self) -> PluginFiles:
        if self._plugin_files is None:
            raise FirmwareError(f"instance {self.name} runs without the TCG plugin: nothing to attach to")
        return self._plugin_files

    def plugin_counters(self) -> PluginCounters:
        """The plugin's shared counters (mapped once the guest is ready)."""
        if self._counters is None:
            raise FirmwareError(f"instance {self.name} has no plugin counters (no plugin, or not ready)")
        return self._counters

    def reset_placement(self, nodes: Sequence[int]) -> None:
        """Put the free memory of ``nodes`` (the CXL node, the movable DRAM node) in its
        fixed order (guest/reset_placement.py), so the next program bound to them gets the
        same physical pages as in any other run. A :class:`PlacementError` naming the block
        if one cannot be offlined."""
        status, _, err = self.guest().run(
            ["python3", "-", *(str(node) for node in nodes)], stdin=RESET_PLACEMENT_SCRIPT.read_bytes(),
            timeout_s=RESET_PLACEMENT_TIMEOUT_S,
        )
        if status != 0:
            message = err.decode(errors="replace").strip()
            raise PlacementError(message or f"reset_placement exited with status {status}")

    def attach(self, design: str, overrides: Sequence[str] = (), record: Path | None = None) -> LiveSession:
        """A live firmware session for ``design`` (a context manager; see ``live.py``)."""
        self.plugin_files()
        return LiveSession(self, design, overrides, record)

    def serial_tail(self, lines: int = SERIAL_TAIL_LINES) -> str:
        try:
            text = self.serial_log.read_text(errors="replace")
        except OSError:
            return "no serial output"
        tail = "\n".join(text.strip().splitlines()[-lines:])
        return f"last lines of the serial log ({self.serial_log}):\n{tail}"

    def _prune_logs(self) -> None:
        def last_written(directory: Path) -> float:
            return max((f.stat().st_mtime for f in directory.iterdir()), default=directory.stat().st_mtime)

        logs = sorted(self.log_dir.parent.iterdir(), key=last_written)
        stale = time.time() - PRUNE_AFTER_S  # a quiet, still running instance keeps its logs
        for old in logs[:-KEEP_LOG_DIRS]:
            if last_written(old) < stale:
                shutil.rmtree(old, ignore_errors=True)

"""The QEMU binary and the command line of a CXL platform.

Topology (measured to work with QEMU 10.0 under TCG, see docs/platform.md):
each CXL device gets its own ``pxb-cxl`` host bridge, root port and fixed
memory window, so each becomes its own region and CPU-less NUMA node.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cxlssd.errors import GuestError, PrerequisiteError
from cxlssd.platform.config import MiB, PlatformConfig

QEMU_MIN_VERSION = (10, 0)
# QEMU's memory hotplug area, where the CXL windows are placed after; room for the windows.
MAXMEM_EXTRA_BYTES = 8 << 30


@dataclass(frozen=True)
class QemuBinary:
    binary: str
    version: tuple[int, int, int]

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))


def check_qemu() -> QemuBinary:
    """Find ``qemu-system-x86_64`` (or ``$CXLSSD_QEMU``) and check it is new enough."""
    name = os.environ.get("CXLSSD_QEMU", "qemu-system-x86_64")
    binary = shutil.which(name)
    if binary is None:
        raise PrerequisiteError(
            f"QEMU not found ({name}); run ./cxlssd setup to install QEMU 10 from bookworm-backports"
        )
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        raise PrerequisiteError(f"cannot run {binary} --version: {error}") from None
    match = re.search(r"version (\d+)\.(\d+)\.(\d+)", out)
    if not match:
        raise PrerequisiteError(f"{binary} --version printed no QEMU version; is it QEMU?")
    version = (int(match.group(1)), int(match.group(2)), int(match.group(3)))
    if version[:2] < QEMU_MIN_VERSION:
        need = ".".join(map(str, QEMU_MIN_VERSION))
        raise PrerequisiteError(
            f"QEMU {'.'.join(map(str, version))} at {binary} is too old; cxlssd needs >= {need} "
            "(run ./cxlssd setup, which installs it from bookworm-backports)"
        )
    return QemuBinary(binary=binary, version=version)


@dataclass(frozen=True)
class LaunchFiles:
    """Per-instance files the command line refers to (all inside the runtime dir)."""

    kernel: Path
    rootfs: Path
    qmp_socket: Path
    serial_log: Path
    host_key: Path
    authorized_keys: Path
    cxl_backing: tuple[Path, ...]

    @property
    def inject_socket(self) -> Path:
        """A second QMP server, next to the first, for other processes (``./cxlssd
        inject``): QEMU's QMP socket serves one client at a time and the platform
        holds the first."""
        return self.qmp_socket.with_name("inject.sock")

    def dc_backing(self, index: int) -> Path:
        """The backing file of device ``index``'s dynamic capacity, next to its static
        one (file offset == DPA - the first DC region's base)."""
        static = self.cxl_backing[index]
        return static.with_name(f"{static.stem}-dc{static.suffix}")


KERNEL_ARGS = (
    # The root filesystem is the initramfs (see guest/image.py): no disk, no DMA.
    "console=ttyS0", "rdinit=/sbin/init", "net.ifnames=0", "panic=-1", "loglevel=4",
    # CXL memory comes up offline so the platform can online it ZONE_MOVABLE: the
    # guest kernel's own allocations then stay on node 0.
    "memhp_default_state=offline",
    "mitigations=off", "systemd.show_status=false",
    # Periodic kernel work that preempted programs inside ROIs (docs/live.md, "A quiet
    # guest"): the soft-lockup watchdog's stop-machine every 4 s, pressure-stall
    # averaging every 2 s, and each node's kcompactd waking every 500 ms to score
    # fragmentation for proactive compaction (which would also move a run's pages
    # between the placement resets).
    "nowatchdog", "psi=0", "sysctl.vm.compaction_proactiveness=0",
)


# The guest's clocks follow its instructions (config guest.clock: instructions): 2^0 ns of
# guest time per instruction, the finest QEMU offers (the modelled CPU runs 3 per ns).
# sleep=on: while the guest is idle (waiting for SSH, the network, a peer guest) its
# clock runs on host time as before. With sleep=off it would jump from timer to timer
# as fast as the host can, so a guest waiting for the host would run its timers, and
# time out its TCP and SSH peers, in proportion to how long the host takes: the very
# coupling -icount removes from busy guests. docs/live.md has the cost.
ICOUNT_ARGS = ("-icount", "shift=0,sleep=on")


def _qemu_size(size_bytes: int) -> str:
    """QEMU's size syntax (its suffixes are binary: M = MiB); sizes are whole MiB."""
    return f"{size_bytes // MiB}M"


def _movable_dram_args(size_bytes: int) -> list[str]:
    """Node 1, DRAM without CPUs: a cold-plugged pc-dimm in the memory hotplug area, so
    the guest adds it offline (memhp_default_state) and the CXL setup onlines it
    ZONE_MOVABLE; its placement can then be reset like the CXL node's (docs/live.md)."""
    if not size_bytes:
        return []
    return [
        "-object", f"memory-backend-ram,id=ram1,size={_qemu_size(size_bytes)}",
        "-numa", "node,nodeid=1",
        "-device", "pc-dimm,id=movable-dram,memdev=ram1,node=1",
    ]


def qemu_argv(qemu: QemuBinary, config: PlatformConfig, files: LaunchFiles) -> list[str]:
    """The QEMU command line for ``config``, as an argv list. The guest's user network
    is ``restrict=on`` (no traffic leaves the guest; the SSH forward still reaches it)
    and QEMU binds the forward's host port itself (port 0: no other process can take it
    between choosing and binding); :func:`forwarded_ssh_port` reads which it took."""
    dram = _qemu_size(config.guest.dram_bytes)
    maxmem = _qemu_size(config.guest.dram_bytes + MAXMEM_EXTRA_BYTES)
    argv = [
        qemu.binary,
        "-M", "q35,cxl=on", "-accel", "tcg", "-cpu", "max,hypervisor=off",
        "-m", f"{dram},maxmem={maxmem},slots=4", "-smp", str(config.guest.vcpus),
        "-object", f"memory-backend-ram,id=ram0,size={dram}",
        "-numa", f"node,nodeid=0,cpus=0-{config.guest.vcpus - 1},memdev=ram0",
        *_movable_dram_args(config.guest.movable_dram_bytes),
        "-kernel", str(files.kernel), "-initrd", str(files.rootfs),
        "-append", " ".join(KERNEL_ARGS),
        "-netdev", "user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:0-:22",
        "-device", "virtio-net-pci,netdev=net0,bus=pcie.0",
        "-fw_cfg", f"name=opt/cxlssd/ssh_host_ed25519_key,file={files.host_key}",
        "-fw_cfg", f"name=opt/cxlssd/authorized_keys,file={files.authorized_keys}",
        "-qmp", f"unix:{files.qmp_socket},server=on,wait=off",
        "-qmp", f"unix:{files.inject_socket},server=on,wait=off",
        "-serial", f"file:{files.serial_log}",
        # -nodefaults: no VGA and no CD-ROM. Their periodic work in the guest (fbcon's
        # cursor blink with DRM's damage work every 200 ms, the CD-ROM's media poll every
        # 2 s) preempted programs inside ROIs by 5-14 000 instructions (docs/live.md).
        "-display", "none", "-monitor", "none", "-nodefaults", "-no-reboot",
        *(ICOUNT_ARGS if config.guest.clock == "instructions" else ()),
    ]
    windows = []
    for index, (device, backing) in enumerate(
        zip(config.cxl_devices, files.cxl_backing, strict=True)
    ):
        size = _qemu_size(device.size_bytes)
        dynamic = device.dynamic_capacity
        dc_object, dc_options = [], ""
        if dynamic is not None:
            # A DCD (QEMU 10.0 cxl-type3): its DC regions split this backend evenly, after the
            # static capacity in DPA space; QEMU's DC block size is 2 MiB.
            dc_object = [
                "-object",
                f"memory-backend-file,id=cxl-dc{index},share=on,mem-path={files.dc_backing(index)},"
                f"size={_qemu_size(dynamic.size_bytes)}",
            ]
            dc_options = f",volatile-dc-memdev=cxl-dc{index},num-dc-regions={dynamic.regions}"
        argv += [
            "-object",
            f"memory-backend-file,id=cxl-mem{index},share=on,mem-path={backing},size={size}",
            *dc_object,
            "-device",
            f"pxb-cxl,bus_nr={12 + 8 * index},bus=pcie.0,id=cxl.{index}",
            "-device",
            f"cxl-rp,port=0,bus=cxl.{index},id=cxl-rp{index},chassis=0,slot={2 + index}",
            # x-pcie-err-unc-mask=off lets injected uncorrectable errors reach the guest.
            "-device",
            f"cxl-type3,bus=cxl-rp{index},volatile-memdev=cxl-mem{index}{dc_options},"
            f"id=cxl-vmem{index},x-pcie-err-unc-mask=off",
        ]
        # The window spans the static capacity only: the guest kernel (6.12) has no
        # DC partition, so it never maps dynamic capacity (docs/inject.md).
        windows.append(f"cxl-fmw.{index}.targets.0=cxl.{index},cxl-fmw.{index}.size={size}")
    # QEMU takes all fixed memory windows in one -M option ("used inconsistently" otherwise).
    return [*argv, "-M", ",".join(windows)]


_SSH_FORWARD = re.compile(r"TCP\[HOST_FORWARD\]\s+\d+\s+127\.0\.0\.1\s+(\d+)\s+\S+\s+22\s")


def forwarded_ssh_port(usernet: str) -> int:
    """The host port QEMU bound for the guest's SSH, from HMP ``info usernet``."""
    match = _SSH_FORWARD.search(usernet)
    if match is None:
        raise GuestError(f"QEMU reports no SSH forward for the guest (info usernet: {usernet.strip()[:300]})")
    return int(match.group(1))


# fw_cfg file telling the guest its bridge NIC (``guest/net_setup.py``): "mac=M address=A/P".
BRIDGE_FW_CFG = "opt/cxlssd/bridge"


def bridge_nic_argv(tap_fd: int, mac: str, address: str) -> list[str]:
    """A second NIC on the platform's bridge: QEMU uses the tap already open as
    ``tap_fd`` (opened inside the platform's network namespace, inherited by QEMU,
    which itself stays in the host namespace for its 127.0.0.1 SSH forward). The
    guest learns its address like its keys, through fw_cfg."""
    return [
        "-netdev", f"tap,id=bridge0,fd={tap_fd}",
        "-device", f"virtio-net-pci,netdev=bridge0,mac={mac},bus=pcie.0",
        "-fw_cfg", f"name={BRIDGE_FW_CFG},string=mac={mac} address={address}",
    ]

"""The QEMU command line: the measured CXL topology, private sockets, loopback-only SSH."""

from __future__ import annotations

from pathlib import Path

import pytest

from cxlssd.errors import GuestError
from cxlssd.platform.config import CONFIG_DIR, PlatformConfig, config_from_dict, load_config
from cxlssd.platform.qemu import LaunchFiles, QemuBinary, forwarded_ssh_port, qemu_argv


def _argv(config_name: str, config: PlatformConfig | None = None) -> list[str]:
    config = config or load_config(CONFIG_DIR / config_name)
    run = Path("/run/x")
    files = LaunchFiles(
        kernel=Path("/k"),
        rootfs=Path("/r"),
        qmp_socket=run / "qmp.sock",
        serial_log=Path("/log/serial"),
        host_key=run / "hk",
        authorized_keys=run / "ak",
        cxl_backing=tuple(run / f"cxl{i}.raw" for i in range(len(config.cxl_devices))),
    )
    return qemu_argv(QemuBinary("/usr/bin/qemu", (10, 0, 2)), config, files)


def test_two_devices_get_own_bridges_and_windows() -> None:
    argv = _argv("two-devices.yaml")
    joined = " ".join(argv)
    assert "cpu max,hypervisor=off" in joined.replace("-cpu ", "cpu ")
    assert "memory-backend-file,id=cxl-mem0,share=on,mem-path=/run/x/cxl0.raw,size=512M" in argv
    assert "memory-backend-file,id=cxl-mem1,share=on,mem-path=/run/x/cxl1.raw,size=256M" in argv
    assert "pxb-cxl,bus_nr=12,bus=pcie.0,id=cxl.0" in argv
    assert "pxb-cxl,bus_nr=20,bus=pcie.0,id=cxl.1" in argv
    # QEMU rejects the windows split over several -M options.
    windows = [a for a in argv if a.startswith("cxl-fmw")]
    assert windows == [
        "cxl-fmw.0.targets.0=cxl.0,cxl-fmw.0.size=512M,"
        "cxl-fmw.1.targets.0=cxl.1,cxl-fmw.1.size=256M"
    ]


def test_the_movable_dram_node_is_a_cold_plugged_dimm_on_a_cpu_less_node() -> None:
    argv = _argv("default.yaml")
    assert "memory-backend-ram,id=ram1,size=2048M" in argv
    assert argv[argv.index("node,nodeid=1") - 1] == "-numa"  # no cpus=, no memory at boot
    assert "pc-dimm,id=movable-dram,memdev=ram1,node=1" in argv
    without = config_from_dict({"guest": {"movable_dram": 0}}, "t.yaml")
    assert not [a for a in _argv("", without) if "pc-dimm" in a or "nodeid=1" in a]


def test_ssh_forward_is_loopback_only_and_qmp_is_a_unix_socket() -> None:
    """The user network lets nothing out of the guest (restrict=on) but the SSH forward,
    whose host port QEMU binds itself (port 0), read back from ``info usernet``."""
    argv = _argv("default.yaml")
    assert "user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:0-:22" in argv
    usernet = (
        "Hub -1 (net0):\n  Protocol[State]    FD  Source Address  Port   Dest. Address  Port RecvQ SendQ\n"
        "  TCP[HOST_FORWARD]   8       127.0.0.1 45755       10.0.2.15    22     0     0\n"
    )
    assert forwarded_ssh_port(usernet) == 45755
    with pytest.raises(GuestError, match="no SSH forward"):
        forwarded_ssh_port("Hub -1 (net0):\n")
    assert "unix:/run/x/qmp.sock,server=on,wait=off" in argv
    assert "-m" in argv and argv[argv.index("-m") + 1] == "2048M,maxmem=10240M,slots=4"


def test_root_is_the_initramfs_so_no_disk_dma_into_the_cxl_window() -> None:
    argv = _argv("default.yaml")
    assert argv[argv.index("-initrd") + 1] == "/r"
    assert "rdinit=/sbin/init" in argv[argv.index("-append") + 1]
    assert not any("virtio-blk" in a or a == "-drive" for a in argv)


def test_guest_clocks_follow_instructions_by_default_and_host_time_on_request() -> None:
    argv = _argv("default.yaml")
    assert argv[argv.index("-icount") + 1] == "shift=0,sleep=on"
    host = _argv("", config_from_dict({"guest": {"clock": "host"}}))
    assert "-icount" not in host


def test_the_guest_gets_no_default_devices_and_no_periodic_housekeeping() -> None:
    """docs/platform.md, "A quiet guest": work that preempted programs inside ROIs."""
    argv = _argv("default.yaml")
    assert "-nodefaults" in argv  # no VGA (fbcon's cursor blink), no CD-ROM (media poll)
    kernel_args = argv[argv.index("-append") + 1].split()
    assert {"nowatchdog", "psi=0", "sysctl.vm.compaction_proactiveness=0"} <= set(kernel_args)

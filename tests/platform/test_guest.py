"""Integration: a real guest boots with real CXL Type-3 devices onlined as CPU-less
NUMA nodes, and a process bound to the CXL node really writes into the device."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cxlssd.errors import GuestTimeout
from cxlssd.platform.config import CONFIG_DIR, load_config
from cxlssd.platform.machine import Platform

pytestmark = pytest.mark.guest
MARKER_SCRIPT = Path(__file__).with_name("guest_marker.py")
REPO = Path(__file__).resolve().parents[2]


def _node_facts(platform: Platform, node: int) -> tuple[str, int]:
    guest = platform.guest()
    _, cpulist, _ = guest.run(["cat", f"/sys/devices/system/node/node{node}/cpulist"], check=True)
    _, meminfo, _ = guest.run(["cat", f"/sys/devices/system/node/node{node}/meminfo"], check=True)
    total_kib = next(
        int(line.split()[3]) for line in meminfo.decode().splitlines() if "MemTotal" in line
    )
    return cpulist.decode().strip(), total_kib * 1024


def _assert_cpuless_nodes(platform: Platform) -> None:
    for config_device, device in zip(platform.config.cxl_devices, platform.devices, strict=True):
        cpus, size_bytes = _node_facts(platform, device.node)
        assert cpus == "", f"node {device.node} has CPUs {cpus}"
        assert abs(size_bytes - config_device.size_bytes) <= 0.01 * config_device.size_bytes


def test_cxl_list_shows_memdev_and_region(default_platform: Platform) -> None:
    _, out, _ = default_platform.guest().run(["cxl", "list", "-M", "-R"], check=True)
    listing = json.loads(out)
    memdevs = [m for entry in listing for m in entry.get("memdevs", [])]
    regions = [r for entry in listing for r in entry.get("regions", [])]
    assert [m["ram_size"] for m in memdevs] == [1 << 30]
    assert (
        len(regions) == 1 and regions[0]["type"] == "ram" and regions[0]["decode_state"] == "commit"
    )


def test_cxl_node_is_cpuless_with_the_configured_size(default_platform: Platform) -> None:
    # node 1 is the movable DRAM node (a pc-dimm): the CXL window's node comes after it
    assert [d.node for d in default_platform.devices] == [2]
    _assert_cpuless_nodes(default_platform)
    # ZONE_MOVABLE: the guest kernel's own allocations stay off the device.
    _, zoneinfo, _ = default_platform.guest().run(["cat", "/proc/zoneinfo"], check=True)
    assert "Node 2, zone  Movable" in zoneinfo.decode()


def test_the_movable_dram_node_is_cpuless_movable_and_the_configured_size(default_platform: Platform) -> None:
    assert default_platform.dram_node == 1
    cpus, size_bytes = _node_facts(default_platform, 1)
    assert cpus == "" and size_bytes == default_platform.config.guest.movable_dram_bytes
    _, zoneinfo, _ = default_platform.guest().run(["cat", "/proc/zoneinfo"], check=True)
    node1 = zoneinfo.decode().split("Node 1, zone")[1:]
    present = {zone.split()[0]: int(zone.split("present")[1].split()[0]) for zone in node1}
    # every page of it ZONE_MOVABLE: only programs bound to it (or moved there) use it
    assert present["Movable"] * 4096 == size_bytes and sum(present.values()) == present["Movable"]


def test_the_guest_runs_no_periodic_work_the_platform_removed(default_platform: Platform) -> None:
    """What preempted programs inside ROIs (docs/platform.md, "A quiet guest") is gone from
    the booted guest: no framebuffer, no CD-ROM, no soft-lockup watchdog, no pressure-stall
    averaging, no proactive compaction; and no SSH connection reached sshd that the platform
    did not make (a probe made before the guest had a network arrived seconds later)."""
    script = (
        "ls /sys/class/graphics /sys/class/block; cat /proc/sys/kernel/watchdog "
        "/proc/sys/vm/compaction_proactiveness; test -e /proc/pressure && echo pressure; "
        "journalctl --no-pager -o cat -t sshd-session"
    )
    _, out, _ = default_platform.guest().run(["sh", "-c", script])
    text = out.decode()
    assert "fb0" not in text and "sr0" not in text and "pressure" not in text.splitlines()
    watchdog, proactiveness = [line for line in text.splitlines() if line.isdigit()][:2]
    assert watchdog == "0" and proactiveness == "0"
    # The one banner probe after sshd said it listens (reset: it reads the banner and
    # closes), then the platform's login; nothing closed before authenticating.
    assert "Accepted publickey" in text and "Connection closed by" not in text, text


def test_the_host_sends_the_guest_nothing_while_a_command_runs(default_platform: Platform) -> None:
    """A packet sent by the host's clock (an SSH keepalive, every 15 s until 2026-12-07)
    woke the guest's sshd inside whatever ROI ran then: its count depended on how fast
    the host emulated. A command idle for 20 s gets no network interrupt (read after 2 s,
    once the command's own start-up packets are answered)."""
    script = (
        "sleep 2; before=$(grep virtio0-input /proc/interrupts); sleep 20; "
        'after=$(grep virtio0-input /proc/interrupts); echo "$before"; echo "$after"'
    )
    _, out, _ = default_platform.guest().run(["sh", "-c", script], check=True)
    before, after = out.decode().splitlines()
    assert "virtio0-input" in before and before == after


def test_bound_process_writes_into_the_device_backing_file(default_platform: Platform) -> None:
    marker = secrets.token_bytes(16)
    pages = 64
    device = default_platform.devices[0]
    channel = default_platform.guest().open_process(
        [
            "numactl",
            f"--membind={device.node}",
            "python3",
            "-c",
            MARKER_SCRIPT.read_text(),
            marker.hex(),
            str(pages),
        ]
    )
    try:
        physical = json.loads(channel.makefile("r").readline())
        assert len(physical) == pages
        with open(device.backing_file, "rb") as backing:
            for hpa in physical:
                backing.seek(device.backing_offset(hpa))  # file offset == DPA
                assert backing.read(len(marker)) == marker, f"marker missing at HPA {hpa:#x}"
    finally:
        channel.shutdown_write()
        assert channel.recv_exit_status() == 0


@pytest.mark.slow
def test_two_devices_give_two_cpuless_nodes() -> None:
    with Platform(load_config(CONFIG_DIR / "two-devices.yaml")) as platform:
        assert sorted(d.node for d in platform.devices) == [2, 3]  # node 1: the movable DRAM
        _assert_cpuless_nodes(platform)


@pytest.mark.slow
def test_guest_exec_streams_output_and_exit_status(
    cli: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    # the inner "--" belongs to the command: only the leading one is the separator
    result = cli("guest", "exec", "--", "sh", "-c", "echo hello from $(hostname) $1; exit 3", "--", "x")
    assert result.returncode == 3
    assert "hello from cxlssd-guest x" in result.stdout
    assert "ready in" in result.stderr and "not a result" in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGHUP])
def test_ctrl_c_or_hangup_during_boot_leaves_nothing(tmp_path: Path, signum: signal.Signals) -> None:
    """Ctrl-C, and SIGHUP (a closed terminal) alike, stop QEMU and remove the runtime dir.
    Started with SIGINT ignored, as a script's background job is: a SIGINT sent on
    purpose still interrupts it (it booted on, before the CLI set its handler)."""
    runtime = Path(os.environ["CXLSSD_RUNTIME"])
    before = set(runtime.iterdir()) if runtime.exists() else set()
    process = subprocess.Popen(
        [str(REPO / "cxlssd"), "guest", "exec", "--", "true"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    deadline = time.monotonic() + 120
    while not runtime.is_dir() or not any((d / "qemu.pid").exists() for d in set(runtime.iterdir()) - before):
        assert process.poll() is None and time.monotonic() < deadline, "QEMU never started"
        time.sleep(0.2)
    time.sleep(2)  # QEMU is booting now
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "interrupted" in stderr.decode()
    # The autouse leak check asserts no QEMU process or runtime file remains.


def test_shell_command_logs_in_with_the_pinned_host_key(default_platform: Platform) -> None:
    assert default_platform.rundir is not None
    argv = default_platform.guest().interactive_argv(default_platform.rundir / "known_hosts")
    assert "StrictHostKeyChecking=yes" in argv and "127.0.0.1" in argv[-1]
    result = subprocess.run([*argv, "echo", "shell-ok"], capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0 and result.stdout.strip() == "shell-ok", result.stderr


def test_a_hung_guest_command_times_out_and_the_user_network_is_closed(default_platform: Platform) -> None:
    """A command past its timeout ends in GuestTimeout (the connection stays usable);
    restrict=on: the guest cannot even reach its own SSH forward on the host's loopback
    through the user network's gateway (without it, that connection succeeds)."""
    guest = default_platform.guest()
    began = time.monotonic()
    with pytest.raises(GuestTimeout, match="did not finish within 2 s"):
        guest.run(["sleep", "60"], timeout_s=2)
    assert time.monotonic() - began < 10
    probe = (f"import socket\ntry:\n    socket.create_connection(('10.0.2.2', {default_platform.ssh_port}), "
             "timeout=5)\n    print('reached')\nexcept OSError:\n    print('blocked')\n")
    status, out, _ = guest.run(["python3", "-c", probe], timeout_s=60)
    assert (status, out.decode().strip()) == (0, "blocked")

"""The guest kernel helper (issue 14): its build inputs, the ivshmem server of the doorbell,
and (booting a guest) the module loading, reacting to long-delay answers and unloading
cleanly. host_os/kmod/; the skid it is measured for: experiments/kmod_skid.py."""

from __future__ import annotations

import json
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from cxlssd.errors import PrerequisiteError
from cxlssd.host_os.kmod.build import kernel_release
from cxlssd.host_os.kmod.doorbell import PEER_ID, DoorbellServer


def fake_bzimage(path: Path, version: str) -> Path:
    data = bytearray(0x600)
    data[0x202:0x206] = b"HdrS"
    data[0x20E:0x210] = (0x400 - 0x200).to_bytes(2, "little")
    data[0x400:0x400 + len(version)] = version.encode()
    path.write_bytes(bytes(data))
    return path


def test_the_kernel_release_is_read_from_the_bzimage_header(tmp_path: Path) -> None:
    image = fake_bzimage(tmp_path / "vmlinuz", "6.12.117+deb13-amd64 (debian-kernel@lists.debian.org) #1 SMP")
    assert kernel_release(image) == "6.12.117+deb13-amd64"


def test_a_file_that_is_no_bzimage_is_refused(tmp_path: Path) -> None:
    (tmp_path / "vmlinuz").write_bytes(b"\0" * 0x600)
    with pytest.raises(PrerequisiteError, match="not a bzImage"):
        kernel_release(tmp_path / "vmlinuz")


def receive(peer: socket.socket) -> tuple[int, list[int]]:
    data, fds, _, _ = socket.recv_fds(peer, 8, 1)
    assert len(data) == 8
    return struct.unpack("<q", data)[0], fds


def test_the_doorbell_server_speaks_the_ivshmem_protocol_and_rings_the_peers_vector(tmp_path: Path) -> None:
    with DoorbellServer(tmp_path / "doorbell.sock", vectors=2) as server:
        assert server.qemu_args()[1].startswith(f"socket,path={server.socket_path},")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
            peer.settimeout(10)
            peer.connect(str(server.socket_path))
            assert receive(peer) == (0, [])  # protocol version
            assert receive(peer) == (PEER_ID, [])  # our id
            value, (shm,) = receive(peer)
            assert value == -1 and os.fstat(shm).st_size == 4096
            vectors = [receive(peer) for _ in range(2)]
            assert [value for value, _ in vectors] == [PEER_ID, PEER_ID]
            assert server.connected.wait(10)
            server.ring(1)
            assert os.eventfd_read(vectors[1][1][0]) == 1  # QEMU would raise vector 1
            for fd in (shm, *(fds[0] for _, fds in vectors)):
                os.close(fd)
    assert list(tmp_path.iterdir()) == []  # the socket is gone


# ---- in a guest -----------------------------------------------------------------------

POLL_NS = 20_000
SKIDPROBE = "/opt/cxlssd/bin/skidprobe"  # built with the guest runtime
SMALL_SSD = ("ssd_dram.size_bytes=2MiB", "write_log.size_bytes=256KiB")


@pytest.fixture(scope="module")
def helper_tree() -> Path:
    from cxlssd.guest.image import ensure_image
    from cxlssd.host_os.kmod.build import ensure_module

    return ensure_module(ensure_image().kernel)


@pytest.fixture
def guest_with_helper(default_platform: object, helper_tree: Path) -> Iterator[object]:
    """The session's guest (the platform loaded its helper); a test may reload it with
    other parameters or unload it: it is loaded as the platform does again afterwards."""
    from cxlssd.host_os.kmod.load import is_loaded, load_helper, unload_helper

    yield default_platform
    guest = default_platform.guest()  # type: ignore[attr-defined]
    if is_loaded(guest):
        unload_helper(guest)
    load_helper(guest, helper_tree)


@pytest.mark.guest
def test_the_helper_loads_reacts_to_long_delays_within_its_period_and_unloads_cleanly(
    guest_with_helper: object, helper_tree: Path,
) -> None:
    from cxlssd.host_os.kmod.load import helper_stats, is_loaded, load_helper, unload_helper

    platform = guest_with_helper
    guest = platform.guest()  # type: ignore[attr-defined]
    guest.run(["dmesg", "-C"], check=True)
    load_helper(guest, helper_tree, poll_ns=POLL_NS)
    try:
        assert helper_stats(guest)["pv"] == 1
        with platform.attach("skybyte-c", SMALL_SSD) as session:  # type: ignore[attr-defined]
            _, out, _ = session.run([SKIDPROBE, "skid", str(16 << 20), "40",
                                     str(2 * POLL_NS), "7"], check=True)
        probe = json.loads(out)
        # (reactions to the probe's other long reads, e.g. of its own bookkeeping on the CXL
        # node, match no sample: "unmatched")
        assert probe["long"] >= 20
        # Every long answer seen once by the timer, within its period (+ the interrupt's entry).
        assert len(probe["timer_skid"]) == probe["long"]
        assert max(probe["timer_skid"]) < POLL_NS + 5_000
    finally:
        unload_helper(guest)
    assert not is_loaded(guest)
    _, dmesg, _ = guest.run(["dmesg"], check=True)
    lines = dmesg.decode(errors="replace").splitlines()
    assert any("cxlssd_helper: loaded" in line for line in lines)
    assert any("cxlssd_helper: unloaded" in line for line in lines)
    # Clean: only the expected notice of an unsigned out-of-tree module.
    noise = [line for line in lines if "cxlssd_helper" not in line or
             any(word in line.lower() for word in ("warn", "bug", "oops", "call trace", "error"))]
    assert [line for line in noise if "taints kernel" not in line and "verification failed" not in line] == []


@pytest.mark.guest
def test_a_helper_built_for_another_kernel_is_refused_with_the_fix(
    guest_with_helper: object, helper_tree: Path, tmp_path: Path,
) -> None:
    from cxlssd.errors import GuestError
    from cxlssd.host_os.kmod.load import load_helper

    other = tmp_path / "tree"
    other.mkdir()
    (other / "release").write_text("6.1.0-99-amd64\n")
    refused = r"built for kernel 6\.1\.0-99-amd64 but the guest runs .*ensure_module"
    with pytest.raises(GuestError, match=refused):
        load_helper(guest_with_helper.guest(), other)  # type: ignore[attr-defined]


@pytest.mark.guest
def test_a_refused_load_and_a_busy_unload_name_the_problem_and_leave_nothing_loaded(
    guest_with_helper: object, helper_tree: Path,
) -> None:
    import time

    from cxlssd.errors import GuestError
    from cxlssd.host_os.kmod.load import DEVICE, is_loaded, load_helper, unload_helper

    guest = guest_with_helper.guest()  # type: ignore[attr-defined]
    with pytest.raises(GuestError, match=r"(?s)did not load .*poll_ns=500 is below 1000: refused"):
        load_helper(guest, helper_tree, poll_ns=500)
    assert not is_loaded(guest)
    load_helper(guest, helper_tree)
    # A reader keeps the module: rmmod fails and says why; once it is gone, it unloads.
    guest.run(["sh", "-c", f"(exec 3<{DEVICE}; sleep 4) >/dev/null 2>&1 &"], check=True)
    time.sleep(1)
    busy = r"did not unload .*still hold /dev/cxlssd_helper or /dev/cxlssd_promote open"
    with pytest.raises(GuestError, match=busy):
        unload_helper(guest)
    time.sleep(5)
    unload_helper(guest)
    assert not is_loaded(guest)


# The interrupt entry (~260 guest instructions, docs/host-os.md) plus at most one
# translation block (TCG's limit: 512 instructions), with a margin.
DOORBELL_SKID_BOUND = 270 + 512


@pytest.mark.guest
def test_a_doorbell_rung_by_the_plugin_reaches_the_kernel_within_one_translation_block(
    guest_with_helper: object,
) -> None:
    """Under a design that switches, every long-delay answer to a plain load rings the
    guest's ivshmem-doorbell and the helper's MSI-X handler runs at most the interrupt entry
    plus one translation block after the access (200 instructions follow it in its block)."""
    with guest_with_helper.attach("skybyte-c", SMALL_SSD) as session:  # type: ignore[attr-defined]
        _, out, _ = session.run([SKIDPROBE, "skid", str(16 << 20), "40",
                                 "2000000", "3", "straight"], check=True)
    probe = json.loads(out)
    assert probe["long"] >= 20 and probe["late"] == 0  # (unmatched: the probe's other long reads)
    # each long read's first reaction (a read's ticket can be seen again by a later ring)
    skids = sorted(first for _, _, first in probe["per_sample"])
    print(f"doorbell skid (guest instructions) of {len(skids)} long reads: {skids}")
    assert len(skids) == probe["long"] and skids[0] > 0  # every long read rang
    # At the interrupt entry, or a block (or, rarely, more) later when QEMU's main loop raised
    # the interrupt only after the plugin's 20 us grace (a loaded host). Measured with the
    # grace: 27 of 30 at the entry, 2 one block late, 1 beyond (without it, in a suite run,
    # 8 of 32 at the entry, 21 one block late, 3 beyond).
    assert skids[0] <= 300
    assert sum(skid <= DOORBELL_SKID_BOUND for skid in skids) >= 0.8 * len(skids)


# A hot set larger than the LLC, inside the SSD DRAM, in a footprint twice that DRAM,
# promoted after two hits (as in tests/platform/test_os_codesign.py, smaller).
PROMOTING = ("ssd_dram.size_bytes=8MiB", "write_log.size_bytes=1MiB", "migration.policy=fixed",
             "migration.initial_threshold=2")
HOT_READS = ["randread", "--footprint", "16M", "--reads", "10000", "--hot", "4M", "--hot-share", "0.98",
             "--warm-reads", "50000"]
HOT_PAGES = 1024


@pytest.mark.guest
def test_promotion_is_rung_by_the_plugin_and_polled_without_the_helper(
    guest_with_helper: object, helper_tree: Path,
) -> None:
    """Under a design that promotes, the plugin rings the doorbell's vector 1 when the mailbox
    got decisions and the helper wakes the daemon and tells it where the program maps each
    page (no scan of its page map); without the helper the daemon polls and scans. The hot
    pages reach host DRAM either way."""
    import re

    from cxlssd.host_os.kmod.load import helper_stats, load_helper, unload_helper

    platform = guest_with_helper
    guest = platform.guest()  # type: ignore[attr-defined]

    def promote() -> tuple[dict[str, object], str]:
        with platform.attach("skybyte-p", PROMOTING) as session:  # type: ignore[attr-defined]
            _, out, err = session.run(HOT_READS, check=True)
        report = json.loads(out)
        assert report["check_ok"] and report["mismatches"] == 0
        return report, err.decode(errors="replace")

    rings_before = helper_stats(guest)["promote_rings"]
    report, err = promote()
    summary = re.compile(r"(\d+) promoted, .* (\d+) scans, woken (\d+) times by the kernel helper.*, "
                         r"(\d+) pages located by it, (\d+) looks\n")
    woken = summary.search(err)
    print(f"rung: {err.strip()}; {report['hot_pages_in_dram']} hot pages in DRAM")
    assert woken is not None, err
    promoted, scans, wakeups, located, looks = (int(group) for group in woken.groups())
    assert promoted > 0 and wakeups > 0 and scans == 0 and located >= promoted, err
    assert looks > wakeups, err  # each wake-up's look, and one more after each batch (real-time: no note)
    stats = helper_stats(guest)
    assert stats["promote_irq"] == 1 and stats["promote_rings"] - rings_before >= wakeups
    assert report["hot_pages_in_dram"] >= 0.9 * HOT_PAGES

    unload_helper(guest)
    try:
        report, err = promote()
    finally:
        load_helper(guest, helper_tree)
    print(f"polled: {err.strip()}; {report['hot_pages_in_dram']} hot pages in DRAM")
    assert "woken 0 times by the kernel helper (polled the mailbox: no /dev/cxlssd_promote)" in err
    polled = summary.search(err)
    assert polled is not None and int(polled[2]) > 0 and int(polled[4]) == 0, err
    assert report["hot_pages_in_dram"] >= 0.9 * HOT_PAGES

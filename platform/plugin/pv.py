"""The paravirtual clock page: how the guest reads its modelled clock.

The platform creates a small file in the instance's runtime dir; QEMU maps it
into the guest as the BAR of an ``ivshmem-plain`` device, the plugin
(``pv=PATH``) writes its header, and the firmware writes the answers. A guest
clock read (``cxlssd_clock_ns()``, marker command 3) makes the plugin queue a
marker and wait until the firmware has served every request before it and
written the vCPU's modelled clock here; the guest then reads it from the BAR.

Layout (little-endian): a 64-byte header (u64 magic ``"CXLSSDPV"``, u32
version 1, u32 slots, u32 slot offset 64, u32 slot bytes 64), then one 64-byte
slot per vCPU: u64 ``clock_ns``, u64 ``seq`` (the number of the clock read it
answers; written after the clock). A clock of 0 means no firmware was attached.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from cxlssd.lifecycle import Lifecycle
from cxlssd.platform.plugin.shared_file import map_when_ready

MAGIC = int.from_bytes(b"CXLSSDPV", "little")
PAGE_BYTES = 4096  # one page: the ivshmem BAR (a power of 2)
HEADER_BYTES = SLOT_BYTES = 64


def create_page(path: Path) -> None:
    """Create the (zeroed) page before QEMU and the plugin map it; private to the owner."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, PAGE_BYTES)
    finally:
        os.close(fd)


class ClockPage(Lifecycle):
    """The firmware's side: publish the answer to a vCPU's clock read."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._map: mmap.mmap | None = None
        self._u64: np.ndarray | None = None

    def open(self, timeout_s: float = 10.0) -> None:
        self._map = map_when_ready(self.path, PAGE_BYTES, MAGIC, timeout_s, "cxlssd clock page", "pv")
        self._u64 = np.frombuffer(self._map, np.uint64)

    def close(self) -> None:
        self._u64 = None
        if self._map is not None:
            self._map.close()
            self._map = None

    def _begin(self) -> None:
        self.open()

    def _end(self, error: BaseException | None) -> None:
        self.close()

    @property
    def slots(self) -> int:
        assert self._map is not None
        return int(np.frombuffer(self._map, np.uint32, 1, 12)[0])

    def publish(self, vcpu: int, seq: int, clock_ns: int) -> None:
        """Answer clock read ``seq`` of ``vcpu``: the clock first, then the sequence
        number the plugin waits for (x86 keeps the two stores in order)."""
        if self._u64 is None:
            raise RuntimeError(f"clock page {self.path} is not open")
        word = (HEADER_BYTES + vcpu * SLOT_BYTES) // 8
        self._u64[word] = clock_ns
        self._u64[word + 1] = seq

"""The paravirtual page: how the guest talks with its firmware.

The platform creates a small file in the instance's runtime dir; QEMU maps it
into the guest as the BAR of an ``ivshmem-plain`` device, the plugin
(``pv=PATH``) writes its header, and the firmware writes the answers. The
guest runtime (``guest/runtime/libcxlssd.c``) maps the BAR.

* A clock read (``cxlssd_clock_ns()``, marker command 3) makes the plugin queue a
  marker and wait until the firmware has served every request before it and
  written the vCPU's modelled clock; the guest then reads it.
* A long-delay query (marker command 4, then one load) makes the plugin wait for
  the firmware's answer to that load: long delay or not, the ready time, a ticket.
* The firmware posts promotion and demotion decisions into a mailbox that the
  guest's promotion daemon (``host_os/``) drains.

Layout v2 (little-endian): a 64-byte header (u64 magic ``"CXLSSDPV"``, u32
version 2, u32 slots, u32 slot offset 64, u32 slot bytes 64; u32 features and
u32 scheduler, written by the attached firmware; u32 mailbox offset 2048, u32
mailbox entries), then one 64-byte slot per vCPU: u64 ``clock_ns``, u64 ``seq``
(the clock read it answers; written after the clock), u64 ``query_ready_ns``,
u64 ``query_long``, u64 ``query_ticket`` (written last), u64 ``arg0``, u64
``arg1`` (the guest's arguments of a marker). The mailbox: u64 head (firmware),
u64 tail (guest), at +64 the entries: u64 each, device page | 1 << 63 for a
demotion. A clock of 0 means no firmware was attached.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from cxlssd.firmware.profile import TASK_SCHEDULERS
from cxlssd.lifecycle import Lifecycle
from cxlssd.platform.plugin.shared_file import map_when_ready

MAGIC = int.from_bytes(b"CXLSSDPV", "little")
PAGE_BYTES = 4096  # one page: the ivshmem BAR (a power of 2)
HEADER_BYTES = SLOT_BYTES = 64
#: header features: what the guest runtime and the promotion daemon should do
FEATURE_CONTEXT_SWITCH = 1
FEATURE_PROMOTION = 2
DEMOTE = 1 << 63
_FEATURES_WORD = 3  # u64 word 3 = u32 features | u32 scheduler << 32
_QUERY_READY, _QUERY_LONG, _QUERY_TICKET = 2, 3, 4


def create_page(path: Path) -> None:
    """Create the (zeroed) page before QEMU and the plugin map it; private to the owner."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, PAGE_BYTES)
    finally:
        os.close(fd)


class PvPage(Lifecycle):
    """The firmware's side: answers to clock reads and queries, the mailbox."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._map: mmap.mmap | None = None
        self._u64: np.ndarray | None = None

    def open(self, timeout_s: float = 10.0) -> None:
        self._map = map_when_ready(self.path, PAGE_BYTES, MAGIC, timeout_s, "cxlssd pv page", "pv")
        self._u64 = np.frombuffer(self._map, np.uint64)

    def close(self) -> None:
        if self._u64 is not None:
            self._u64[_FEATURES_WORD] = 0  # the guest sees no firmware until the next one
        self._u64 = None
        if self._map is not None:
            self._map.close()
            self._map = None

    def _begin(self) -> None:
        self.open()

    def _end(self, error: BaseException | None) -> None:
        self.close()

    def _words(self) -> np.ndarray:
        if self._u64 is None:
            raise RuntimeError(f"pv page {self.path} is not open")
        return self._u64

    def _u32(self, offset: int) -> int:
        return int(self._words()[offset // 8]) >> (32 * (offset % 8 // 4)) & 0xFFFFFFFF

    @property
    def slots(self) -> int:
        return self._u32(12)

    def set_features(self, features: int, scheduler: str = TASK_SCHEDULERS[0]) -> None:
        """Tell the guest what this run's design asks of it (0: nothing)."""
        self._words()[_FEATURES_WORD] = features | TASK_SCHEDULERS.index(scheduler) << 32

    def _slot_word(self, vcpu: int, word: int) -> int:
        return (HEADER_BYTES + vcpu * SLOT_BYTES) // 8 + word

    def publish(self, vcpu: int, seq: int, clock_ns: int) -> None:
        """Answer clock read ``seq`` of ``vcpu``: the clock first, then the sequence
        number the plugin waits for (x86 keeps the two stores in order)."""
        words, first = self._words(), self._slot_word(vcpu, 0)
        words[first] = clock_ns
        words[first + 1] = seq

    def answer_query(self, vcpu: int, ticket: int, long_delay: bool, ready_ns: int) -> None:
        """Answer ``vcpu``'s query ``ticket``; the ticket last, the plugin waits for it."""
        words, first = self._words(), self._slot_word(vcpu, 0)
        words[first + _QUERY_READY] = ready_ns
        words[first + _QUERY_LONG] = int(long_delay)
        words[first + _QUERY_TICKET] = ticket

    def post(self, page: int, demote: bool) -> bool:
        """Post a decision to the mailbox; False (nothing posted) when it is full."""
        words = self._words()
        offset, entries = self._u32(32), self._u32(36)
        head_word = offset // 8
        head, tail = int(words[head_word]), int(words[head_word + 1])
        if head - tail >= entries:
            return False
        words[(offset + 64) // 8 + head % entries] = page | (DEMOTE if demote else 0)
        words[head_word] = head + 1  # after the entry: the daemon reads up to head
        return True

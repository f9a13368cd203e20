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

Layout v4 (:mod:`.protocol`, ``cxlssd_abi.h``): a 64-byte header (magic
``"CXLSSDPV"``, the slots, the attached firmware's features and scheduler, the
mailbox's offset and entries), one 64-byte slot per vCPU (the answer to its
last clock read and long-delay query, the guest's arguments of a marker), the
mailbox at offset 2048 (u64 head written by the firmware, u64 tail and taken by
the guest, then u64 entries: device page | 1 << 63 for a demotion). A clock of 0
means no firmware was attached.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

from cxlssd.abi.protocol import (
    PV_BYTES,
    PV_DEMOTE,
    PV_HEADER_DTYPE,
    PV_MAGIC,
    PV_MAILBOX_DTYPE,
    PV_SLOT_DTYPE,
    TASK_SCHEDULERS,
    offset,
    word,
)
from cxlssd.abi.shared_file import MappedFile

# u64 word of the header's u32 features (low half) and scheduler (high half)
_FEATURES_WORD = offset(PV_HEADER_DTYPE, "features") // 8
_CLOCK, _SEQ, _QUERY_READY, _QUERY_LONG, _QUERY_TICKET = (
    word(PV_SLOT_DTYPE, name) for name in ("clock_ns", "seq", "query_ready_ns", "query_long", "query_ticket")
)
_HEAD, _TAIL, _TAKEN = (word(PV_MAILBOX_DTYPE, name) for name in ("head", "tail", "taken"))


def create_page(path: Path) -> None:
    """Create the (zeroed) page before QEMU and the plugin map it; private to the owner."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, PV_BYTES)
    finally:
        os.close(fd)


class PvPage(MappedFile):
    """The firmware's side: answers to clock reads and queries, the mailbox."""

    what = "cxlssd pv page"
    plugin_arg = "pv"
    header_bytes = PV_BYTES
    magic = PV_MAGIC

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._u64: np.ndarray | None = None

    def _attach(self, mapped: mmap.mmap) -> None:
        self._u64 = np.frombuffer(mapped, np.uint64)

    def _detach(self) -> None:
        if self._u64 is not None:
            self._u64[_FEATURES_WORD] = 0  # the guest sees no firmware until the next one
        self._u64 = None

    def _words(self) -> np.ndarray:
        return self._open_view(self._u64)

    def _header(self, field: str) -> int:
        """A u32 field of the header."""
        at = offset(PV_HEADER_DTYPE, field)
        return int(self._words()[at // 8]) >> (32 * (at % 8 // 4)) & 0xFFFFFFFF

    @property
    def slots(self) -> int:
        return self._header("slots")

    def set_features(self, features: int, scheduler: str = TASK_SCHEDULERS[0]) -> None:
        """Tell the guest what this run's design asks of it (0: nothing)."""
        self._words()[_FEATURES_WORD] = features | TASK_SCHEDULERS.index(scheduler) << 32

    def _slot_word(self, vcpu: int) -> int:
        """The first u64 word of ``vcpu``'s slot (the slots follow the header)."""
        return (PV_HEADER_DTYPE.itemsize + vcpu * PV_SLOT_DTYPE.itemsize) // 8

    def publish(self, vcpu: int, seq: int, clock_ns: int) -> None:
        """Answer clock read ``seq`` of ``vcpu``: the clock first, then the sequence
        number the plugin waits for (x86 keeps the two stores in order)."""
        words, first = self._words(), self._slot_word(vcpu)
        words[first + _CLOCK] = clock_ns
        words[first + _SEQ] = seq

    def answer_query(self, vcpu: int, ticket: int, long_delay: bool, ready_ns: int) -> None:
        """Answer ``vcpu``'s query ``ticket``; the ticket last, the plugin waits for it."""
        words, first = self._words(), self._slot_word(vcpu)
        words[first + _QUERY_READY] = ready_ns
        words[first + _QUERY_LONG] = int(long_delay)
        words[first + _QUERY_TICKET] = ticket

    def consumed(self) -> int:
        """The decisions the guest has taken out of the mailbox (its entries are free)."""
        words, box = self._words(), self._header("mailbox_offset") // 8
        return max(int(words[box + _TAIL]), int(words[box + _TAKEN]))

    def discard_pending(self) -> int:
        """Mark every decision still in the mailbox as taken; how many there were. For a
        firmware that attaches: what is left was decided by an earlier run's firmware about
        an earlier program's pages (the daemon that would have taken it has exited), and a
        new daemon must not carry it out on the new program's pages, which the placement
        reset puts at the same device pages."""
        words, box = self._words(), self._header("mailbox_offset") // 8
        head = int(words[box + _HEAD])
        left = head - max(int(words[box + _TAIL]), int(words[box + _TAKEN]))
        words[box + _TAKEN] = head
        words[box + _TAIL] = head
        return max(left, 0)

    def post(self, page: int, demote: bool, consumed: int) -> bool:
        """Post a decision to the mailbox; False (nothing posted) when it is full.
        ``consumed``: the guest's :meth:`consumed` as the caller last knew it (a value of
        the request stream's order, see ``Mailbox``); never more than the page shows."""
        words = self._words()
        box, entries = self._header("mailbox_offset") // 8, self._header("mailbox_entries")
        head = int(words[box + _HEAD])
        if head - min(consumed, self.consumed()) >= entries:
            return False
        words[box + PV_MAILBOX_DTYPE.itemsize // 8 + head % entries] = page | (PV_DEMOTE if demote else 0)
        words[box + _HEAD] = head + 1  # after the entry: the daemon reads up to head
        return True

"""The consumer side of the plugin's device-request ring (``ring=PATH``).

The plugin turns LLC misses and dirty write-backs in a CXL window into device
requests and writes them into a single-producer/single-consumer ring in a
shared-memory file (layout: :mod:`.protocol`, ``cxlssd_abi.h``, docs/plugin.md).
The records are :data:`~.protocol.REQUEST_DTYPE`, so a chunk of the
ring is a numpy view that :meth:`Controller.process` takes as it is::

    with RequestRing(rundir / "plugin.ring") as ring:   # attaches as the consumer
        while ...:
            chunk = ring.peek()          # a view of records [tail, head), no copy
            controller.process(chunk)
            ring.release(chunk.shape[0]) # only now may the plugin reuse them

Only one consumer may be attached at a time; requests the guest makes while
none is attached are counted as dropped by the plugin, not queued.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cxlssd.abi.protocol import (
    REQUEST_DTYPE,
    RING_ATTACHED,
    RING_CONSUMER_GONE,
    RING_CONSUMER_STALLED,
    RING_DETACHED,
    RING_DETACHED_NEVER,
    RING_EXITED,
    RING_HEADER_BYTES,
    RING_HEADER_DTYPE,
    RING_MAGIC,
    RING_RUNNING,
    RING_VERSION,
    word,
)
from cxlssd.abi.shared_file import MappedFile
from cxlssd.errors import InputError
from cxlssd.lifecycle import pid_alive

STATE_NAMES = {
    RING_RUNNING: "running",
    RING_EXITED: "exited",
    RING_CONSUMER_GONE: "consumer gone",
    RING_CONSUMER_STALLED: "consumer stalled",
}

# u64 and u32 word indices in the header
_W_QEMU_PID, _W_INSN_PS, _W_TIMEOUT = (
    word(RING_HEADER_DTYPE, name) for name in ("qemu_pid", "insn_ps", "timeout_ns")
)
_W_HEAD, _W_DROPPED, _W_FULL_WAITS, _W_WAIT_NS = (
    word(RING_HEADER_DTYPE, name) for name in ("head", "dropped", "full_waits", "wait_ns")
)
_W_TAIL, _W_CONSUMER_PID = word(RING_HEADER_DTYPE, "tail"), word(RING_HEADER_DTYPE, "consumer_pid")
_U_VERSION, _U_HEADER, _U_RECORD, _U_CAPACITY, _U_PRODUCER, _U_CONSUMER = (
    word(RING_HEADER_DTYPE, name)
    for name in ("version", "header_bytes", "record_bytes", "capacity", "producer_state", "consumer_state")
)


def _holder_alive(pid: int) -> bool:
    """Whether the attached consumer still exists (attached without a pid: assume so);
    one that died attached does not keep the next consumer out."""
    return pid <= 0 or pid_alive(pid)


class RingError(RuntimeError):
    """The plugin gave up on the consumer (it was gone or stalled past the timeout)."""


@dataclass(frozen=True)
class RingStatus:
    """The ring's producer-side counters at one moment."""

    head: int  # records ever published
    tail: int  # records ever consumed
    dropped: int  # requests not queued (no consumer attached, or given up)
    full_waits: int  # times the guest waited on a full ring
    wait_ns: int  # host ns the guest spent waiting on a full ring
    producer_state: int
    consumer_pid: int = 0  # the attached consumer's process, 0 if none
    consumer_state: int = RING_DETACHED_NEVER

    @property
    def state(self) -> str:
        return STATE_NAMES.get(self.producer_state, f"unknown ({self.producer_state})")


class RequestRing(MappedFile):
    """The ring file, mapped read-write, attached as its (only) consumer; with
    ``consume=False`` an observer that only reads :meth:`status` (e.g. the
    platform watching for a dead firmware) and never attaches."""

    what = "cxlssd request ring"
    plugin_arg = "ring"
    header_bytes = RING_HEADER_BYTES
    magic = RING_MAGIC

    def __init__(self, path: Path, consume: bool = True) -> None:
        super().__init__(path)
        self.consume = consume
        self._u32: np.ndarray | None = None
        self._u64: np.ndarray | None = None
        self._records: np.ndarray | None = None
        self.capacity = 0
        self.insn_ps = 0
        self.timeout_ns = 0
        self._tail = 0

    def _attach(self, mapped: mmap.mmap) -> None:
        u32 = np.frombuffer(mapped, np.uint32, RING_HEADER_BYTES // 4)
        u64 = np.frombuffer(mapped, np.uint64, RING_HEADER_BYTES // 8)
        capacity = int(u32[_U_CAPACITY])
        problem = None
        if int(u32[_U_VERSION]) != RING_VERSION:
            problem = f"ring version {int(u32[_U_VERSION])}, this reader knows {RING_VERSION}"
        elif int(u32[_U_HEADER]) != RING_HEADER_BYTES or int(u32[_U_RECORD]) != REQUEST_DTYPE.itemsize:
            problem = "header or record size does not match"
        elif (
            capacity < 2
            or capacity & (capacity - 1)
            or RING_HEADER_BYTES + capacity * REQUEST_DTYPE.itemsize > len(mapped)
        ):
            problem = "capacity does not match the file"
        elif (
            self.consume
            and int(u32[_U_CONSUMER]) == RING_ATTACHED
            and _holder_alive(int(u64[_W_CONSUMER_PID]))
        ):
            problem = f"another consumer (pid {int(u64[_W_CONSUMER_PID])}) is attached"
        if problem is not None:
            del u32, u64
            raise InputError(f"{self.path}: not a usable request ring: {problem}")
        self._u32, self._u64 = u32, u64
        self._records = np.frombuffer(mapped, REQUEST_DTYPE, capacity, RING_HEADER_BYTES)
        self.capacity = capacity
        self.insn_ps = int(u64[_W_INSN_PS])
        self.timeout_ns = int(u64[_W_TIMEOUT])
        self._tail = int(u64[_W_TAIL])
        if self.consume:
            # Records left by a consumer that died belong to its run, not to ours:
            # the plugin queues only while a consumer is attached, so skip them.
            self._tail = int(u64[_W_HEAD])
            u64[_W_TAIL] = self._tail
            u64[_W_CONSUMER_PID] = os.getpid()
            # The pid before the state: the plugin checks the pid of an attached consumer.
            u32[_U_CONSUMER] = RING_ATTACHED

    def _detach(self) -> None:
        """Detach as the consumer: the plugin then drops requests instead of waiting."""
        if self._u32 is not None and self.consume:
            self._u32[_U_CONSUMER] = RING_DETACHED
        self._u32 = self._u64 = self._records = None

    def _header(self) -> tuple[np.ndarray, np.ndarray]:
        return self._open_view(self._u32), self._open_view(self._u64)

    @property
    def qemu_pid(self) -> int:
        return int(self._header()[1][_W_QEMU_PID])

    def status(self) -> RingStatus:
        u32, u64 = self._header()
        return RingStatus(
            head=int(u64[_W_HEAD]),
            tail=int(u64[_W_TAIL]),
            dropped=int(u64[_W_DROPPED]),
            full_waits=int(u64[_W_FULL_WAITS]),
            wait_ns=int(u64[_W_WAIT_NS]),
            producer_state=int(u32[_U_PRODUCER]),
            consumer_pid=int(u64[_W_CONSUMER_PID]),
            consumer_state=int(u32[_U_CONSUMER]),
        )

    def check(self) -> None:
        """A :class:`RingError` naming the cause if the plugin gave up on the consumer."""
        state = int(self._header()[0][_U_PRODUCER])
        if state in (RING_CONSUMER_GONE, RING_CONSUMER_STALLED):
            status = self.status()
            raise RingError(
                f"the plugin stopped queueing device requests ({status.state}; "
                f"{status.dropped} dropped): the firmware did not keep up with the ring "
                f"{self.path} (timeout {self.timeout_ns / 1e9:.1f} s) or died"
            )

    @property
    def producer_exited(self) -> bool:
        return int(self._header()[0][_U_PRODUCER]) == RING_EXITED

    def pending(self) -> int:
        """Records published and not yet released."""
        _, u64 = self._header()
        return int(u64[_W_HEAD]) - self._tail

    def _consumer(self) -> None:
        if not self.consume:
            raise InputError(f"request ring {self.path} is open as an observer, not as the consumer")

    def peek(self, max_records: int | None = None) -> np.ndarray:
        """A view of the oldest unreleased records (up to the end of the ring's
        storage, so a wrapped backlog comes in two calls). Valid until
        :meth:`release`; empty if nothing is pending."""
        self._consumer()
        _, u64 = self._header()
        assert self._records is not None
        head = int(u64[_W_HEAD])  # numpy reads the aligned word once: an acquire on x86
        available = head - self._tail
        if available <= 0:
            return self._records[:0]
        start = self._tail & (self.capacity - 1)
        count = min(available, self.capacity - start)
        if max_records is not None:
            count = min(count, max_records)
        return self._records[start : start + count]

    def release(self, count: int) -> None:
        """Give ``count`` records (from :meth:`peek`) back to the producer."""
        self._consumer()
        _, u64 = self._header()
        if count < 0 or self._tail + count > int(u64[_W_HEAD]):
            raise ValueError(f"cannot release {count} records: only {self.pending()} pending")
        self._tail += count
        # x86: the reads of the records happened before this store (TSO).
        u64[_W_TAIL] = self._tail

"""Read the TCG plugin's live counters, and publish CXL windows to it.

The plugin (``shm=PATH``) keeps its counters in a small file of fixed layout
(:mod:`.protocol`, ``cxlssd_abi.h``, docs/plugin.md): a 128-byte header, a table of 8
64-byte window slots, one 128-byte slot per vCPU (instructions, accesses, the
LLC model's hits/misses/write-backs split DRAM vs CXL, device requests, the
local modelled clock), then the ROI event table. This module maps that file,
reads it with numpy while the guest runs, and writes the platform's requests
into it (windows, the plugin's mode, the clock parameters)::

    with PluginCounters(rundir / "plugin.counters") as counters:
        counters.publish_window(device.hpa_base, device.size_bytes, device.dpa_base)
        before = counters.snapshot()
        ...  # run something in the guest
        delta = counters.snapshot() - before

Every counter is a monotonic 64-bit value written with single aligned stores,
so no value is ever torn; a snapshot is not atomic across counters (the guest
keeps running while it is taken).
"""

from __future__ import annotations

import mmap
import time
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from cxlssd.abi.protocol import (
    COUNTERS_HEADER_BYTES,
    COUNTERS_HEADER_DTYPE,
    COUNTERS_MAGIC,
    COUNTERS_VERSION,
    MODE_ACTIVE,
    MODE_DORMANT,
    ROI_EVENT_DTYPE,
    STATE_EXITED,
    VCPU_COUNTERS,
    VCPU_FIELDS,
    VCPU_SLOT_DTYPE,
    WINDOW_ACCEPTED,
    WINDOW_REJECTED,
    WINDOW_SLOT_DTYPE,
    word,
)
from cxlssd.abi.shared_file import MappedFile
from cxlssd.errors import InputError
from cxlssd.lifecycle import pid_alive

LINE_BYTES = 64  # windows are whole lines
_U64_PER_SLOT = WINDOW_SLOT_DTYPE.itemsize // 8
_U64_PER_VCPU = VCPU_SLOT_DTYPE.itemsize // 8
# u64 words of a window slot
_BASE, _SIZE, _LOADS, _STORES, _LINES, _FLAGS, _DPA = (
    word(WINDOW_SLOT_DTYPE, name)
    for name in ("base", "size", "loads", "stores", "lines_touched", "flags", "dpa_base")
)


def _field(name: str) -> int:
    """The word index of header field ``name`` (in the u32 or u64 view, by its type)."""
    return word(COUNTERS_HEADER_DTYPE, name)


@dataclass(frozen=True)
class VcpuCounters:
    """One vCPU's counters: instructions, its loads/stores by target, what the
    LLC model made of them (hits, misses, dirty write-backs; DRAM vs CXL
    window) and the device requests it turned into (dropped: not queued
    because no consumer was attached or it was given up on)."""

    insns: int
    mem_accesses: int
    io_accesses: int
    cxl_loads: int
    cxl_stores: int
    llc_hits_dram: int = 0
    llc_hits_cxl: int = 0
    llc_misses_dram: int = 0
    llc_misses_cxl: int = 0
    writebacks_dram: int = 0
    writebacks_cxl: int = 0
    device_reads: int = 0
    device_writes: int = 0
    device_dropped: int = 0
    local_ps: int = 0  # the local modelled clock: instructions x insn_ps + DRAM stalls

    def __sub__(self, other: VcpuCounters) -> VcpuCounters:
        return VcpuCounters(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))


@dataclass(frozen=True)
class WindowCounters:
    """Accesses the plugin counted in one CXL window (guest-physical range)."""

    base: int
    size: int
    loads: int
    stores: int
    lines_touched: int
    accepted: bool
    rejected: bool
    dpa_base: int = 0

    def __sub__(self, other: WindowCounters) -> WindowCounters:
        return WindowCounters(
            self.base,
            self.size,
            self.loads - other.loads,
            self.stores - other.stores,
            self.lines_touched - other.lines_touched,
            self.accepted,
            self.rejected,
            self.dpa_base,
        )


@dataclass(frozen=True)
class RoiEvent:
    """A marker the guest executed while the plugin was active: which ROI, on
    which vCPU, the vCPU's local clock and its counters at that instant."""

    index: int
    cmd: int  # MarkerCmd.ROI_BEGIN or ROI_END
    roi: int
    vcpu: int
    counters: VcpuCounters


@dataclass(frozen=True)
class CounterSnapshot:
    """The counters at one moment (or the difference of two moments)."""

    vcpus: tuple[VcpuCounters, ...]
    windows: tuple[WindowCounters, ...]
    exited: bool

    @property
    def insns(self) -> int:
        return self.total("insns")

    @property
    def mem_accesses(self) -> int:
        return self.total("mem_accesses")

    @property
    def cxl_loads(self) -> int:
        return self.total("cxl_loads")

    @property
    def cxl_stores(self) -> int:
        return self.total("cxl_stores")

    def total(self, name: str) -> int:
        """A vCPU counter (one of :data:`VCPU_FIELDS`) summed over the vCPUs."""
        if name not in VCPU_FIELDS:
            raise KeyError(name)
        return sum(getattr(v, name) for v in self.vcpus)

    def __sub__(self, earlier: CounterSnapshot) -> CounterSnapshot:
        """Counts between ``earlier`` and this snapshot (windows published since count from 0)."""
        windows = list(self.windows)
        for i, old in enumerate(earlier.windows[: len(windows)]):
            windows[i] = windows[i] - old
        return CounterSnapshot(
            tuple(new - old for new, old in zip(self.vcpus, earlier.vcpus, strict=True)),
            tuple(windows),
            self.exited,
        )


class PluginCounters(MappedFile):
    """The plugin's shared counters file, mapped read-write (publishing windows
    writes to it). Use as a context manager or call :meth:`open`/:meth:`close`."""

    what = "cxlssd plugin counters file"
    plugin_arg = "shm"
    header_bytes = COUNTERS_HEADER_BYTES
    magic = COUNTERS_MAGIC

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._u32: np.ndarray | None = None
        self._u64: np.ndarray | None = None
        self.vcpu_slots = 0
        self.window_slots = 0
        self.llc_bytes = 0
        self.llc_ways = 0
        self.insn_ps = 0
        self._window_u64 = 0
        self._vcpu_u64 = 0
        self._roi_u64 = 0
        self.roi_slots = 0

    def _attach(self, mapped: mmap.mmap) -> None:
        u32 = np.frombuffer(mapped, np.uint32)
        record = np.frombuffer(mapped, COUNTERS_HEADER_DTYPE, 1)[0]
        header = {name: int(record[name]) for name in COUNTERS_HEADER_DTYPE.fields or ()}
        del record
        problem = None
        if header["version"] != COUNTERS_VERSION:
            problem = f"layout version {header['version']}, this reader knows {COUNTERS_VERSION}"
        elif header["file_bytes"] > len(mapped) or header["header_bytes"] != COUNTERS_HEADER_BYTES:
            problem = "header does not match the file size"
        elif (
            header["window_offset"] % WINDOW_SLOT_DTYPE.itemsize
            or header["vcpu_offset"] % VCPU_SLOT_DTYPE.itemsize
        ):
            problem = "misaligned tables"
        elif header["roi_offset"] % 8 or header["roi_offset"] + header[
            "roi_slots"
        ] * ROI_EVENT_DTYPE.itemsize > len(mapped):
            problem = "the ROI table does not fit the file"
        elif header["vcpu_slot_bytes"] != VCPU_SLOT_DTYPE.itemsize:
            problem = f"vCPU slots of {header['vcpu_slot_bytes']} bytes"
        if problem is not None:
            del u32
            raise InputError(f"{self.path}: not a usable plugin counters file: {problem}")
        self._u32 = u32
        self._u64 = np.frombuffer(mapped, np.uint64)
        self.vcpu_slots = header["vcpu_slots"]
        self.window_slots = header["window_slots"]
        self.llc_bytes = header["llc_bytes"]
        self.llc_ways = header["llc_ways"]
        self.insn_ps = header["insn_ps"]
        self._window_u64 = header["window_offset"] // 8
        self._vcpu_u64 = header["vcpu_offset"] // 8
        self._roi_u64 = header["roi_offset"] // 8
        self.roi_slots = header["roi_slots"]

    def _detach(self) -> None:
        self._u32 = self._u64 = None

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self._open_view(self._u32), self._open_view(self._u64)

    @property
    def qemu_pid(self) -> int:
        _, u64 = self._arrays()
        return int(u64[_field("qemu_pid")])

    def snapshot(self) -> CounterSnapshot:
        """Copy all counters now."""
        u32, u64 = self._arrays()
        n_windows = min(int(u32[_field("n_windows")]), self.window_slots)
        exited = int(u32[_field("state")]) == STATE_EXITED
        vcpu_rows = (
            u64[self._vcpu_u64 : self._vcpu_u64 + self.vcpu_slots * _U64_PER_VCPU]
            .copy()
            .reshape(self.vcpu_slots, _U64_PER_VCPU)
        )
        window_rows = (
            u64[self._window_u64 : self._window_u64 + n_windows * _U64_PER_SLOT]
            .copy()
            .reshape(n_windows, _U64_PER_SLOT)
        )
        vcpus = tuple(VcpuCounters(*(int(x) for x in row[: len(VCPU_FIELDS)])) for row in vcpu_rows)
        windows = tuple(
            WindowCounters(
                base=int(row[_BASE]),
                size=int(row[_SIZE]),
                loads=int(row[_LOADS]),
                stores=int(row[_STORES]),
                lines_touched=int(row[_LINES]),
                accepted=bool(int(row[_FLAGS]) & WINDOW_ACCEPTED),
                rejected=bool(int(row[_FLAGS]) & WINDOW_REJECTED),
                dpa_base=int(row[_DPA]),
            )
            for row in window_rows
        )
        return CounterSnapshot(vcpus, windows, exited)

    def publish_window(self, base: int, size: int, dpa_base: int = 0, wait_s: float = 10.0) -> int:
        """Tell the plugin that guest-physical ``[base, base + size)`` is a CXL
        window whose first byte is device physical address ``dpa_base``, and
        wait until it counts there; returns the window's index. Device requests
        carry ``HPA - base + dpa_base``.

        The plugin picks the window up at the guest's next memory access (a
        running guest makes them constantly, timer interrupts included)."""
        u32, u64 = self._arrays()
        if size <= 0 or base < 0 or base % LINE_BYTES or size % LINE_BYTES:
            raise ValueError(f"window {base:#x}+{size:#x}: base and size must be positive multiples of 64")
        if dpa_base < 0 or dpa_base % LINE_BYTES:
            raise ValueError(f"window {base:#x}+{size:#x}: DPA base {dpa_base:#x} must be a multiple of 64")
        existing = self.snapshot().windows
        for window in existing:
            if window.base == base and window.size == size and not window.rejected:
                return existing.index(window)
            if not window.rejected and base < window.base + window.size and window.base < base + size:
                raise ValueError(f"window {base:#x}+{size:#x} overlaps {window.base:#x}+{window.size:#x}")
        index = len(existing)
        if index >= self.window_slots:
            raise ValueError(f"the plugin has only {self.window_slots} window slots, all used")
        slot = self._window_u64 + index * _U64_PER_SLOT
        u64[slot + _BASE] = base
        u64[slot + _SIZE] = size
        u64[slot + _DPA] = dpa_base
        # x86 stores are seen in program order: base and size before the new count.
        u32[_field("n_windows")] = index + 1
        deadline = time.monotonic() + wait_s
        while True:
            flags = int(u64[slot + _FLAGS])
            if flags & WINDOW_REJECTED:
                raise ValueError(f"the plugin rejected window {base:#x}+{size:#x} (see QEMU's log)")
            if flags & WINDOW_ACCEPTED:
                return index
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"the plugin did not pick up window {base:#x}+{size:#x} within {wait_s:.0f} s "
                    "(is the guest running?)"
                )
            time.sleep(0.01)

    # -- header fields the platform reads and writes ------------------------------------

    def _u32_field(self, name: str) -> int:
        u32, _ = self._arrays()
        return int(u32[_field(name)])

    def _u64_field(self, name: str) -> int:
        _, u64 = self._arrays()
        return int(u64[_field(name)])

    @property
    def active(self) -> bool:
        """Whether the plugin is in its active mode (LLC model, device requests, clock)."""
        return self._u32_field("mode") == MODE_ACTIVE

    @property
    def activations(self) -> int:
        return self._u32_field("activations")

    @property
    def markers_ignored(self) -> int:
        """ROI markers the guest executed while the plugin was dormant."""
        return self._u32_field("markers_ignored")

    def set_clock(self, insn_ps: int, dram_ps: int, store_miss_write: bool = False,
                  llc_cold_at_roi: bool = False) -> None:
        """Set the parameters the plugin takes at its next activation: the clock's,
        whether an LLC store miss to CXL memory is a write to the device's log
        (no fetch, SkyByte's W designs) rather than a read for ownership, and whether
        an ROI begins on an empty LLC (its dirty lines dropped)."""
        if not 0 < insn_ps <= 10**9 or not 0 <= dram_ps <= 10**9:
            raise ValueError(f"insn_ps {insn_ps} must be 1..1e9 and dram_ps {dram_ps} 0..1e9 (picoseconds)")
        u32, u64 = self._arrays()
        u64[_field("insn_ps")] = insn_ps
        u64[_field("dram_ps")] = dram_ps
        u32[_field("store_miss_write")] = int(store_miss_write)
        u32[_field("llc_cold_at_roi")] = int(llc_cold_at_roi)

    def set_mode(self, active: bool, wait_s: float = 180.0) -> None:
        """Ask the plugin to switch mode and wait until it has. The switch
        happens when a vCPU next translates code or idles (a running guest
        does both constantly); the plugin then flushes QEMU's translated code."""
        u32, _ = self._arrays()
        u32[_field("requested_mode")] = MODE_ACTIVE if active else MODE_DORMANT
        deadline = time.monotonic() + wait_s
        while self.active != active:
            if self._u32_field("state") == STATE_EXITED or not pid_alive(self.qemu_pid):
                raise TimeoutError("QEMU stopped before the plugin switched mode")
            if time.monotonic() >= deadline:
                state = "active" if active else "dormant"
                raise TimeoutError(f"the plugin did not become {state} within {wait_s:.0f} s")
            time.sleep(0.01)

    @property
    def roi_event_count(self) -> int:
        """ROI events recorded so far (events past the table's slots are counted, not kept)."""
        return self._u64_field("roi_events")

    def roi_events(self, start: int = 0) -> list[RoiEvent]:
        """The recorded ROI events from index ``start`` on (those still in the table)."""
        _, u64 = self._arrays()
        end = min(self.roi_event_count, self.roi_slots)
        per_event = ROI_EVENT_DTYPE.itemsize // 8
        rows = u64[self._roi_u64 + start * per_event : self._roi_u64 + end * per_event].copy()
        events = []
        for k, event in enumerate(rows.view(ROI_EVENT_DTYPE)):
            values = zip(VCPU_FIELDS[:VCPU_COUNTERS], (int(x) for x in event["counters"]), strict=True)
            counters = VcpuCounters(**dict(values), local_ps=int(event["local_ps"]))
            code = int(event["code"])
            events.append(RoiEvent(start + k, code >> 16, code & 0xFFFF, int(event["vcpu"]), counters))
        return events

"""The protocol's numbers and layouts, the Python side of ``abi/cxlssd_abi.h``.

Every record is a numpy structured dtype whose fields, offsets and sizes are the C
struct's (``tests/test_abi.py`` compiles the header and checks each of them and
every constant), so the readers view shared memory without copying. Little-endian
throughout, with explicit reserved fields (no padding). docs/plugin.md explains the
fields; a layout change means a new version number on both sides.
"""

from __future__ import annotations

import enum
from pathlib import Path

import numpy as np

#: the C header (compiled into the plugin and the guest runtime, shipped into the guest)
C_HEADER = Path(__file__).resolve().parent / "cxlssd_abi.h"


def _magic(text: bytes) -> int:
    """An 8-character magic as the u64 that starts a file (little-endian)."""
    return int.from_bytes(text, "little")


def _fields(dtype: np.dtype) -> dict[str, tuple[np.dtype, int]]:
    """A record dtype's fields: name -> (type, byte offset)."""
    if dtype.fields is None or dtype.names is None:
        raise TypeError(f"{dtype} is not a record")
    return {name: (dtype.fields[name][0], int(dtype.fields[name][1])) for name in dtype.names}


def offset(dtype: np.dtype, field: str) -> int:
    """The byte offset of ``field`` in a record of ``dtype``."""
    return _fields(dtype)[field][1]


def word(dtype: np.dtype, field: str) -> int:
    """The index of ``field`` of ``dtype`` in an array of the field's own element type
    (u32 or u64) over the same memory: how the readers address a header's words with
    single aligned loads and stores."""
    kind, at = _fields(dtype)[field]
    size = kind.base.itemsize
    if at % size:
        raise ValueError(f"{field} at {at} is not aligned to its {size} bytes")
    return at // size


# ---- markers (guest -> plugin) ----------------------------------------------------------

MARKER_BYTES = 8
#: disp32 of a marker: MARKER_MAGIC | cmd << 16 | id
MARKER_MAGIC = 0xC5000000


class MarkerCmd(enum.IntEnum):
    """The command of a guest marker (``flags`` of a MARKER record); CXLSSD_CMD_*."""

    ROI_BEGIN = 1
    ROI_END = 2
    CLOCK = 3  # a modelled-clock read
    QUERY = 4  # the next device read asks whether it is a long delay
    SWITCH = 5  # a switch away from a task or thread (``addr``: who switched, SWITCH_*)
    RESUME = 6  # a parked task runs again (ticket in ``addr``)
    PROMOTED = 7  # the guest's daemon moved device page ``addr`` to host DRAM
    DEMOTED = 8  # ... and back
    PROMOTE_FAILED = 9  # ... or could not move it
    XFER_BEGIN = 10  # a page move the transfer engine accounts for (``addr`` = ticket << 1 | to device)
    XFER_END = 11  # ... ends (``addr`` = ticket); docs/offload.md, firmware/hints.py
    XFER_WAIT = 12  # the vCPU needs transfer ``addr``'s data
    HINT = 13  # a tensor's lifetime hint (``addr``: kind, op, pages, first device page)
    DAEMON = 14  # the kernel helper: the promotion daemon's thread left its CPU or got back (DAEMON_*)


#: who switched (the SWITCH marker's id): the guest runtime's tasks, charged switch_cost_ns
SWITCH_RUNTIME = 0
#: ... the kernel helper, parking a thread: its instructions are the switch's cost
SWITCH_KERNEL = 1
#: the DAEMON marker's id: the promotion daemon's thread is switched out (the scheduler
#: runs another task, e.g. while move_pages(2) waits for an RCU grace period) ...
DAEMON_OFF = 0
#: ... and in again (firmware/hints.py: the time between is not the daemon's)
DAEMON_ON = 1

#: XFER_BEGIN's argument: the guest OS's promotion daemon carries out the firmware's
#: decisions (SkyByte's promotion thread: the device's work, not the program's CPU's)
XFER_BY_OS = 1 << 63

#: HINT kinds (bits 56..63 of the marker's argument)
HINT_NEED = 1
HINT_DEAD = 2
#: pages one HINT marker names at most
MAX_HINT_PAGES = 0xFFFF

# ---- device requests: the ring's records (plugin -> firmware) ---------------------------


class Op(enum.IntEnum):
    """What a request record asks of the device; CXLSSD_OP_*."""

    READ = 0
    WRITE = 1
    #: the host finished promoting page ``addr >> 12`` to host DRAM
    PROMOTED = 2
    #: the host finished demoting page ``addr >> 12``; ``flags & 1`` = it was dirty
    DEMOTED = 3
    #: not a device request: an ROI marker the guest executed, in stream order
    #: (``flags`` = marker command, ``addr`` = event index << 16 | ROI id). The
    #: drivers (firmware/stream.py) take markers out; the controller never sees one.
    MARKER = 4


#: Op.DEMOTED flag bit: the demoted page was written while in host DRAM
FLAG_DIRTY = 1
#: Op.WRITE flag bit: a posted write (an LLC write-back): its latency occupies
#: the device but is never charged to the vCPU's clock
FLAG_POSTED = 2
#: Op.READ flag bit: a long-delay query of the guest runtime; the plugin waits
#: for the answer (docs/guest-runtime.md, firmware/live_switching.py)
FLAG_QUERY = 4
#: an LLC miss that a promoted page served from host DRAM (guest-driven
#: promotion): ``addr`` is in the page's original device page; counted, never
#: served by the device nor charged (the CPU paid the DRAM latency)
FLAG_HOST = 8

#: one device request (24 bytes): struct cxlssd_request
REQUEST_DTYPE = np.dtype(
    [
        ("time_ns", "<u8"),  # issue time on the vCPU's modelled clock
        ("addr", "<u8"),  # device physical address, bytes
        ("vcpu", "<u2"),
        ("size", "<u2"),  # bytes, 1..64, within one 64-byte line; 0 for a marker
        ("op", "u1"),  # Op
        ("flags", "u1"),  # FLAG_*, or the marker's command
        ("thread", "<u2"),  # the guest thread on its vCPU (0 if not known)
    ]
)

# ---- the request ring (plugin ring=PATH) -------------------------------------------------

RING_MAGIC = _magic(b"CXLSSDRQ")
RING_VERSION = 1
RING_HEADER_BYTES = 256
# producer_state
RING_RUNNING, RING_EXITED, RING_CONSUMER_GONE, RING_CONSUMER_STALLED = 1, 2, 3, 4
# consumer_state
RING_DETACHED_NEVER, RING_ATTACHED, RING_DETACHED = 0, 1, 2

#: struct cxlssd_ring_header: the producer's fields on one cache line, the consumer's on the next
RING_HEADER_DTYPE = np.dtype(
    [
        ("magic", "<u8"),
        ("version", "<u4"),
        ("header_bytes", "<u4"),
        ("record_bytes", "<u4"),
        ("capacity", "<u4"),
        ("file_bytes", "<u8"),
        ("qemu_pid", "<u8"),
        ("insn_ps", "<u8"),
        ("timeout_ns", "<u8"),
        ("producer_state", "<u4"),
        ("reserved0", "<u4"),
        ("head", "<u8"),
        ("dropped", "<u8"),
        ("full_waits", "<u8"),
        ("wait_ns", "<u8"),
        ("reserved1", "<u8", (4,)),
        ("tail", "<u8"),
        ("consumer_state", "<u4"),
        ("reserved2", "<u4"),
        ("consumer_pid", "<u8"),
        ("reserved3", "<u8", (5,)),
        ("reserved4", "<u8", (8,)),
    ]
)

# ---- the counters file (plugin shm=PATH) -------------------------------------------------

COUNTERS_MAGIC = _magic(b"CXLSSDPC")
COUNTERS_VERSION = 3
COUNTERS_HEADER_BYTES = 128
WINDOW_SLOTS = 8
WINDOW_SLOT_BYTES = 64
VCPU_SLOT_BYTES = 128
WINDOW_OFFSET = COUNTERS_HEADER_BYTES
VCPU_OFFSET = WINDOW_OFFSET + WINDOW_SLOTS * WINDOW_SLOT_BYTES
ROI_SLOTS = 4096
ROI_EVENT_BYTES = 128
#: the vCPU counters an ROI event copies (insns .. device_dropped)
VCPU_COUNTERS = 14
STATE_RUNNING, STATE_EXITED = 1, 2
WINDOW_REJECTED, WINDOW_ACCEPTED = 1, 2
MODE_DORMANT, MODE_ACTIVE = 0, 1

#: struct cxlssd_counters_header
COUNTERS_HEADER_DTYPE = np.dtype(
    [
        ("magic", "<u8"),
        ("version", "<u4"),
        ("header_bytes", "<u4"),
        ("vcpu_slots", "<u4"),
        ("window_slots", "<u4"),
        ("window_offset", "<u4"),
        ("vcpu_offset", "<u4"),
        ("n_windows", "<u4"),
        ("state", "<u4"),
        ("file_bytes", "<u8"),
        ("qemu_pid", "<u8"),
        ("vcpu_slot_bytes", "<u4"),
        ("llc_ways", "<u4"),
        ("llc_bytes", "<u8"),
        ("insn_ps", "<u8"),
        ("requested_mode", "<u4"),
        ("mode", "<u4"),
        ("dram_ps", "<u8"),
        ("roi_offset", "<u4"),
        ("roi_slots", "<u4"),
        ("roi_events", "<u8"),
        ("activations", "<u4"),
        ("markers_ignored", "<u4"),
        ("store_miss_write", "<u4"),
        ("llc_cold_at_roi", "<u4"),
    ]
)
#: struct cxlssd_window_slot
WINDOW_SLOT_DTYPE = np.dtype(
    [(name, "<u8") for name in ("base", "size", "loads", "stores", "lines_touched", "flags", "dpa_base")]
    + [("reserved", "<u8")]
)
#: struct cxlssd_vcpu_slot; the pairs are [DRAM, CXL]
VCPU_SLOT_DTYPE = np.dtype(
    [
        ("insns", "<u8"),
        ("mem_accesses", "<u8"),
        ("io_accesses", "<u8"),
        ("cxl_loads", "<u8"),
        ("cxl_stores", "<u8"),
        ("llc_hits", "<u8", (2,)),
        ("llc_misses", "<u8", (2,)),
        ("writebacks", "<u8", (2,)),
        ("device_reads", "<u8"),
        ("device_writes", "<u8"),
        ("device_dropped", "<u8"),
        ("local_ps", "<u8"),  # the local modelled clock
        ("reserved", "<u8"),
    ]
)
#: the vCPU slot's u64 words in order, by name (a pair's two words: ``_dram``, ``_cxl``)
VCPU_FIELDS = tuple(
    named
    for name, (kind, _) in _fields(VCPU_SLOT_DTYPE).items()
    if name != "reserved"
    for named in ((f"{name}_dram", f"{name}_cxl") if kind.shape else (name,))
)
#: struct cxlssd_roi_event
ROI_EVENT_DTYPE = np.dtype(
    [
        ("code", "<u4"),  # cmd << 16 | id
        ("vcpu", "<u2"),
        ("reserved", "<u2"),
        ("local_ps", "<u8"),
        ("counters", "<u8", (VCPU_COUNTERS,)),  # VCPU_FIELDS[:VCPU_COUNTERS]
    ]
)

# ---- the paravirtual page (plugin pv=PATH; the guest's ivshmem BAR) ----------------------

PV_MAGIC = _magic(b"CXLSSDPV")
PV_VERSION = 4
PV_BYTES = 4096
PV_HEADER_BYTES = 64
PV_SLOT_BYTES = 64
PV_MAILBOX_OFFSET = 2048
PV_MAILBOX_HEADER = 64
#: a mailbox entry: device page | PV_DEMOTE for a demotion
PV_DEMOTE = 1 << 63
#: header features: what the guest runtime and the promotion daemon should do
FEATURE_CONTEXT_SWITCH = 1
FEATURE_PROMOTION = 2
#: with FEATURE_CONTEXT_SWITCH: the plugin also asks about reads while no ROI is open
FEATURE_SWITCH_OUTSIDE_ROI = 4
#: the guest runtime's task schedulers, in the order of their numbers (header ``scheduler``)
TASK_SCHEDULERS = ("round-robin", "earliest-ready")

#: struct cxlssd_pv_header
PV_HEADER_DTYPE = np.dtype(
    [
        ("magic", "<u8"),
        ("version", "<u4"),
        ("slots", "<u4"),
        ("slot_offset", "<u4"),
        ("slot_bytes", "<u4"),
        ("features", "<u4"),  # written by the attached firmware
        ("scheduler", "<u4"),
        ("mailbox_offset", "<u4"),
        ("mailbox_entries", "<u4"),
        ("reserved", "<u8", (3,)),
    ]
)
#: struct cxlssd_pv_slot: a clock answer (clock first, seq last), a query answer (ticket
#: last), the guest's arguments of a marker, the thread running on the vCPU
PV_SLOT_DTYPE = np.dtype(
    [
        (name, "<u8")
        for name in (
            "clock_ns",
            "seq",
            "query_ready_ns",
            "query_long",
            "query_ticket",
            "arg0",
            "arg1",
            "thread",  # the guest thread on the vCPU (its pid; 0: not known), the kernel helper's
        )
    ]
)
#: struct cxlssd_pv_mailbox without its entries (u64 each, right after it)
PV_MAILBOX_DTYPE = np.dtype([("head", "<u8"), ("tail", "<u8"), ("taken", "<u8"), ("reserved", "<u8", (5,))])

"""Host interface: the device request and response records shared by every driver.

A *device request* is one CXL.mem access that reached the device: which vCPU issued
it, when (modelled ns), the device physical address (DPA, bytes), its size and
whether it reads or writes. Two extra operations let a driver tell the model that the
host OS has carried out a page migration (the firmware decides migrations; the guest
performs them later), so a recorded stream replays to the same answers.

Both record types are numpy structured dtypes with a fixed little-endian layout so
the live driver can view a shared-memory ring chunk as an array without copying. The
C equivalent of :data:`REQUEST_DTYPE` (24 bytes, no padding)::

    struct cxlssd_request {
        uint64_t time_ns;   /* issue time on the vCPU's modelled clock */
        uint64_t addr;      /* device physical address, bytes */
        uint16_t vcpu;
        uint16_t size;      /* bytes, 1..64, must not cross a 64 B line */
        uint8_t  op;        /* enum Op */
        uint8_t  flags;     /* FLAG_DIRTY (DEMOTED), FLAG_POSTED (WRITE) */
        uint16_t thread;    /* the guest thread on its vCPU (0 if not known) */
    };
"""

from __future__ import annotations

import enum

import numpy as np

LINE_BYTES = 64
PAGE_BYTES = 4096
LINES_PER_PAGE = PAGE_BYTES // LINE_BYTES
PAGE_SHIFT = 12
LINE_SHIFT = 6


class Op(enum.IntEnum):
    """What a request record asks of the device."""

    READ = 0
    WRITE = 1
    #: the host finished promoting page ``addr >> 12`` to host DRAM
    PROMOTED = 2
    #: the host finished demoting page ``addr >> 12``; ``flags & 1`` = it was dirty
    DEMOTED = 3
    #: not a device request: an ROI marker the guest executed, in stream order
    #: (``flags`` = marker command, ``addr`` = event index << 16 | ROI id). The
    #: drivers (:mod:`.stream`) take markers out; the controller never sees one.
    MARKER = 4


class MarkerCmd(enum.IntEnum):
    """The command of a guest marker (``flags`` of a MARKER record). The same
    numbers are CXLSSD_CMD_* in guest/runtime/cxlssd.h and CMD_* in the plugin."""

    ROI_BEGIN = 1
    ROI_END = 2
    CLOCK = 3  # a modelled-clock read
    QUERY = 4  # the next device read asks whether it is a long delay
    SWITCH = 5  # the guest's task runtime switched tasks
    RESUME = 6  # a parked task runs again (ticket in ``addr``)
    PROMOTED = 7  # the guest's daemon moved device page ``addr`` to host DRAM
    DEMOTED = 8  # ... and back
    PROMOTE_FAILED = 9  # ... or could not move it
    XFER_BEGIN = 10  # a page move the transfer engine accounts for (``addr`` = ticket << 1 | to device)
    XFER_END = 11  # ... ends (``addr`` = ticket); docs/offload.md, :mod:`.hints`
    XFER_WAIT = 12  # the vCPU needs transfer ``addr``'s data
    HINT = 13  # a tensor's lifetime hint (``addr``: kind, op, pages, first device page)


class Source(enum.IntEnum):
    """Where a request was served from (``Response.source``)."""

    NONE = 0  # a PROMOTED/DEMOTED notification: no data moved through the device
    LOG = 1  # write-log hit (read) or append (write)
    CACHE = 2  # SSD data-cache hit
    FLASH = 3  # data-cache miss: the page was read from flash
    PROMOTED = 4  # the page lives in host DRAM (promoted)
    DRAM = 5  # the dram-only ideal device


#: one device request (24 bytes)
REQUEST_DTYPE = np.dtype(
    [
        ("time_ns", "<u8"),
        ("addr", "<u8"),
        ("vcpu", "<u2"),
        ("size", "<u2"),
        ("op", "u1"),
        ("flags", "u1"),
        ("thread", "<u2"),
    ]
)

#: the model's answer to one request (42 bytes)
RESPONSE_DTYPE = np.dtype(
    [
        ("start_ns", "<i8"),  # when the device saw it (issue time + vCPU's stall so far)
        ("latency_ns", "<i8"),  # until the data is there
        ("ready_ns", "<i8"),  # start_ns + latency_ns
        ("promote_page", "<i8"),  # page (DPA >> 12) the firmware decided to promote, or -1
        ("demote_page", "<i8"),  # page the firmware decided to demote, or -1
        ("source", "u1"),  # enum Source
        ("long_delay", "?"),  # answered at once with "long delay, ready at ready_ns"
    ]
)

#: Op.DEMOTED flag bit: the demoted page was written while in host DRAM
FLAG_DIRTY = 1
#: Op.WRITE flag bit: a posted write (an LLC write-back): its latency occupies
#: the device but is never charged to the vCPU's clock
FLAG_POSTED = 2
#: Op.READ flag bit: a long-delay query of the guest runtime; the plugin waits
#: for the answer (docs/guest-runtime.md, :mod:`.live_switching`)
FLAG_QUERY = 4
#: an LLC miss that a promoted page served from host DRAM (guest-driven
#: promotion): ``addr`` is in the page's original device page; counted, never
#: served by the device nor charged (the CPU paid the DRAM latency)
FLAG_HOST = 8


def make_requests(
    addr: np.ndarray | list[int],
    op: np.ndarray | list[int] | int = Op.READ,
    time_ns: np.ndarray | list[int] | int = 0,
    vcpu: np.ndarray | list[int] | int = 0,
    size: int = LINE_BYTES,
) -> np.ndarray:
    """Build a request array (addresses are aligned down to their 64 B line)."""
    addr_arr = np.asarray(addr, dtype=np.uint64)
    out = np.zeros(addr_arr.shape[0], dtype=REQUEST_DTYPE)
    out["addr"] = addr_arr & ~np.uint64(LINE_BYTES - 1)
    out["op"] = op
    out["time_ns"] = time_ns
    out["vcpu"] = vcpu
    out["size"] = size
    return out

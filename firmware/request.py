"""Host interface: the device request and response records shared by every driver.

A *device request* is one CXL.mem access that reached the device: which vCPU issued
it, when (modelled ns), the device physical address (DPA, bytes), its size and
whether it reads or writes. Two extra operations let a driver tell the model that the
host OS has carried out a page migration (the firmware decides migrations; the guest
performs them later), so a recorded stream replays to the same answers.

The request record, its operations, flags and the marker commands are the
protocol's (:mod:`cxlssd.abi.protocol`, the same layout as the plugin's C struct in
``abi/cxlssd_abi.h``): re-exported here, the firmware's host interface. The response
record is the model's own.
"""

from __future__ import annotations

import enum

import numpy as np

from cxlssd.abi.protocol import FLAG_DIRTY, FLAG_HOST, FLAG_POSTED, FLAG_QUERY, REQUEST_DTYPE, MarkerCmd, Op

__all__ = [
    "FLAG_DIRTY",
    "FLAG_ENGINE",
    "FLAG_HOST",
    "FLAG_OS_MOVE",
    "FLAG_POSTED",
    "FLAG_QUERY",
    "LINES_PER_PAGE",
    "LINE_BYTES",
    "LINE_SHIFT",
    "PAGE_BYTES",
    "PAGE_SHIFT",
    "REQUEST_DTYPE",
    "RESPONSE_DTYPE",
    "MarkerCmd",
    "Op",
    "Source",
    "make_requests",
]

LINE_BYTES = 64
PAGE_BYTES = 4096
LINES_PER_PAGE = PAGE_BYTES // LINE_BYTES
PAGE_SHIFT = 12
LINE_SHIFT = 6

#: the firmware's own mark, never on the wire (the plugin sets the low four bits): a
#: request the transfer engine made its work (a page move's copy, firmware/hints.py)
FLAG_ENGINE = 0x80
#: ... with the guest OS's promotion daemon as the engine (an ``XFER_BY_OS`` bracket): a
#: device read of a page not being promoted is a demotion's store to its new frame
FLAG_OS_MOVE = 0x40


class Source(enum.IntEnum):
    """Where a request was served from (``Response.source``)."""

    NONE = 0  # a PROMOTED/DEMOTED notification: no data moved through the device
    LOG = 1  # write-log hit (read) or append (write)
    CACHE = 2  # SSD data-cache hit
    FLASH = 3  # data-cache miss: the page was read from flash
    PROMOTED = 4  # the page lives in host DRAM (promoted)
    DRAM = 5  # the dram-only ideal device


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

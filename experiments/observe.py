"""What the guest shows of CXL events: its trace events, kernel log and poison list.

The guest kernel (6.12) reports a CXL device's events as ``cxl_*`` trace events
(``cxl_poison``, ``cxl_general_media``, ``cxl_dram``, ``cxl_memory_module``,
``cxl_aer_*_error``) and AER recovery in its kernel log; the device's poison
list is read through the mailbox when ``trigger_poison_list`` is written, and
debugfs ``clear_poison`` clears 64 bytes of poison (docs/inject.md). Every
helper here runs commands in the guest over SSH; a scenario run
(:mod:`.scenario`) uses them to record what a point's injections did.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cxlssd.errors import GuestError

if TYPE_CHECKING:
    from cxlssd.platform.ssh import GuestSSH

log = logging.getLogger(__name__)

TRACING_DIR = "/sys/kernel/tracing"
DEBUGFS_DIR = "/sys/kernel/debug"
CACHELINE_BYTES = 64  # the unit of QEMU's poison and of the guest's clear_poison
POLL_INTERVAL_S = 0.5
_DMESG_LINE = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")


def _shell(guest: GuestSSH, script: str, what: str) -> str:
    status, out, err = guest.run(["sh", "-c", script])
    if status != 0:
        problem = err.decode(errors="replace").strip()
        raise GuestError(f"{what} failed in the guest (status {status}): {problem}")
    return out.decode(errors="replace")


def enable_cxl_tracing(guest: GuestSSH, clear: bool = False) -> None:
    """Turn the kernel's CXL trace events on (tracefs mounted if needed); with
    ``clear``, empty the trace buffer so that later reads show only new events."""
    script = (f"mountpoint -q {TRACING_DIR} || mount -t tracefs nodev {TRACING_DIR}; "
              f"echo 1 > {TRACING_DIR}/events/cxl/enable")
    _shell(guest, script + (f"; echo > {TRACING_DIR}/trace" if clear else ""), "enabling CXL tracing")


def trace_lines(guest: GuestSSH) -> list[str]:
    """The events in the guest's trace buffer (header comments left out)."""
    text = _shell(guest, f"cat {TRACING_DIR}/trace", "reading the trace buffer")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def trace_fields(line: str) -> dict[str, str]:
    """``key=value`` fields of a trace event line (quoted values keep their quotes)."""
    return dict(re.findall(r"(\w+)=('[^']*'|\S+)", line))


def wait_for_trace(
    guest: GuestSSH, patterns: Sequence[str], timeout_s: float
) -> list[str | None]:
    """For each regex of ``patterns``, a distinct trace line matching it (in order of
    the patterns; two patterns never take the same line), or None if none appeared
    within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = trace_lines(guest)
        found: list[str | None] = []
        taken: set[int] = set()
        for pattern in patterns:
            index = next(
                (i for i, line in enumerate(lines) if i not in taken and re.search(pattern, line)), None
            )
            found.append(None if index is None else lines[index])
            if index is not None:
                taken.add(index)
        if all(line is not None for line in found) or time.monotonic() > deadline:
            return found
        time.sleep(POLL_INTERVAL_S)


def uptime_s(guest: GuestSSH) -> float:
    """The guest kernel's uptime: kernel-log timestamps are on this clock."""
    return float(_shell(guest, "cat /proc/uptime", "reading the uptime").split()[0])


def kernel_log_since(guest: GuestSSH, since_uptime_s: float) -> list[str]:
    """Kernel-log lines stamped at or after ``since_uptime_s`` (as ``dmesg`` prints them)."""
    lines = []
    for line in _shell(guest, "dmesg", "reading the kernel log").splitlines():
        match = _DMESG_LINE.match(line)
        if match and float(match.group(1)) >= since_uptime_s:
            lines.append(line)
    return lines


def trigger_poison_list(guest: GuestSSH, memdev: str) -> None:
    """Make the kernel read ``memdev``'s poison list: one ``cxl_poison`` event per record."""
    _shell(guest, f"echo 1 > /sys/bus/cxl/devices/{memdev}/trigger_poison_list", "reading the poison list")


def clear_poison(guest: GuestSSH, memdev: str, dpa: int, length_bytes: int) -> None:
    """Clear poison at ``dpa`` .. ``dpa + length_bytes`` through the guest's debugfs
    (the mailbox's Clear Poison, 64 bytes a command), so the range may be poisoned again."""
    path = f"{DEBUGFS_DIR}/cxl/{memdev}/clear_poison"
    writes = "; ".join(f"echo {hex(line)} > {path}"
                       for line in range(dpa, dpa + length_bytes, CACHELINE_BYTES))
    _shell(guest, f"mountpoint -q {DEBUGFS_DIR} || mount -t debugfs none {DEBUGFS_DIR}; {writes}",
           f"clearing poison at {dpa:#x}+{length_bytes:#x}")

"""Runs IN THE GUEST (numactl --membind=N python3 - MARKER_HEX PAGES): writes a
marker at the start of every page of an anonymous buffer, prints the pages'
physical addresses (from /proc/self/pagemap), then holds the pages until its
stdin closes, so the host can look for the marker in the device's backing file."""

import ctypes
import json
import mmap
import struct
import sys

PAGE = 4096
marker = bytes.fromhex(sys.argv[1])
pages = int(sys.argv[2])
buf = mmap.mmap(-1, pages * PAGE)
for page in range(pages):
    buf[page * PAGE : page * PAGE + len(marker)] = marker
base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
physical = []
with open("/proc/self/pagemap", "rb") as pagemap:
    for page in range(pages):
        pagemap.seek((base // PAGE + page) * 8)
        (entry,) = struct.unpack("<Q", pagemap.read(8))
        assert entry >> 63, "page not present"
        physical.append((entry & ((1 << 55) - 1)) * PAGE)
print(json.dumps(physical), flush=True)
sys.stdin.read()

"""Mapping the plugin's shared-memory files (counters, request ring) once QEMU made them."""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

import numpy as np

from cxlssd.errors import InputError


def map_when_ready(
    path: Path, header_bytes: int, magic: int, timeout_s: float, what: str, plugin_arg: str
) -> mmap.mmap:
    """Map ``path`` read-write once it exists, holds a header and starts with ``magic``
    (the plugin writes the magic last, so a mapped file is initialised). An
    :class:`InputError` naming ``what`` and the plugin argument that makes the file
    if that does not happen within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = -1
        if fd >= 0:
            try:
                size = os.fstat(fd).st_size
                if size >= header_bytes:
                    mapped = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                    if int(np.frombuffer(mapped, np.uint64, 1, 0)[0]) == magic:
                        return mapped
                    mapped.close()
            finally:
                os.close(fd)
        if time.monotonic() >= deadline:
            raise InputError(
                f"{path} is not a ready {what} after {timeout_s:.0f} s "
                f"(is QEMU running with -plugin libcxlssd.so,{plugin_arg}=PATH?)"
            )
        time.sleep(0.05)

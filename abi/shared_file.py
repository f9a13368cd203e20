"""Mapping the plugin's shared-memory files (counters, request ring, pv page) once QEMU
made them, and the lifecycle the three readers share (:class:`MappedFile`)."""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from pathlib import Path
from typing import TypeVar

import numpy as np

from cxlssd.errors import InputError
from cxlssd.lifecycle import Lifecycle

View = TypeVar("View")


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


class MappedFile(Lifecycle):
    """One of the plugin's shared files, mapped read-write once the plugin has made it.
    A subclass names the file (:attr:`what`, the plugin argument that creates it, its
    header size and magic), checks the mapping and keeps its numpy views in
    :meth:`_attach`, and drops them (after writing what leaving means) in
    :meth:`_detach`. Use as a context manager or call :meth:`open`/:meth:`close`."""

    what = "cxlssd shared file"
    plugin_arg = ""
    header_bytes = 0
    magic = 0

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._map: mmap.mmap | None = None

    def _begin(self) -> None:
        self.open()

    def _end(self, error: BaseException | None) -> None:
        self.close()

    def open(self, timeout_s: float = 60.0) -> None:
        """Map the file, waiting up to ``timeout_s`` for the plugin to create and
        initialise it; an :class:`InputError` if it never does or is not usable."""
        mapped = map_when_ready(self.path, self.header_bytes, self.magic, timeout_s, self.what,
                                self.plugin_arg)
        try:
            self._attach(mapped)
        except BaseException:
            with contextlib.suppress(BufferError):  # a view the traceback holds keeps it
                mapped.close()
            raise
        self._map = mapped

    def _attach(self, mapped: mmap.mmap) -> None:
        """Check ``mapped`` (an :class:`InputError` naming the problem; no view of it may
        outlive the error) and keep the views the reader uses."""
        raise NotImplementedError

    def _detach(self) -> None:
        """Write what closing means to the other side, then drop every view."""
        raise NotImplementedError

    def close(self) -> None:
        """Unmap the file (the file belongs to the instance's runtime dir)."""
        self._detach()
        if self._map is not None:
            # A view still held (a caller's chunk, a traceback's frame) keeps the mapping
            # until it goes: numpy views pin it.
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None

    def _open_view(self, view: View | None) -> View:
        """``view``, or an :class:`InputError` if the file is not open."""
        if view is None:
            raise InputError(f"{self.what} {self.path} is not open")
        return view

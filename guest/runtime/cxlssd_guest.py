"""Runs IN THE GUEST (Python 3.13, standard library only): ROI markers for Python programs.

    from cxlssd_guest import roi

    with roi(3):          # ROI 3 begins here ...
        work()            # ... and ends here, also on an exception

The markers are executed by ``libcxlssd.so`` (see ``cxlssd.h`` and
docs/guest-runtime.md), called through ctypes; ids are 0..255 (the library's
precompiled markers). The library is ``$CXLSSD_LIB`` if set, else
``../lib/libcxlssd.so`` next to this file as installed (``/opt/cxlssd/python``
and ``/opt/cxlssd/lib``). Python runs many instructions around the call, so an
ROI marked from Python is coarse: use the C macros for tight regions.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from pathlib import Path

RUNTIME_IDS = 256
LIBRARY_ENV = "CXLSSD_LIB"

_library: ctypes.CDLL | None = None


class LibraryError(OSError):
    """libcxlssd.so is missing or cannot be loaded."""


def library_path() -> Path:
    """Where the marker library is looked for: ``$CXLSSD_LIB``, else the installed layout."""
    explicit = os.environ.get(LIBRARY_ENV)
    if explicit:
        return Path(explicit)
    return Path(__file__).resolve().parent.parent / "lib" / "libcxlssd.so"


def load() -> ctypes.CDLL:
    """Load the marker library (once); call it before a measured region so that the
    first marker does not pay for loading it. Raises :class:`LibraryError`."""
    global _library
    if _library is None:
        path = library_path()
        if not path.is_file():
            raise LibraryError(
                f"cxlssd marker library not found at {path}: install the guest runtime "
                f"(cxlssd.guest.runtime.install) or set {LIBRARY_ENV} to libcxlssd.so"
            )
        try:
            library = ctypes.CDLL(str(path), use_errno=True)
        except OSError as error:
            raise LibraryError(f"cannot load the cxlssd marker library {path}: {error}") from None
        for name in ("cxlssd_roi_begin", "cxlssd_roi_end"):
            function = getattr(library, name)
            function.argtypes = [ctypes.c_uint]
            function.restype = ctypes.c_int
        library.cxlssd_clock_ns.argtypes = []
        library.cxlssd_clock_ns.restype = ctypes.c_ulonglong
        _library = library
    return _library


def _mark(name: str, roi_id: int) -> None:
    if not isinstance(roi_id, int) or isinstance(roi_id, bool) or not 0 <= roi_id < RUNTIME_IDS:
        raise ValueError(f"ROI id must be an integer 0..{RUNTIME_IDS - 1}, got {roi_id!r}")
    if getattr(load(), name)(roi_id) != 0:
        raise OSError(f"{name}({roi_id}) failed")


def roi_begin(roi_id: int) -> None:
    """Mark the beginning of ROI ``roi_id`` (0..255)."""
    _mark("cxlssd_roi_begin", roi_id)


def roi_end(roi_id: int) -> None:
    """Mark the end of ROI ``roi_id`` (0..255)."""
    _mark("cxlssd_roi_end", roi_id)


@contextlib.contextmanager
def roi(roi_id: int) -> Iterator[None]:
    """The body of the ``with`` block is ROI ``roi_id``; the end is marked even on an exception."""
    roi_begin(roi_id)
    try:
        yield
    finally:
        roi_end(roi_id)


def clock_ns() -> int:
    """This vCPU's modelled clock in ns (0 when no firmware is attached). Raises
    OSError when the guest has no cxlssd clock page (not a cxlssd guest, or not root)."""
    library = load()
    ctypes.set_errno(0)
    value = int(library.cxlssd_clock_ns())
    if value == 0 and ctypes.get_errno():
        raise OSError(ctypes.get_errno(), "cannot read the modelled clock (no cxlssd clock page)")
    return value

"""Request-trace files: a versioned header, then CRC-checked chunks of records.

Layout (all little-endian)::

    header   40 bytes  struct "<8sHHHBBQQI4x"
             magic "CXLSSDTR", version (1), header_bytes (40), record_bytes (24),
             timebase (0 = issue, 1 = compute), reserved (0),
             total records, chunk count, metadata bytes
    metadata JSON (utf-8) of `metadata bytes`: how the trace was made
    chunks   each: "<II" record count, CRC-32 of the payload; then
             count x REQUEST_DTYPE records (24 bytes each)

The writer writes ``NAME.partial`` and, on a clean close, patches the totals into
the header, syncs and renames it to ``NAME``: a trace exists under its name only
complete (an interrupted writer leaves at most the ``.partial`` file, which a block
ending in an error removes). A file whose header totals do not match its size is
rejected, as is a wrong magic, version, record size or CRC. Chunks let the reader
stream traces larger than RAM.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

import numpy as np

from cxlssd.errors import InputError
from cxlssd.firmware.request import REQUEST_DTYPE
from cxlssd.lifecycle import Lifecycle

MAGIC = b"CXLSSDTR"
VERSION = 1
_HEADER = struct.Struct("<8sHHHBBQQI4x")
_CHUNK = struct.Struct("<II")
TIMEBASE_CODES = {"issue": 0, "compute": 1}
DEFAULT_CHUNK_RECORDS = 1 << 16
MAX_METADATA_BYTES = 1 << 20


class TraceWriter(Lifecycle):
    """Write a trace incrementally: ``with TraceWriter(path, meta) as w: w.write(arr)``."""

    def __init__(
        self,
        path: str | Path,
        metadata: dict[str, Any] | None = None,
        timebase: str = "compute",
        chunk_records: int = DEFAULT_CHUNK_RECORDS,
    ) -> None:
        if timebase not in TIMEBASE_CODES:
            raise ValueError(f"timebase must be one of {list(TIMEBASE_CODES)}")
        self.path = Path(path)
        self.timebase = timebase
        self.chunk_records = chunk_records
        self.records = 0
        self.chunks = 0
        self._meta = json.dumps(metadata or {}, sort_keys=True).encode()
        self.partial_path = self.path.with_name(f"{self.path.name}.partial")
        self._file: BinaryIO = open(self.partial_path, "wb")  # noqa: SIM115 (closed in close())
        self._file.write(self._header())
        self._file.write(self._meta)

    def _header(self) -> bytes:
        return _HEADER.pack(
            MAGIC, VERSION, _HEADER.size, REQUEST_DTYPE.itemsize,
            TIMEBASE_CODES[self.timebase], 0, self.records, self.chunks, len(self._meta),
        )

    def write(self, requests: np.ndarray) -> None:
        """Append ``requests`` (REQUEST_DTYPE), split into chunks."""
        if requests.dtype != REQUEST_DTYPE:
            raise ValueError(f"records must have REQUEST_DTYPE, got {requests.dtype}")
        for lo in range(0, requests.shape[0], self.chunk_records):
            payload = np.ascontiguousarray(requests[lo : lo + self.chunk_records]).tobytes()
            count = len(payload) // REQUEST_DTYPE.itemsize
            self._file.write(_CHUNK.pack(count, zlib.crc32(payload)))
            self._file.write(payload)
            self.records += count
            self.chunks += 1

    def close(self) -> None:
        """Finish the trace: totals into the header, synced, renamed to its name."""
        if self._file.closed:
            return
        self._file.seek(0)
        self._file.write(self._header())
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self.partial_path.replace(self.path)

    def discard(self) -> None:
        """Give up: the partial file is removed, nothing appears under the trace's name."""
        if not self._file.closed:
            self._file.close()
        self.partial_path.unlink(missing_ok=True)

    def _end(self, error: BaseException | None) -> None:
        if error is None:
            self.close()
        else:
            self.discard()


class TraceReader:
    """Read a trace's header eagerly and its chunks lazily (:meth:`chunks`)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            # O_NONBLOCK: a FIFO given as a trace is refused below, not waited on.
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                found = os.fstat(fd)
                if not stat.S_ISREG(found.st_mode):
                    self._fail("is not a regular file")
                self._size = found.st_size
                head = f.read(_HEADER.size)
                if len(head) < _HEADER.size:
                    self._fail("is too short to hold a trace header")
                (magic, version, header_bytes, record_bytes, timebase, _, records, chunks,
                 meta_bytes) = _HEADER.unpack(head)
                if magic != MAGIC:
                    self._fail(f"is not a cxlssd trace (magic {magic!r}, expected {MAGIC!r})")
                if version != VERSION:
                    self._fail(
                        f"has trace format version {version}; this cxlssd reads version "
                        f"{VERSION}: re-record or convert the trace"
                    )
                if header_bytes != _HEADER.size or record_bytes != REQUEST_DTYPE.itemsize:
                    self._fail(f"has a {header_bytes} B header / {record_bytes} B records; "
                               f"version {VERSION} uses {_HEADER.size} / {REQUEST_DTYPE.itemsize}")
                if meta_bytes > min(MAX_METADATA_BYTES, self._size):
                    self._fail(f"claims {meta_bytes} bytes of metadata (at most {MAX_METADATA_BYTES}, "
                               f"in a {self._size}-byte file): it is corrupt")
                meta = f.read(meta_bytes)
        except OSError as error:
            raise InputError(f"cannot read trace {path}: {error.strerror}") from None
        if len(meta) < meta_bytes:
            self._fail("is truncated inside its metadata")
        self.records: int = records
        self.n_chunks: int = chunks
        names = {v: k for k, v in TIMEBASE_CODES.items()}
        if timebase not in names:
            self._fail(f"has an unknown timebase code {timebase}")
        self.timebase: str = names[timebase]
        try:
            metadata = json.loads(meta or b"{}")
        except (ValueError, RecursionError):
            metadata = None
        if not isinstance(metadata, dict):
            self._fail("has metadata that is not a UTF-8 JSON object")
        self.metadata: dict[str, Any] = metadata
        self._data_offset = _HEADER.size + meta_bytes
        expected = self._data_offset + chunks * _CHUNK.size + records * REQUEST_DTYPE.itemsize
        if self._size != expected:
            self._fail(
                f"is {self._size} bytes but its header promises {expected} "
                f"({records} records in {chunks} chunks): it is truncated or its writer "
                "did not finish; re-create it"
            )

    def _fail(self, problem: str) -> NoReturn:
        raise InputError(f"trace {self.path} {problem}")

    def chunks(self) -> Iterator[np.ndarray]:
        """Yield the records chunk by chunk (each a fresh REQUEST_DTYPE array)."""
        with open(self.path, "rb") as f:
            f.seek(self._data_offset)
            for index in range(self.n_chunks):
                head = f.read(_CHUNK.size)
                if len(head) < _CHUNK.size:
                    self._fail(f"is truncated in chunk {index}")
                count, crc = _CHUNK.unpack(head)
                if count > self.records:
                    self._fail(f"chunk {index} claims {count} records, more than the trace's {self.records}")
                payload = f.read(count * REQUEST_DTYPE.itemsize)
                if len(payload) < count * REQUEST_DTYPE.itemsize:
                    self._fail(f"is truncated in chunk {index}")
                if zlib.crc32(payload) != crc:
                    self._fail(f"chunk {index} fails its CRC check: the file is corrupt")
                yield np.frombuffer(payload, dtype=REQUEST_DTYPE).copy()

    def read_all(self) -> np.ndarray:
        """Every record in one array (small traces only)."""
        parts = list(self.chunks())
        return np.concatenate(parts) if parts else np.zeros(0, dtype=REQUEST_DTYPE)

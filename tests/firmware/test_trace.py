"""Trace format: round trip, streaming chunks, and every kind of bad file."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from cxlssd.errors import InputError
from cxlssd.firmware.synth import SynthSpec, synthesize
from cxlssd.firmware.trace import TraceReader, TraceWriter


def _write(path, records, chunk=1000):
    with TraceWriter(path, {"what": "test"}, chunk_records=chunk) as writer:
        writer.write(records)


def test_round_trip_in_chunks(tmp_path) -> None:
    records = synthesize(SynthSpec(requests=2500, footprint_bytes=1 << 20))
    _write(tmp_path / "t", records)
    reader = TraceReader(tmp_path / "t")
    assert (reader.records, reader.n_chunks, reader.timebase) == (2500, 3, "compute")
    assert reader.metadata == {"what": "test"}
    assert [c.shape[0] for c in reader.chunks()] == [1000, 1000, 500]
    assert np.array_equal(reader.read_all(), records)


def test_a_trace_exists_under_its_name_only_when_complete(tmp_path) -> None:
    """Written as NAME.partial and renamed on a clean close; a block ending in an error
    (Ctrl-C during ``trace synth``) leaves nothing, not a shorter trace that reads as whole."""
    records = synthesize(SynthSpec(requests=3000, footprint_bytes=1 << 20))
    path = tmp_path / "t"
    with pytest.raises(KeyboardInterrupt), TraceWriter(path, {"what": "test"}, chunk_records=1000) as w:
        w.write(records[:2000])
        assert w.partial_path.exists() and not path.exists()
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    _write(path, records)
    assert [p.name for p in tmp_path.iterdir()] == ["t"] and TraceReader(path).records == 3000


def test_truncated_trace(tmp_path) -> None:
    records = synthesize(SynthSpec(requests=100, footprint_bytes=1 << 20))
    _write(tmp_path / "t", records)
    data = (tmp_path / "t").read_bytes()
    (tmp_path / "t").write_bytes(data[:-10])
    with pytest.raises(InputError, match="truncated"):
        TraceReader(tmp_path / "t")
    (tmp_path / "t").write_bytes(data[:20])
    with pytest.raises(InputError, match="too short"):
        TraceReader(tmp_path / "t")


def test_wrong_version_and_magic(tmp_path) -> None:
    _write(tmp_path / "t", synthesize(SynthSpec(requests=10, footprint_bytes=1 << 20)))
    data = bytearray((tmp_path / "t").read_bytes())
    data[8:10] = struct.pack("<H", 7)
    (tmp_path / "v").write_bytes(bytes(data))
    with pytest.raises(InputError, match="version 7"):
        TraceReader(tmp_path / "v")
    (tmp_path / "m").write_bytes(b"NOTATRACE" + bytes(data[9:]))
    with pytest.raises(InputError, match="not a cxlssd trace"):
        TraceReader(tmp_path / "m")


def test_corrupt_chunk(tmp_path) -> None:
    _write(tmp_path / "t", synthesize(SynthSpec(requests=10, footprint_bytes=1 << 20)))
    data = bytearray((tmp_path / "t").read_bytes())
    data[-1] ^= 0xFF
    (tmp_path / "t").write_bytes(bytes(data))
    with pytest.raises(InputError, match="CRC"):
        list(TraceReader(tmp_path / "t").chunks())


def test_synth_patterns_are_deterministic() -> None:
    for pattern in ("uniform", "zipf", "sequential", "hotset"):
        spec = SynthSpec(pattern=pattern, requests=5000, footprint_bytes=4 << 20,
                         hot_bytes=64 << 10)
        a, b = synthesize(spec), synthesize(spec)
        assert np.array_equal(a, b)
        assert (a["addr"] < 4 << 20).all() and (a["addr"] % 64 == 0).all()
    hot = synthesize(SynthSpec(pattern="hotset", requests=20000, footprint_bytes=64 << 20,
                               hot_bytes=64 << 10, hot_fraction=0.9))
    _pages, counts = np.unique(hot["addr"] >> 12, return_counts=True)
    assert np.sort(counts)[::-1][:16].sum() > 0.85 * hot.shape[0]

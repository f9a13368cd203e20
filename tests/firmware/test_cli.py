"""CLI: replay and trace commands through cxlssd.cli.main; bad input exits with 2."""

from __future__ import annotations

import json
import struct

import pytest

from cxlssd.cli import main
from cxlssd.firmware.replay import with_recorded_device
from cxlssd.firmware.trace import TraceReader, TraceWriter

SMALL_SETS = ["--set", "device.capacity_bytes=64MiB", "--set", "ssd_dram.size_bytes=1MiB",
              "--set", "write_log.size_bytes=128KiB"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "t.trace"
    assert main(["trace", "synth", str(path), "--requests", "20000", "--footprint", "8MiB",
                 "--pattern", "hotset", "--hot", "256KiB"]) == 0
    return path


def test_replay_prints_and_writes_results(trace, tmp_path, capsys) -> None:
    out = tmp_path / "r.json"
    assert main(["replay", str(trace), "--design", "skybyte-full", *SMALL_SETS,
                 "--set", "cache.ways=8", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "design skybyte-full: 20000 requests" in printed and "modelled stall total" in printed
    result = json.loads(out.read_text())
    assert result["profile"]["cache"]["ways"] == 8
    assert result["profile"]["flash"]["read_ns"] == 3000
    assert result["counters"]["model"]["requests"] == 20000
    assert result["trace"]["metadata"]["pattern"] == "hotset"
    assert set(result["stalls"]) >= {"stall_ns_total", "latency_ns_total"}


def test_replay_is_deterministic_and_path_independent(trace, tmp_path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["replay", str(trace), "--design", "skybyte-wp", *SMALL_SETS, "--out", str(a)]) == 0
    assert main(["replay", str(trace), "--design", "skybyte-wp", *SMALL_SETS, "--out", str(b),
                 "--no-vectorize"]) == 0
    assert a.read_text() == b.read_text()


def test_trace_info(trace, capsys) -> None:
    assert main(["trace", "info", str(trace)]) == 0
    assert json.loads(capsys.readouterr().out)["records"] == 20000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--design", "skybyte-ful"], "did you mean 'skybyte-full'"),
        (["--set", "cache.wayz=4"], "did you mean 'cache.ways'"),
        (["--set", "write_log.size_bytes=1GiB", "--design", "skybyte-w"], "larger than"),
        (["--set", "flash.channels=0"], "flash.channels must be at least 1"),
    ],
)
def test_bad_configuration_exits_2(trace, caplog, args, message) -> None:
    assert main(["replay", str(trace), *args]) == 2
    assert message in caplog.text


def test_bad_trace_files_exit_2(trace, tmp_path, caplog) -> None:
    data = trace.read_bytes()
    (tmp_path / "cut").write_bytes(data[: len(data) // 2])
    assert main(["replay", str(tmp_path / "cut")]) == 2
    assert "truncated" in caplog.text
    (tmp_path / "v9").write_bytes(data[:8] + struct.pack("<H", 9) + data[10:])
    assert main(["replay", str(tmp_path / "v9")]) == 2
    assert "version 9" in caplog.text
    assert main(["replay", str(tmp_path / "missing")]) == 2
    assert "does not exist" in caplog.text


def test_bench_runs_small(capsys) -> None:
    assert main(["bench-firmware", "--requests", "20000", "--footprint", "8MiB",
                 "--profiles", "base-cssd,dram-only"]) == 0
    printed = capsys.readouterr().out
    assert "base-cssd" in printed and "req/s" in printed


def test_replay_with_the_artifacts_gc_collects_lines_and_holds_reads(tmp_path) -> None:
    # a drive 3/4 full of uniformly rewritten pages: GC runs; gc.unit line erases a
    # block on each of the 16 dies per line, and with gc.read_priority false reads wait
    # behind GC's work (docs/firmware.md, "Line GC against per-die GC")
    trace = tmp_path / "w.trace"
    assert main(["trace", "synth", str(trace), "--requests", "60000", "--footprint", "12MiB",
                 "--pattern", "uniform", "--write-fraction", "0.5"]) == 0
    small = ["--set", "device.capacity_bytes=16MiB", "--set", "ssd_dram.size_bytes=1MiB",
             "--set", "flash.pages_per_block=32"]
    results = {}
    for unit, read_priority in (("die", "true"), ("die", "false"), ("line", "true")):
        out = tmp_path / f"{unit}-{read_priority}.json"
        assert main(["replay", str(trace), "--design", "base-cssd", *small, "--set", f"gc.unit={unit}",
                     "--set", f"gc.read_priority={read_priority}", "--out", str(out)]) == 0
        results[unit, read_priority] = json.loads(out.read_text())
    flash = {key: r["counters"]["flash"] for key, r in results.items()}
    assert flash["line", "true"]["gc_runs"] > 0 and flash["die", "true"]["gc_runs"] > 0
    assert flash["line", "true"]["erases_gc"] == 16 * flash["line", "true"]["gc_runs"]
    assert flash["die", "true"]["erases_gc"] == flash["die", "true"]["gc_runs"]
    # the same GC work either way; only how long reads queue differs
    queued = {key: f.pop("host_read_queue_ns") for key, f in flash.items()}
    assert flash["die", "false"] == flash["die", "true"]
    assert queued["die", "false"] > queued["die", "true"]
    stall = {key: r["stalls"]["stall_ns_total"] for key, r in results.items()}
    assert stall["die", "false"] > stall["die", "true"]


def test_replaying_a_recording_keeps_the_device_the_guest_saw(trace, tmp_path) -> None:
    """A live recording carries its profile; the device's capacity (the CXL window, which
    sizes the flash and so when GC starts) is the recording's, not the named design's
    8 GiB, unless the caller sets it."""
    writes = tmp_path / "writes.trace"
    assert main(["trace", "synth", str(writes), "--requests", "60000", "--footprint", "8MiB",
                 "--write-fraction", "0.9"]) == 0
    records = TraceReader(writes).read_all()
    recorded = tmp_path / "recorded.trace"
    with TraceWriter(recorded, {"source": "live", "profile": {"device": {"capacity_bytes": 8 << 20}}}) as w:
        w.write(records)
    sets = ["--design", "base-cssd", "--set", "ssd_dram.size_bytes=1MiB"]
    results = {}
    for name, extra in {"recorded": [], "override": ["--set", "device.capacity_bytes=64MiB"]}.items():
        out = tmp_path / f"{name}.json"
        assert main(["replay", str(recorded), *sets, *extra, "--out", str(out)]) == 0
        results[name] = json.loads(out.read_text())
    assert results["recorded"]["profile"]["device"]["capacity_bytes"] == 8 << 20
    assert results["override"]["profile"]["device"]["capacity_bytes"] == 64 << 20
    erases = {name: r["counters"]["flash"]["erases_gc"] for name, r in results.items()}
    print(f"GC erases: {erases}")
    assert erases["recorded"] > erases["override"]  # the small drive collects garbage
    # a synthetic trace has no recorded device: the design's own
    assert with_recorded_device(trace, ["cache.ways=8"]) == ["cache.ways=8"]

"""A corpus of hostile inputs (platform configs, experiments, traces, command-line
arguments): each case ends in exit 2 with one error line, or in a clean accept,
within seconds and in bounded memory, and never boots a guest.

Each case runs ``python -m cxlssd`` in a child with a 4 GiB address-space limit and
a 60 s timeout; the files it names are made in a scratch directory first."""

from __future__ import annotations

import json
import os
import resource
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cxlssd.firmware.synth import SynthSpec, synthesize
from cxlssd.firmware.trace import TraceWriter

REPO = Path(__file__).resolve().parents[1]
ADDRESS_SPACE_BYTES = 4 << 30
TIMEOUT_S = 60
MAX_ERROR_CHARS = 600

TINY_SYNTH = {"pattern": "zipf", "requests": 1000, "footprint_bytes": "1MiB"}
# The header of trace format 1 (firmware/trace.py) and one 24-byte record.
HEADER = struct.Struct("<8sHHHBBQQI4x")
RECORD = bytes(24)


def _trace(meta: bytes = b"{}", records: int = 1, chunk_count: int | None = None) -> bytes:
    payload = RECORD * records
    head = HEADER.pack(b"CXLSSDTR", 1, 40, 24, 1, 0, records, 1, len(meta))
    count = records if chunk_count is None else chunk_count
    return head + meta + struct.pack("<II", count, zlib.crc32(payload)) + payload


def _experiment(**changes: object) -> str:
    return json.dumps({"name": "h", "designs": ["base-cssd"], "traces": [{"name": "z", "synth": TINY_SYNTH}],
                       **changes})


def _with_platform(config: str) -> dict[str, str | bytes]:
    return {"cfg.yaml": config, "exp.yaml": _experiment(platform="cfg.yaml")}


@dataclass(frozen=True)
class Case:
    name: str
    argv: list[str]
    files: dict[str, str | bytes] = field(default_factory=dict)
    accept: bool = False
    message: str = ""  # part of the error line
    setup: Callable[[Path], None] | None = None
    env: dict[str, str] = field(default_factory=dict)  # CXLSSD_QEMU: a case that must not boot cannot


def _fifo(name: str) -> Callable[[Path], None]:
    return lambda where: os.mkfifo(where / name)


def _valid_trace(name: str) -> Callable[[Path], None]:
    def write(where: Path) -> None:
        spec = SynthSpec(requests=500, footprint_bytes=1 << 20)
        with TraceWriter(where / name, spec.metadata()) as writer:
            writer.write(synthesize(spec))

    return write


BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)
RUN = ["run", "exp.yaml", "--out", "out"]
REPLAY = ["replay", "t.trace", "--design", "base-cssd"]

CASES = [
    # -- platform configs (read by the experiment before anything runs) --
    Case("config-nan-timeout", RUN, _with_platform("guest: {boot_timeout_s: .nan}"), message="boot_timeout"),
    Case("config-inf-timeout", RUN, _with_platform("guest: {boot_timeout_s: .inf}"), message="boot_timeout"),
    Case("config-nan-cpi", RUN, _with_platform("cpu: {cpi: .nan}"), message="cpu.cpi"),
    Case("config-huge-vcpus", RUN, _with_platform("guest: {vcpus: 100000000000}"), message="vcpus"),
    Case("config-huge-size", RUN, _with_platform(f"guest: {{dram: {'9' * 40}GiB}}"), message="not a size"),
    Case("config-5000-digit-int", RUN, _with_platform(f"guest: {{dram: {'9' * 5000}}}"),
         message="cannot be read"),
    Case("config-alias-bomb", RUN, _with_platform(BOMB), message="aliases expand"),
    Case("config-recursive-alias", RUN, _with_platform("a: &a [*a]\n"), message="contains it"),
    Case("config-deep", RUN, _with_platform("[" * 100_000), message="nest"),
    Case("config-deep-64", RUN, _with_platform("[" * 65 + "]" * 65), message="nested deeper than 64"),
    Case("config-not-utf8", RUN, {**_with_platform(""), "cfg.yaml": b"name: \xff\xfe\n"}, message="UTF-8"),
    Case("config-too-big", RUN, _with_platform("#" * (2 << 20)), message="at most"),
    Case("config-fifo", RUN, {"exp.yaml": _experiment(platform="cfg.yaml")}, setup=_fifo("cfg.yaml"),
         message="no platform config"),
    Case("config-fifo-direct", ["guest", "exec", "--config", "cfg.yaml", "--", "true"],
         setup=_fifo("cfg.yaml"), message="not a regular file", env={"CXLSSD_QEMU": "/nonexistent/qemu"}),
    Case("config-long-name", RUN, _with_platform(f"name: {'n' * 200_000}"), message="characters"),
    Case("config-long-unknown-key", RUN, _with_platform(f"? {'k' * 200_000}\n: 1\n"), message="unknown key"),
    Case("config-many-devices", RUN, _with_platform("cxl_devices: [" + "{size: 1GiB}," * 1000 + "]"),
         message="at most 4"),
    Case("config-date-size", RUN, _with_platform("guest: {dram: 2001-01-01}"), message="size"),
    Case("config-plain", RUN, _with_platform("name: fine"), accept=True),
    # -- experiments --
    Case("experiment-sweep-explosion", RUN, {"exp.yaml": _experiment(
        designs=["base-cssd", "dram-only"],
        traces=[{"name": "z", "synth": TINY_SYNTH,
                 "sweep": {"cache.ways": list(range(1, 300)), "flash.read_ns": list(range(1000, 1300))}}])},
         message="points"),
    Case("experiment-nan-timeout", RUN, {"exp.yaml": _experiment(point_timeout_s=float("nan"))},
         message="point_timeout_s"),
    Case("experiment-huge-repeat", RUN, {"exp.yaml": _experiment(repeat=10**30)}, message="repeat"),
    Case("experiment-workloads-string", RUN, {"exp.yaml": _experiment(workloads="chase")}, message="list"),
    Case("experiment-not-a-mapping", RUN, {"exp.yaml": "[1, 2, 3]"}, message="mapping"),
    Case("experiment-trace-fifo", RUN, {"exp.yaml": _experiment(traces=[{"name": "r", "path": "t.trace"}])},
         setup=_fifo("t.trace"), message="does not exist"),
    Case("experiment-out-unwritable", ["run", "exp.yaml", "--out", "/proc/cxlssd-out"],
         {"exp.yaml": _experiment()}, message="results directory"),
    Case("experiment-fine", RUN, {"exp.yaml": _experiment()}, accept=True),
    # -- traces --
    Case("trace-random-bytes", REPLAY, {"t.trace": os.urandom(4096)}, message="not a cxlssd trace"),
    Case("trace-empty", REPLAY, {"t.trace": b""}, message="too short"),
    Case("trace-huge-metadata-claim", REPLAY,
         {"t.trace": HEADER.pack(b"CXLSSDTR", 1, 40, 24, 1, 0, 0, 0, 0xFFFFFFFF)}, message="metadata"),
    Case("trace-metadata-list", REPLAY, {"t.trace": _trace(b"[1, 2]")}, message="JSON object"),
    Case("trace-metadata-not-utf8", REPLAY, {"t.trace": _trace(b'{"a": "\xff"}')}, message="JSON object"),
    Case("trace-metadata-deep", REPLAY, {"t.trace": _trace(b"[" * 100_000 + b"]" * 100_000)},
         message="JSON object"),
    Case("trace-chunk-promises-more", REPLAY, {"t.trace": _trace(records=2, chunk_count=0xFFFFFFFF)},
         message="claims"),
    Case("trace-truncated", REPLAY, {"t.trace": _trace(records=4)[:-10]}, message="truncated"),
    Case("trace-fifo", ["trace", "info", "t.trace"], setup=_fifo("t.trace"), message="not a regular file"),
    Case("trace-info-directory", ["trace", "info", "."], message="trace"),
    # -- command-line arguments --
    Case("cli-out-missing-dir", [*REPLAY, "--out", "no/such/dir/r.json"], {"t.trace": _trace()},
         message="does not exist"),
    Case("cli-out-device", [*REPLAY, "--out", "/dev/full"], {"t.trace": _trace()},
         message="not a regular file"),
    Case("cli-unknown-design", ["replay", "t.trace", "--design", "x" * 100_000], {"t.trace": _trace()},
         message="File name too long"),  # firmware/profile.py's lookup; the CLI keeps it to one line
    Case("cli-guest-exec-results-unwritable",
         ["guest", "exec", "--design", "base-cssd", "--results", "no/such/r.json", "--", "true"],
         message="does not exist", env={"CXLSSD_QEMU": "/nonexistent/qemu"}),
    Case("cli-inject-long-instance", ["inject", "--instance", "i" * 100_000, "poison", "--dpa", "0"],
         message="not running"),
    Case("cli-synth-unwritable", ["trace", "synth", "/proc/cxlssd.trace", "--requests", "10"],
         message="cxlssd.trace"),
    Case("cli-replay-fine", REPLAY, setup=_valid_trace("t.trace"), accept=True),
]


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input_is_refused_in_one_line_or_accepted(case: Case, tmp_path: Path) -> None:
    for name, content in case.files.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    if case.setup is not None:
        case.setup(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), **case.env}
    result = subprocess.run(
        [sys.executable, "-m", "cxlssd", *case.argv], cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=TIMEOUT_S, preexec_fn=_limit_memory,
    )
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    if case.accept:
        assert result.returncode == 0, result.stderr[-3000:]
        return
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-3000:]
    assert len(errors[0]) <= MAX_ERROR_CHARS, errors[0][:MAX_ERROR_CHARS] + "..."
    assert case.message in errors[0], errors[0]

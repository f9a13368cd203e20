"""The TCG plugin: its cached build, its strict arguments, and (booting real
guests) that it sees the guest's loads and stores to the CXL device."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cxlssd.abi.counters import PluginCounters
from cxlssd.errors import PrerequisiteError
from cxlssd.firmware.controller import Controller
from cxlssd.firmware.live import LiveDriver
from cxlssd.firmware.profile import load_profile
from cxlssd.firmware.replay import replay_file
from cxlssd.firmware.request import Op
from cxlssd.firmware.trace import TraceReader
from cxlssd.platform.machine import Platform
from cxlssd.platform.plugin import build
from cxlssd.platform.plugin.build import ensure_plugin

QEMU = "qemu-system-x86_64"
QUICK_TIMEOUT_S = 60
DESIGN = "skybyte-full"


@pytest.fixture(scope="module")
def plugin() -> Path:
    return ensure_plugin()


# -- build ---------------------------------------------------------------------------


def test_build_is_cached_and_rebuilt_only_on_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXLSSD_CACHE", str(tmp_path / "cache"))
    first = ensure_plugin()
    assert first.is_file() and first.parent.parent == tmp_path / "cache" / "plugin"
    built_at = first.stat().st_mtime_ns

    def no_compiler(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cached plugin was rebuilt")

    with monkeypatch.context() as patched:
        patched.setattr(subprocess, "run", no_compiler)
        assert ensure_plugin() == first
    assert first.stat().st_mtime_ns == built_at

    # A changed flag is a different plugin, built next to the first.
    monkeypatch.setattr(build, "CFLAGS", (*build.CFLAGS, "-DCXLSSD_TEST_FLAG=1"))
    second = ensure_plugin()
    assert second != first and second.is_file() and first.is_file()


def test_compile_error_shows_the_compilers_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXLSSD_CACHE", str(tmp_path / "cache"))
    broken = tmp_path / "broken.c"
    broken.write_text("int main(void) { return undeclared_thing; }\n")
    monkeypatch.setattr(build, "SOURCES", (broken,))
    monkeypatch.setattr(build, "MAIN_SOURCE", broken)
    with pytest.raises(PrerequisiteError, match=r"(?s)building the TCG plugin failed.*undeclared_thing"):
        ensure_plugin()
    assert not list((tmp_path / "cache" / "plugin").rglob("*.so"))


def test_missing_compiler_is_a_prerequisite_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXLSSD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CXLSSD_CC", "no-such-cc-cxlssd")
    with pytest.raises(PrerequisiteError, match=r"no-such-cc-cxlssd.*not found"):
        ensure_plugin()


# -- arguments -----------------------------------------------------------------------


def _qemu_none(plugin_arg: str) -> subprocess.CompletedProcess[str]:
    """QEMU without a machine: loads the plugin, then quits at once (stdin closed)."""
    return subprocess.run(
        [
            QEMU,
            "-M",
            "none",
            "-display",
            "none",
            "-monitor",
            "none",
            "-serial",
            "none",
            "-qmp",
            "stdio",
            "-plugin",
            plugin_arg,
        ],
        input='{"execute": "qmp_capabilities"}\n{"execute": "quit"}\n',
        capture_output=True,
        text=True,
        timeout=QUICK_TIMEOUT_S,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("colour=red", "bad argument 'colour=red': unknown key"),
        ("out=", "out= must be given once"),
        ("out=/tmp/a,out=/tmp/b", "out= must be given once"),
        ("window=0x1000", "expected window=BASE:SIZE"),
        ("window=0x1000:zz", "expected window=BASE:SIZE"),
        ("window=-64:64", "expected window=BASE:SIZE"),
        ("window=0x1000:0", "size is 0"),
        ("window=0x1010:0x40", "multiples of 64"),
        ("window=0x1000:0x100,window=0x1080:0x100", "overlaps another window"),
        (",".join(f"window={i * 64}:64" for i in range(9)), "at most 8 windows"),
        ("window=0x1000:0x100:zz", "expected window=BASE:SIZE"),
        ("llc=1000", "must be a power of 2"),
        ("llc=3145728", "must be a power of 2"),
        ("llc_ways=0", "must be 1..64"),
        ("llc=0x100000,llc=0x100000", "must be given once"),
        ("ring_records=1000", "must be a power of 2"),
        ("ring_timeout_ms=0", "must be 1..3600000"),
        ("insn_ps=x", "must be given once, with a number"),
        ("ring=", "ring= must be given once"),
        ("string_bytes=0", "must be 1..4096"),
        ("string_bytes=4097", "must be 1..4096"),
        ("ram_top=0", "must be 1..2^40 bytes"),
        ("ram_top=0x10000000001", "must be 1..2^40 bytes"),
        ("doorbell_fd=999", "must be an open descriptor QEMU inherited"),
        ("doorbell_fd=0", "needs pv="),
        ("cache_map=/nonexistent/cachemap", "must be a regular file the platform created"),
        ("cache_map=", "cache_map= must be given once"),
    ],
)
@pytest.mark.guest
def test_bad_arguments_stop_qemu_with_the_plugins_message(plugin: Path, args: str, message: str) -> None:
    result = _qemu_none(f"{plugin},{args}")
    assert result.returncode != 0
    assert "cxlssd plugin: bad argument" in result.stderr and message in result.stderr, result.stderr
    assert "Could not load plugin" in result.stderr


@pytest.mark.guest
def test_existing_shm_file_is_refused(plugin: Path, tmp_path: Path) -> None:
    taken = tmp_path / "counters"
    taken.write_bytes(b"someone else's")
    result = _qemu_none(f"{plugin},shm={taken}")
    assert result.returncode != 0 and f"cannot create shm file {taken}" in result.stderr
    assert taken.read_bytes() == b"someone else's"


@pytest.mark.guest
def test_good_arguments_load_and_write_json_at_exit(plugin: Path, tmp_path: Path) -> None:
    out = tmp_path / "counters.json"
    result = _qemu_none(f"{plugin},out={out},shm={tmp_path / 'c'},window=0x1000:0x1000")
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["windows"][0]["base"] == 0x1000 and report["windows"][0]["size"] == 0x1000
    with PluginCounters(tmp_path / "c") as counters:
        snapshot = counters.snapshot()
    assert snapshot.exited and snapshot.windows[0].accepted


# -- counting without booting Linux (firmware only, a few seconds) -----------------------


@pytest.mark.guest
def test_counts_accesses_in_a_window_published_while_running(plugin: Path, tmp_path: Path) -> None:
    """SeaBIOS runs in a bare q35 machine: publish its low memory as a 'window'
    and the plugin counts its loads and stores there, live and at exit."""
    out, shm = tmp_path / "counters.json", tmp_path / "counters"
    qemu = subprocess.Popen(
        [
            QEMU,
            "-M",
            "q35",
            "-accel",
            "tcg",
            "-display",
            "none",
            "-monitor",
            "none",
            "-serial",
            "none",
            "-plugin",
            f"{plugin},out={out},shm={shm}",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        with PluginCounters(shm) as counters:
            assert counters.qemu_pid == qemu.pid
            assert counters.publish_window(0, 0xA0000) == 0
            before = counters.snapshot()
            time.sleep(1.0)
            delta = counters.snapshot() - before
            with pytest.raises(ValueError, match="overlaps"):
                counters.publish_window(0x1000, 0x1000)
    finally:
        qemu.terminate()
        qemu.wait(timeout=QUICK_TIMEOUT_S)
    assert delta.insns > 0 and delta.mem_accesses > 0
    assert delta.cxl_loads + delta.cxl_stores > 0
    # A live snapshot is not atomic across counters; once QEMU exited they agree exactly.
    report = json.loads(out.read_text())
    window, totals = report["windows"][0], report["totals"]
    assert (window["loads"], window["stores"]) == (totals["cxl_loads"], totals["cxl_stores"])
    assert report["totals"]["cxl_loads"] >= before.cxl_loads + delta.cxl_loads
    assert 0 < report["windows"][0]["lines_touched"] <= 0xA0000 // 64


# -- a real guest with a CXL device ------------------------------------------------------

TOUCH_BYTES = 4 << 20
TOUCH_LINES = TOUCH_BYTES // 64
# Writes one byte per 64-byte line of a fresh 4 MiB buffer, then reads them back
# (standard library only: a short-lived process, cheap to start on the CXL node).
TOUCH_SCRIPT = f"b = bytearray({TOUCH_BYTES})\nb[::64] = b'\\x01' * (len(b) // 64)\nprint(sum(b[::64]))\n"


@dataclass
class PluginGuest:
    platform: Platform
    counters: PluginCounters
    driver: LiveDriver
    trace: Path
    stride: dict[str, object] = field(default_factory=dict)  # what the stride test saw


@pytest.fixture(scope="module")
def plugin_platform(
    default_platform: Platform, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PluginGuest]:
    """The session's guest with its built-in plugin made active and an
    in-process live driver on its ring (what ``Platform.attach`` does with a
    firmware process), recording a trace."""
    trace = tmp_path_factory.mktemp("plugin") / "live.trace"
    platform = default_platform
    counters = platform.plugin_counters()
    controller = Controller.from_profile(
        load_profile(DESIGN, {"device.capacity_bytes": platform.devices[0].size_bytes}), timebase="compute"
    )
    # The firmware attaches before the plugin activates: no request is dropped.
    ring = platform.plugin_files().ring
    with LiveDriver(ring, controller, record=trace, metadata={"design": DESIGN}) as driver:
        counters.set_mode(True)
        try:
            yield PluginGuest(platform, counters, driver, trace)
        finally:
            counters.set_mode(False)


def _touch(platform: Platform, node: int) -> None:
    _, stdout, _ = platform.guest().run(
        ["numactl", f"--membind={node}", "python3", "-c", TOUCH_SCRIPT], check=True
    )
    assert int(stdout) == TOUCH_LINES


@pytest.mark.guest
def test_window_is_the_guests_region_inside_qemus_cxl_window(plugin_platform: PluginGuest) -> None:
    platform, counters = plugin_platform.platform, plugin_platform.counters
    device = platform.devices[0]
    window = counters.snapshot().windows[0]
    assert (window.base, window.size, window.accepted) == (device.hpa_base, device.size_bytes, True)
    assert window.dpa_base == device.dpa_base
    # QEMU's own memory map: the region lies in a CXL fixed memory window.
    mtree = platform.qmp.cmd("human-monitor-command", **{"command-line": "info mtree -f"})
    assert isinstance(mtree, str)
    found = re.findall(r"([0-9a-f]{16})-([0-9a-f]{16}) \(prio \d+, i/o\): cxl-fixed-memory-region", mtree)
    spans = [(int(lo, 16), int(hi, 16)) for lo, hi in found]
    last = device.hpa_base + device.size_bytes - 1
    assert any(lo <= device.hpa_base and last <= hi for lo, hi in spans), mtree


@pytest.mark.guest
def test_plugin_counts_the_guests_cxl_stores(plugin_platform: PluginGuest) -> None:
    platform, counters = plugin_platform.platform, plugin_platform.counters
    before = counters.snapshot()
    _touch(platform, platform.devices[0].node)
    after = counters.snapshot()
    delta = after - before
    print(f"CXL node: {delta}")
    assert delta.insns > 1_000_000
    assert delta.cxl_stores >= TOUCH_LINES and delta.cxl_loads >= TOUCH_LINES
    # Distinct lines ever touched: the session's earlier guest work may have touched
    # these lines already (the same guest), so only the total is bounded.
    assert after.windows[0].lines_touched >= TOUCH_LINES


@pytest.mark.guest
def test_dram_bound_run_adds_almost_no_cxl_accesses(plugin_platform: PluginGuest) -> None:
    platform, counters = plugin_platform.platform, plugin_platform.counters
    before = counters.snapshot()
    _touch(platform, 0)
    delta = counters.snapshot() - before
    print(f"DRAM node: {delta}")
    assert delta.insns > 1_000_000 and delta.mem_accesses > TOUCH_LINES
    assert delta.cxl_loads + delta.cxl_stores < TOUCH_LINES // 100


# Runs IN THE GUEST (python3 -c STRIDE_SCRIPT PAGES FLUSH_BYTES NODE), itself on node 0:
# maps PAGES pages bound to NODE (mbind, MPOL_BIND), dirties every line of them,
# flushes the LLC of them by writing one byte per line of FLUSH_BYTES on node 0,
# prints the pages' physical addresses (from /proc/self/pagemap), waits for a
# line on stdin, reads one byte of every line of the pages and prints the sum
# (one per line), then waits for stdin to close.
STRIDE_SCRIPT = r"""
import ctypes
import json
import mmap
import struct
import sys

PAGE, LINE = 4096, 64
SYS_MBIND, MPOL_BIND = 237, 2
pages, flush_bytes, node = (int(a) for a in sys.argv[1:4])
size = pages * PAGE
buf = mmap.mmap(-1, size)
base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
nodemask = ctypes.c_ulong(1 << node)
rc = libc.syscall(
    ctypes.c_long(SYS_MBIND), ctypes.c_void_p(base), ctypes.c_ulong(size), ctypes.c_long(MPOL_BIND),
    ctypes.byref(nodemask), ctypes.c_ulong(64), ctypes.c_ulong(0),
)
assert rc == 0, f"mbind failed: errno {ctypes.get_errno()}"
buf[::LINE] = b"\x01" * (size // LINE)  # faults the pages in on NODE, dirties every line
physical = []
with open("/proc/self/pagemap", "rb") as pagemap:
    for page in range(pages):
        pagemap.seek((base // PAGE + page) * 8)
        (entry,) = struct.unpack("<Q", pagemap.read(8))
        assert entry >> 63, "page not present"
        physical.append((entry & ((1 << 55) - 1)) * PAGE)
flush = bytearray(flush_bytes)
flush[::LINE] = b"\x02" * (flush_bytes // LINE)
print(json.dumps(physical), flush=True)
sys.stdin.readline()
print(sum(buf[::LINE]), flush=True)
sys.stdin.read()
"""

STRIDE_PAGES = 64
STRIDE_LINES = STRIDE_PAGES * 64
FLUSH_BYTES = 32 << 20  # 16x the default 2 MiB LLC


@pytest.mark.guest
def test_stride_after_llc_flush_gives_exactly_one_device_read_per_line(
    plugin_platform: PluginGuest,
) -> None:
    """A process on node 0 maps N lines on the CXL node (mbind), dirties them,
    flushes the LLC by writing a buffer 16x its size on node 0, then (between
    two host snapshots) reads one byte of each line: exactly N device reads,
    no writes, at exactly those lines' DPAs, all served by the live firmware."""
    guest, counters, driver = plugin_platform.platform, plugin_platform.counters, plugin_platform.driver
    device = guest.devices[0]
    channel = guest.guest().open_process(
        ["python3", "-c", STRIDE_SCRIPT, str(STRIDE_PAGES), str(FLUSH_BYTES), str(device.node)]
    )
    try:
        lines = channel.makefile("r")
        ready = lines.readline()
        assert ready, channel.makefile_stderr("r").read()
        physical = json.loads(ready)
        served_before = driver.wait_drained()
        model_before = driver.controller.counter_dict()["model"]
        before = counters.snapshot()
        channel.sendall(b"go\n")
        assert lines.readline().strip() == str(STRIDE_LINES)  # the guest's checksum: one 1 per line
        after = counters.snapshot()
        served_after = driver.wait_drained()
        model_after = driver.controller.counter_dict()["model"]
    finally:
        channel.close()
    delta = after - before
    print(f"stride: {delta}")
    assert delta.total("device_reads") == STRIDE_LINES
    assert delta.total("device_writes") == 0 and delta.total("device_dropped") == 0
    assert delta.total("llc_misses_cxl") == STRIDE_LINES and delta.cxl_loads >= STRIDE_LINES
    assert served_after - served_before == STRIDE_LINES
    assert model_after["reads"] - model_before["reads"] == STRIDE_LINES
    assert model_after["writes"] == model_before["writes"]
    expected = sorted(device.backing_offset(page + 64 * k) for page in physical for k in range(64))
    plugin_platform.stride.update(first=served_before, expected=expected)


@pytest.mark.guest
def test_replaying_the_live_trace_gives_the_live_counters(plugin_platform: PluginGuest) -> None:
    """Stop the live firmware (it drains the ring and closes the trace); replay
    the trace under the same design: same counters. The stride's requests are
    in the trace where the live driver served them."""
    driver = plugin_platform.driver
    driver.stop()
    stats = driver.stats()
    dropped = plugin_platform.counters.snapshot().total("device_dropped")
    print(f"live driver: {stats}; {dropped} requests dropped")
    live_counters = driver.server.device_counters()
    capacity = plugin_platform.platform.devices[0].size_bytes
    result = replay_file(plugin_platform.trace, load_profile(DESIGN, {"device.capacity_bytes": capacity}))
    assert result["counters"] == live_counters
    records = TraceReader(plugin_platform.trace).read_all()
    assert records.shape[0] == stats["requests"] == live_counters["model"]["requests"]
    if plugin_platform.stride:
        first = int(plugin_platform.stride["first"])  # type: ignore[call-overload]
        window = records[first : first + STRIDE_LINES]
        assert (window["op"] == Op.READ).all()
        assert sorted(int(a) for a in window["addr"]) == plugin_platform.stride["expected"]

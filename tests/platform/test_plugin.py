"""The TCG plugin: its cached build, its strict arguments, and (booting real
guests) that it sees the guest's loads and stores to the CXL device."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cxlssd.errors import PrerequisiteError
from cxlssd.paths import runtime_root
from cxlssd.platform.config import load_config
from cxlssd.platform.machine import Platform
from cxlssd.platform.plugin import build
from cxlssd.platform.plugin.build import ensure_plugin
from cxlssd.platform.plugin.counters import PluginCounters

QEMU = "qemu-system-x86_64"
QUICK_TIMEOUT_S = 60


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
    ],
)
def test_bad_arguments_stop_qemu_with_the_plugins_message(plugin: Path, args: str, message: str) -> None:
    result = _qemu_none(f"{plugin},{args}")
    assert result.returncode != 0
    assert "cxlssd plugin: bad argument" in result.stderr and message in result.stderr, result.stderr
    assert "Could not load plugin" in result.stderr


def test_existing_shm_file_is_refused(plugin: Path, tmp_path: Path) -> None:
    taken = tmp_path / "counters"
    taken.write_bytes(b"someone else's")
    result = _qemu_none(f"{plugin},shm={taken}")
    assert result.returncode != 0 and f"cannot create shm file {taken}" in result.stderr
    assert taken.read_bytes() == b"someone else's"


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
    assert delta.windows[0].loads == delta.cxl_loads and delta.windows[0].stores == delta.cxl_stores
    report = json.loads(out.read_text())
    assert report["totals"]["cxl_loads"] >= before.cxl_loads + delta.cxl_loads
    assert 0 < report["windows"][0]["lines_touched"] <= 0xA0000 // 64


# -- a real guest with a CXL device ------------------------------------------------------

TOUCH_BYTES = 4 << 20
TOUCH_LINES = TOUCH_BYTES // 64
# Writes one byte per 64-byte line of a fresh 4 MiB buffer, then reads them back
# (standard library only: a short-lived process, cheap to start on the CXL node).
TOUCH_SCRIPT = f"b = bytearray({TOUCH_BYTES})\nb[::64] = b'\\x01' * (len(b) // 64)\nprint(sum(b[::64]))\n"


def counters_path(platform: Platform) -> Path:
    """The counters file inside the instance's private runtime dir (named before launch)."""
    return runtime_root() / platform.name / "plugin.counters"


PluginGuest = tuple[Platform, PluginCounters, Path]


def _live_instances(config: pytest.Config) -> set[str]:
    """conftest's set of instances the per-test leak check allows (module-scoped guests)."""
    for registered in config.pluginmanager.get_plugins():
        live = getattr(registered, "_live_instances", None)
        if isinstance(live, set):
            return live
    raise AssertionError("tests/conftest.py has no _live_instances")


@pytest.fixture(scope="module")
def plugin_platform(
    plugin: Path, tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[PluginGuest]:
    out = tmp_path_factory.mktemp("plugin") / "counters.json"
    platform = Platform(load_config())
    shm = counters_path(platform)
    platform.extra_qemu_args = ["-plugin", f"{plugin},out={out},shm={shm}"]
    live = _live_instances(pytestconfig)
    live.add(platform.name)
    try:
        with platform, PluginCounters(shm) as counters:
            device = platform.devices[0]
            counters.publish_window(device.hpa_base, device.size_bytes)
            print(f"boot with the plugin: {platform.boot_seconds:.0f} s")
            yield platform, counters, out
    finally:
        live.discard(platform.name)
    # Shut down: the plugin wrote its JSON at exit.
    assert json.loads(out.read_text())["windows"][0]["base"] == device.hpa_base


def _touch(platform: Platform, node: int) -> None:
    _, stdout, _ = platform.guest().run(
        ["numactl", f"--membind={node}", "python3", "-c", TOUCH_SCRIPT], check=True
    )
    assert int(stdout) == TOUCH_LINES


@pytest.mark.guest
def test_window_is_the_guests_region_inside_qemus_cxl_window(plugin_platform: PluginGuest) -> None:
    platform, counters, _ = plugin_platform
    device = platform.devices[0]
    window = counters.snapshot().windows[0]
    assert (window.base, window.size, window.accepted) == (device.hpa_base, device.size_bytes, True)
    # QEMU's own memory map: the region lies in a CXL fixed memory window.
    mtree = platform.qmp.cmd("human-monitor-command", **{"command-line": "info mtree -f"})
    assert isinstance(mtree, str)
    found = re.findall(r"([0-9a-f]{16})-([0-9a-f]{16}) \(prio \d+, i/o\): cxl-fixed-memory-region", mtree)
    spans = [(int(lo, 16), int(hi, 16)) for lo, hi in found]
    last = device.hpa_base + device.size_bytes - 1
    assert any(lo <= device.hpa_base and last <= hi for lo, hi in spans), mtree


@pytest.mark.guest
def test_plugin_counts_the_guests_cxl_stores(plugin_platform: PluginGuest) -> None:
    platform, counters, _ = plugin_platform
    before = counters.snapshot()
    _touch(platform, platform.devices[0].node)
    delta = counters.snapshot() - before
    print(f"CXL node: {delta}")
    assert delta.insns > 1_000_000
    assert delta.cxl_stores >= TOUCH_LINES and delta.cxl_loads >= TOUCH_LINES
    assert delta.windows[0].lines_touched >= TOUCH_LINES


@pytest.mark.guest
def test_dram_bound_run_adds_almost_no_cxl_accesses(plugin_platform: PluginGuest) -> None:
    platform, counters, _ = plugin_platform
    before = counters.snapshot()
    _touch(platform, 0)
    delta = counters.snapshot() - before
    print(f"DRAM node: {delta}")
    assert delta.insns > 1_000_000 and delta.mem_accesses > TOUCH_LINES
    assert delta.cxl_loads + delta.cxl_stores < TOUCH_LINES // 100

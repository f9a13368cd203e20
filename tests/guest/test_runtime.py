"""The guest runtime, without a guest: its cached build, the marker bytes in what it
builds, the chase program and the Python wrapper run on the host (where a marker is
a plain NOP), and the install into a guest through a fake SFTP server."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cxlssd.errors import PrerequisiteError
from cxlssd.firmware.request import MarkerCmd
from cxlssd.guest.runtime import build, cxlssd_guest
from cxlssd.guest.runtime.build import ensure_runtime
from cxlssd.guest.runtime.install import GUEST_RUNTIME_DIR, guest_env, install_runtime, with_guest_env
from cxlssd.platform.ssh import GuestSSH, InstanceKeys

RUN_TIMEOUT_S = 60


def marker(cmd: int, roi_id: int) -> bytes:
    """The 8 bytes of a marker: nopl disp32(%rax,%rax,1) with the command and id in disp32."""
    return b"\x0f\x1f\x84\x00" + struct.pack("<I", 0xC5000000 | cmd << 16 | roi_id)


@pytest.fixture(scope="module")
def runtime() -> Path:
    return ensure_runtime()


@pytest.fixture
def sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the runtime's sources (and the workloads', the programs of host_os/
    and the protocol header next to them), built into a private cache."""
    monkeypatch.setenv("CXLSSD_CACHE", str(tmp_path / "cache"))
    copy = tmp_path / "guest" / "runtime"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(build.SOURCE_DIR, copy, ignore=ignore)
    shutil.copytree(build.SOURCE_DIR / build.WORKLOAD_SOURCES, copy / build.WORKLOAD_SOURCES, ignore=ignore)
    # the programs of host_os/ and the helper's interface the daemon includes
    for source in (build.PROMOTER_SOURCE, build.PROMOTER_HEADER, build.SKIDPROBE_SOURCE):
        (copy / source).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(build.SOURCE_DIR / source, copy / source)
    (copy / build.ABI_HEADER).parent.mkdir()
    shutil.copyfile(build.SOURCE_DIR / build.ABI_HEADER, copy / build.ABI_HEADER)
    monkeypatch.setattr(build, "SOURCE_DIR", copy)
    return copy


# -- build ---------------------------------------------------------------------------


def test_build_is_cached_and_rebuilt_on_source_change(sources: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = ensure_runtime()
    assert first.parent == Path(os.environ["CXLSSD_CACHE"]) / "guest-runtime"
    for name, mode in [
        ("bin/chase", 0o755),
        ("lib/libcxlssd.so", 0o755),
        ("python/cxlssd_guest.py", 0o644),
        ("include/cxlssd.h", 0o644),
        ("include/cxlssd_abi.h", 0o644),
    ]:
        assert stat.S_IMODE((first / name).stat().st_mode) == mode, name
    built_at = (first / "bin/chase").stat().st_mtime_ns

    def no_compiler(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cached runtime was rebuilt")

    with monkeypatch.context() as patched:
        patched.setattr(subprocess, "run", no_compiler)
        assert ensure_runtime() == first
    assert (first / "bin/chase").stat().st_mtime_ns == built_at

    # A changed source is a different runtime, built next to the first.
    with (sources / "chase.c").open("a") as chase:
        chase.write("/* changed */\n")
    second = ensure_runtime()
    assert second != first and (second / "bin/chase").is_file() and (first / "bin/chase").is_file()
    # No staging directories are left behind.
    assert sorted(p.name for p in first.parent.iterdir()) == sorted([first.name, second.name])


def test_runtime_key_covers_the_workload_sources(sources: Path) -> None:
    key = build.runtime_key()
    for name in ("common.h", "radix.c"):
        with (sources / build.WORKLOAD_SOURCES / name).open("a") as source:
            source.write("/* changed */\n")
        assert build.runtime_key() != key
        key = build.runtime_key()


def test_compile_error_names_the_compilers_message(sources: Path) -> None:
    (sources / "chase.c").write_text("int main(void) { return undeclared_thing; }\n")
    with pytest.raises(PrerequisiteError, match=r"(?s)building the guest runtime failed.*undeclared_thing"):
        ensure_runtime()
    assert list((Path(os.environ["CXLSSD_CACHE"]) / "guest-runtime").iterdir()) == []


def test_missing_compiler_is_a_prerequisite_error(sources: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXLSSD_CC", "no-such-cc-cxlssd")
    with pytest.raises(PrerequisiteError, match=r"no-such-cc-cxlssd.*not found"):
        ensure_runtime()


# -- marker bytes --------------------------------------------------------------------


def test_chase_contains_its_roi_markers(runtime: Path) -> None:
    code = (runtime / "bin/chase").read_bytes()
    # chase marks its ROI through the compiled-in runtime functions: all ids are there.
    for roi_id in (0, 1, 255):
        assert code.count(marker(MarkerCmd.ROI_BEGIN, roi_id)) == 1
        assert code.count(marker(MarkerCmd.ROI_END, roi_id)) == 1


def test_library_has_one_marker_per_runtime_id(runtime: Path) -> None:
    code = (runtime / "lib/libcxlssd.so").read_bytes()
    for roi_id in (0, 1, 128, 255):
        assert code.count(marker(MarkerCmd.ROI_BEGIN, roi_id)) == 1
        assert code.count(marker(MarkerCmd.ROI_END, roi_id)) == 1
    assert marker(MarkerCmd.ROI_BEGIN, 256) not in code and marker(MarkerCmd.ROI_END, 256) not in code
    assert code.count(b"\x0f\x1f\x84\x00") >= 2 * cxlssd_guest.RUNTIME_IDS


CLOCK_MONOTONIC_COARSE = 6  # Linux's clockid (Python's time module does not name it)


def test_an_roi_begins_right_after_a_timer_tick(runtime: Path) -> None:
    """cxlssd_roi_begin waits for the kernel's next tick (the coarse clock moves only
    then), so that under -icount an ROI's ticks fall at the same instructions in every
    run. On this host too: right after it, the coarse clock lags the fine one by about
    the same time, most times (at a random phase the lag spreads over a whole period, and
    about 1 in 8 would be within an eighth of one of the least)."""
    library = ctypes.CDLL(str(runtime / "lib/libcxlssd.so"))
    library.cxlssd_roi_begin.argtypes, library.cxlssd_roi_begin.restype = [ctypes.c_uint], ctypes.c_int
    tick_ns = time.clock_getres(CLOCK_MONOTONIC_COARSE) * 1e9
    lag_ns = []
    for _ in range(20):
        assert library.cxlssd_roi_begin(1) == 0
        fine_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        lag_ns.append(fine_ns - time.clock_gettime_ns(CLOCK_MONOTONIC_COARSE))
    near_least = sum(lag - min(lag_ns) < tick_ns / 8 for lag in lag_ns)
    assert near_least >= len(lag_ns) / 2, (tick_ns, sorted(lag_ns))


def test_library_functions_reject_ids_above_255(runtime: Path) -> None:
    library = ctypes.CDLL(str(runtime / "lib/libcxlssd.so"), use_errno=True)
    for name in ("cxlssd_roi_begin", "cxlssd_roi_end"):
        function = getattr(library, name)
        function.argtypes, function.restype = [ctypes.c_uint], ctypes.c_int
        assert function(0) == 0 and function(255) == 0
        ctypes.set_errno(0)
        assert function(256) == -1 and ctypes.get_errno() == errno.EINVAL


def test_constant_id_macros_emit_the_marker(runtime: Path, tmp_path: Path) -> None:
    program = tmp_path / "marked.c"
    program.write_text(
        '#include "cxlssd.h"\nint main(void) { CXLSSD_ROI_BEGIN(65535); CXLSSD_ROI_END(0x1234); return 0; }\n'
    )
    binary = tmp_path / "marked"
    argv = [
        build.compiler_name(),
        "-O2",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-I",
        str(runtime / "include"),
        "-o",
        str(binary),
    ]
    subprocess.run([*argv, str(program)], check=True, timeout=RUN_TIMEOUT_S)
    code = binary.read_bytes()
    assert marker(MarkerCmd.ROI_BEGIN, 65535) in code and marker(MarkerCmd.ROI_END, 0x1234) in code
    assert subprocess.run([str(binary)], timeout=RUN_TIMEOUT_S).returncode == 0

    program.write_text('#include "cxlssd.h"\nint main(void) { CXLSSD_ROI_BEGIN(65536); return 0; }\n')
    failed = subprocess.run([*argv, str(program)], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert failed.returncode != 0 and "must be a constant 0..65535" in failed.stderr


# -- chase on the host ---------------------------------------------------------------


def run_chase(runtime: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(runtime / "bin/chase"), *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )


@pytest.mark.parametrize(
    ("args", "slots", "stride_bytes"),
    [
        (["--bytes", "256K"], 4096, 64),
        (["--bytes", "4M", "--stride", "4096"], 1024, 4096),
        (["--bytes", "4M", "--stride", "4K", "--write", "--warm", "0"], 1024, 4096),
        (["--bytes", "100000", "--stride", "192", "--warm", "3", "--roi", "255"], 520, 192),
    ],
)
def test_chase_full_pass_visits_every_slot(
    runtime: Path, args: list[str], slots: int, stride_bytes: int
) -> None:
    result = run_chase(runtime, *args)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["cycle_ok"] is True and report["chase_ok"] is True
    assert report["slots"] == slots and report["steps"] == slots
    assert report["stride_bytes"] == stride_bytes and report["bytes"] == slots * stride_bytes
    assert report["write"] is ("--write" in args)
    # One full pass visits each slot once: the checksum is the sum of all slot offsets.
    assert report["checksum"] == stride_bytes * slots * (slots - 1) // 2


def test_chase_partial_and_repeated_passes_depend_on_the_seed(runtime: Path) -> None:
    reports = {}
    for seed in ("1", "2"):
        for write in ([], ["--write"]):
            result = run_chase(runtime, "--bytes", "64K", "--steps", "2500", "--seed", seed, *write)
            assert result.returncode == 0, result.stderr
            report = json.loads(result.stdout)
            assert report["chase_ok"] is True and report["steps"] == 2500 and report["seed"] == int(seed)
            reports[seed, bool(write)] = report["checksum"]
    assert reports["1", False] == reports["1", True]  # --write stores but follows the same cycle
    assert reports["1", False] != reports["2", False]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--bytes is required"),
        (["--bytes"], "--bytes needs a value"),
        (["--bytes", "12X"], "'12X' is not a valid size"),
        (["--bytes", "-5"], "'-5' is not a valid size"),
        (["--bytes", "99999999999G"], "not a valid size"),
        (["--bytes", "1M", "--stride", "100"], "--stride must be a positive multiple of 64"),
        (["--bytes", "1M", "--stride", "0"], "--stride must be a positive multiple of 64"),
        (["--bytes", "32"], "--bytes must be at least one --stride"),
        (["--bytes", "1M", "--roi", "256"], "the id must be 0..255"),
        (["--bytes", "1M", "--steps", "1K"], "'1K' is not a valid count"),
        (["--bytes", "1M", "--colour"], "unknown option --colour"),
        (["--bytes", "1M", "extra"], "unexpected argument 'extra'"),
    ],
)
def test_chase_bad_arguments_exit_2_with_usage(runtime: Path, args: list[str], message: str) -> None:
    result = run_chase(runtime, *args)
    assert result.returncode == 2
    assert message in result.stderr and "usage: chase --bytes" in result.stderr
    assert result.stdout == ""


# -- the Python wrapper --------------------------------------------------------------


@pytest.fixture
def wrapper_library(runtime: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wrapper, loading the built library afresh through CXLSSD_LIB."""
    monkeypatch.setenv("CXLSSD_LIB", str(runtime / "lib/libcxlssd.so"))
    monkeypatch.setattr(cxlssd_guest, "_library", None)


@pytest.mark.usefixtures("wrapper_library")
def test_wrapper_marks_rois() -> None:
    cxlssd_guest.roi_begin(0)
    cxlssd_guest.roi_end(0)
    with cxlssd_guest.roi(255):
        pass
    with pytest.raises(RuntimeError, match="inside"), cxlssd_guest.roi(7):
        raise RuntimeError("inside")


@pytest.mark.usefixtures("wrapper_library")
@pytest.mark.parametrize("bad_id", [256, -1, 1.0, True, "1"])
def test_wrapper_rejects_ids_outside_0_255(bad_id: object) -> None:
    for mark in (cxlssd_guest.roi_begin, cxlssd_guest.roi_end):
        with pytest.raises(ValueError, match=r"0\.\.255"):
            mark(bad_id)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"0\.\.255"), cxlssd_guest.roi(bad_id):  # type: ignore[arg-type]
        pass


def test_wrapper_names_a_missing_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cxlssd_guest, "_library", None)
    monkeypatch.setenv("CXLSSD_LIB", str(tmp_path / "nowhere.so"))
    with pytest.raises(cxlssd_guest.LibraryError, match=r"nowhere\.so.*CXLSSD_LIB"):
        cxlssd_guest.roi_begin(1)
    (tmp_path / "nowhere.so").write_text("not a library")
    with pytest.raises(cxlssd_guest.LibraryError, match="cannot load"):
        cxlssd_guest.load()


def test_wrapper_finds_the_library_in_the_installed_layout(runtime: Path) -> None:
    """As in the guest: the wrapper imported from python/, the library from ../lib."""
    script = "import cxlssd_guest\nwith cxlssd_guest.roi(3):\n    pass\nprint(cxlssd_guest.library_path())\n"
    env = {k: v for k, v in os.environ.items() if k != "CXLSSD_LIB"}
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env={**env, "PYTHONPATH": str(runtime / "python")},
    )
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == runtime / "lib/libcxlssd.so"


# -- install -------------------------------------------------------------------------


class LocalSFTP:
    """The part of paramiko's SFTPClient that put_tree uses, on a local directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.closed = False

    def _local(self, remote: str) -> Path:
        assert remote.startswith("/"), remote
        return self.root / remote.lstrip("/")

    def stat(self, remote: str) -> os.stat_result:
        return self._local(remote).stat()

    def mkdir(self, remote: str, mode: int = 0o777) -> None:
        self._local(remote).mkdir(mode)

    def chmod(self, remote: str, mode: int) -> None:
        self._local(remote).chmod(mode)

    def put(self, local: str, remote: str) -> None:
        shutil.copyfile(local, self._local(remote))

    def posix_rename(self, old: str, new: str) -> None:
        os.replace(self._local(old), self._local(new))

    def remove(self, remote: str) -> None:
        self._local(remote).unlink()

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_guest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[GuestSSH, LocalSFTP]:
    """A GuestSSH whose connection is up and whose SFTP server writes below tmp_path/guest."""
    keys_dir = tmp_path / "keys"
    keys_dir.mkdir()
    guest = GuestSSH(port=22, keys=InstanceKeys.generate(keys_dir))
    sftp = LocalSFTP(tmp_path / "guest")
    sftp.root.mkdir()

    class Transport:
        def is_active(self) -> bool:
            return True

    monkeypatch.setattr(guest._client, "get_transport", Transport)
    monkeypatch.setattr(guest._client, "open_sftp", lambda: sftp)
    return guest, sftp


def test_install_copies_the_tree_with_its_modes(
    runtime: Path, fake_guest: tuple[GuestSSH, LocalSFTP]
) -> None:
    guest, sftp = fake_guest
    installed = sftp.root / GUEST_RUNTIME_DIR.lstrip("/")
    for _ in range(2):  # installing again replaces the files
        install_runtime(guest, runtime)
        assert sftp.closed
        files = sorted(str(p.relative_to(installed)) for p in installed.rglob("*") if p.is_file())
        workloads = [f"bin/{name}" for name in build.WORKLOADS]
        assert files == sorted(
            ["bin/chase", "bin/cxlssd-promote", "bin/shapes", "bin/skidprobe", *workloads, "include/cxlssd.h",
             "include/cxlssd_abi.h", "lib/libcxlssd.so", "python/cxlssd_guest.py", "python/netkv.py"]
        )
        for name in files:
            assert (installed / name).read_bytes() == (runtime / name).read_bytes()
            mode = stat.S_IMODE((installed / name).stat().st_mode)
            assert mode == (0o755 if name.startswith(("bin/", "lib/")) else 0o644), name
        assert stat.S_IMODE(installed.stat().st_mode) == 0o755


def test_install_refuses_an_incomplete_tree(tmp_path: Path, fake_guest: tuple[GuestSSH, LocalSFTP]) -> None:
    (tmp_path / "tree" / "bin").mkdir(parents=True)
    with pytest.raises(PrerequisiteError, match=r"not a built guest runtime \(missing lib/libcxlssd.so"):
        install_runtime(fake_guest[0], tmp_path / "tree")


def test_guest_env_points_at_the_installed_runtime() -> None:
    env = guest_env()
    assert env["PATH"].split(":")[0] == "/opt/cxlssd/bin" and "/usr/bin" in env["PATH"].split(":")
    assert env["PYTHONPATH"] == "/opt/cxlssd/python"
    assert env["CXLSSD_LIB"] == "/opt/cxlssd/lib/libcxlssd.so"
    assert with_guest_env(["chase", "--bytes", "1M"]) == [
        "env",
        "PATH=/opt/cxlssd/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONPATH=/opt/cxlssd/python",
        "CXLSSD_LIB=/opt/cxlssd/lib/libcxlssd.so",
        "chase",
        "--bytes",
        "1M",
    ]

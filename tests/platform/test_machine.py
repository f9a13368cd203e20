"""Platform lifecycle pieces that need no guest: the trusted runtime root, stale-instance
reaping with process identity, address maps."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cxlssd.cli import main
from cxlssd.errors import PrerequisiteError
from cxlssd.lifecycle import LockHeld, ProcessId, exclusive_lock
from cxlssd.paths import runtime_root
from cxlssd.platform.machine import CxlDevice, reap_dead_sessions, reap_stale_instances


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


@pytest.fixture
def orphan() -> Iterator[subprocess.Popen[bytes]]:
    """A process standing in for an orphaned QEMU."""
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


@pytest.fixture
def scratch_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where CXLSSD_RUNTIME points in the test (not created yet)."""
    root = tmp_path / "runtime"
    monkeypatch.setenv("CXLSSD_RUNTIME", str(root))
    return root


def _instance(root: Path, name: str, owner: ProcessId | None, qemu: ProcessId | None = None) -> Path:
    rundir = root / name
    rundir.mkdir(mode=0o700)
    if owner is not None:
        owner.write(rundir / "owner.pid")
    if qemu is not None:
        qemu.write(rundir / "qemu.pid")
    (rundir / "cxl0.raw").write_bytes(b"\0" * 4096)
    return rundir


def test_reaps_instances_whose_owner_died_and_kills_their_qemu(
    scratch_root: Path, orphan: subprocess.Popen[bytes]
) -> None:
    root = runtime_root()
    assert oct(root.stat().st_mode & 0o777) == "0o700"
    stale = _instance(root, "stale-000000", ProcessId(_dead_pid(), 1), ProcessId.of_child(orphan))
    alive = _instance(root, "alive-000000", ProcessId.of_self())
    assert reap_stale_instances() == ["stale-000000"]
    assert not stale.exists() and alive.exists()
    assert orphan.wait(timeout=10) == -9


def test_a_dead_owners_pid_reused_by_a_live_process_is_not_its_owner(scratch_root: Path) -> None:
    """owner.pid names this process's pid with another start time: the owner is gone."""
    me = ProcessId.of_self()
    _instance(runtime_root(), "reused-000000", ProcessId(me.pid, me.start_ticks + 1))
    assert reap_stale_instances() == ["reused-000000"]


def test_the_reaper_never_kills_a_process_that_reused_qemus_pid(
    scratch_root: Path, orphan: subprocess.Popen[bytes]
) -> None:
    recorded = ProcessId.of_child(orphan)
    _instance(runtime_root(), "stale-000000", ProcessId(_dead_pid(), 1),
              ProcessId(recorded.pid, recorded.start_ticks - 1))
    assert reap_stale_instances() == ["stale-000000"]
    assert orphan.poll() is None


def test_the_reaper_leaves_what_carries_no_instance_record_of_ours(
    scratch_root: Path, tmp_path: Path, orphan: subprocess.Popen[bytes]
) -> None:
    root = runtime_root()
    foreign = _instance(root, "foreign-000000", None)  # no owner.pid
    (foreign / "qemu.pid").write_text(ProcessId.of_child(orphan).text())
    garbled = _instance(root, "garbled-000000", None)
    (garbled / "owner.pid").write_text(str(_dead_pid()))  # a bare pid: not our record
    target = tmp_path / "home"
    target.mkdir(mode=0o755)
    (target / "keep").write_text("precious")
    (root / "planted-000000").symlink_to(target)
    assert reap_stale_instances() == []
    assert foreign.exists() and garbled.exists() and (target / "keep").exists()
    assert orphan.poll() is None


def test_the_root_of_a_killed_session_is_reaped_and_no_other(tmp_path: Path) -> None:
    """reap_dead_sessions: a root named after a dead process goes with its stale
    instances; the roots of live sessions, foreign ones and symlinks stay."""
    dead_pid = _dead_pid()
    dead = tmp_path / f"sess-{dead_pid}"
    dead.mkdir(mode=0o700)
    _instance(dead, "stale-000000", ProcessId(dead_pid, 1))
    alive = tmp_path / f"sess-{os.getpid()}"
    alive.mkdir(mode=0o700)
    _instance(alive, "mine-000000", ProcessId.of_self())
    open_root = tmp_path / f"sess-{_dead_pid()}"
    open_root.mkdir(mode=0o755)  # not private: not ours to act on
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (target / "keep").write_text("precious")
    (tmp_path / f"sess-{_dead_pid()}").symlink_to(target)
    assert reap_dead_sessions(tmp_path, "sess-") == [dead.name]
    assert not dead.exists() and (alive / "mine-000000").exists()
    assert open_root.is_dir() and (target / "keep").exists()


def test_runtime_root_is_created_private(scratch_root: Path) -> None:
    assert runtime_root() == scratch_root
    assert scratch_root.stat().st_mode & 0o777 == 0o700
    assert runtime_root() == scratch_root  # and trusted when it exists


def _refused(match: str) -> None:
    with pytest.raises(PrerequisiteError, match=match):
        runtime_root()


def test_a_symlinked_runtime_root_is_refused_and_its_target_untouched(
    scratch_root: Path, tmp_path: Path
) -> None:
    target = tmp_path / "home"
    (target / "user").mkdir(parents=True, mode=0o755)
    target.chmod(0o755)
    scratch_root.symlink_to(target)
    _refused("is a symlink: refusing to use it")
    assert target.stat().st_mode & 0o777 == 0o755 and (target / "user").is_dir()


def test_an_open_or_foreign_or_odd_runtime_root_is_refused(scratch_root: Path, tmp_path: Path) -> None:
    scratch_root.write_text("")
    _refused("is not a directory")
    scratch_root.unlink()
    scratch_root.mkdir(mode=0o700)
    scratch_root.chmod(0o755)
    _refused("has mode 0755 \\(group or other access\\)")
    assert scratch_root.stat().st_mode & 0o777 == 0o755  # refused, not repaired
    scratch_root.chmod(0o700)
    if os.geteuid() == 0:
        os.chown(scratch_root, 65534, 65534)
        _refused("is owned by uid 65534, not by this user")


def test_a_runtime_root_in_a_shared_non_sticky_directory_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("CXLSSD_RUNTIME", str(shared / "runtime"))
    _refused("can write without the sticky bit")
    shared.chmod(0o1777)
    assert runtime_root() == shared / "runtime"


def test_the_cli_refuses_an_untrusted_runtime_root_in_one_line(
    scratch_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    scratch_root.symlink_to(tmp_path)
    assert main(["inject", "--instance", "x", "poison", "--dpa", "0"]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0] and "is a symlink" in errors[0]


def test_process_identity_survives_pid_reuse() -> None:
    me = ProcessId.of_self()
    assert me.alive() and ProcessId.parse(me.text()) == me
    assert not ProcessId(me.pid, me.start_ticks + 1).alive()
    assert not ProcessId(me.pid, me.start_ticks + 1).kill()  # nothing signalled: we still run
    assert not ProcessId(_dead_pid(), 1).kill()
    for garbage in ("", "123", "0 5", "-1 5", "1 2 3", "x y", "\uff11\uff12 \uff13"):
        assert ProcessId.parse(garbage) is None


def test_backing_offset_is_the_dpa() -> None:
    device = CxlDevice(index=0, memdev="mem0", region="region0", node=1, hpa_base=0x390000000,
                       dpa_base=0, size_bytes=1 << 30, backing_file=Path("/x"))
    assert device.backing_offset(0x390000000 + 0x1234) == 0x1234
    with pytest.raises(ValueError, match="outside region0"):
        device.backing_offset(0x390000000 + (1 << 30))


def test_an_exclusive_lock_names_its_holder_and_dies_with_it(tmp_path: Path) -> None:
    """The lock behind --out and image builds: a second holder is refused (or waits),
    and a killed holder never leaves it stuck."""
    lock = tmp_path / "lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from pathlib import Path\nfrom cxlssd.lifecycle import exclusive_lock\n"
         f"with exclusive_lock(Path({str(lock)!r}), wait=False):\n    print('held', flush=True)\n"
         "    time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(LockHeld) as held, exclusive_lock(lock, wait=False):
            pass
        assert held.value.holder == str(holder.pid)
    finally:
        holder.kill()
        holder.wait()
    with exclusive_lock(lock, wait=False):
        assert lock.read_text() == str(os.getpid())

"""Platform lifecycle pieces that need no guest: stale-instance reaping, address maps."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cxlssd.paths import runtime_root
from cxlssd.platform.machine import CxlDevice, reap_stale_instances


def _dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_reaps_instances_whose_owner_died_and_kills_their_qemu() -> None:
    root = runtime_root()
    assert oct(root.stat().st_mode & 0o777) == "0o700"
    stale, alive = root / "stale-000000", root / "alive-000000"
    orphan = subprocess.Popen(["sleep", "60"])  # stands in for the orphaned QEMU
    try:
        for rundir, owner in ((stale, _dead_pid()), (alive, os.getpid())):
            rundir.mkdir(mode=0o700)
            (rundir / "owner.pid").write_text(str(owner))
        (stale / "qemu.pid").write_text(str(orphan.pid))
        (stale / "cxl0.raw").write_bytes(b"\0" * 4096)
        assert "stale-000000" in reap_stale_instances()
        assert not stale.exists() and alive.exists()
        assert orphan.wait(timeout=10) == -9
    finally:
        orphan.kill()
        subprocess.run(["rm", "-rf", str(stale), str(alive)], check=True)


def test_backing_offset_is_the_dpa() -> None:
    device = CxlDevice(index=0, memdev="mem0", region="region0", node=1, hpa_base=0x390000000,
                       dpa_base=0, size_bytes=1 << 30, backing_file=Path("/x"))
    assert device.backing_offset(0x390000000 + 0x1234) == 0x1234
    with pytest.raises(ValueError, match="outside region0"):
        device.backing_offset(0x390000000 + (1 << 30))

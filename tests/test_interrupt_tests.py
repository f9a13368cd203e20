"""`./cxlssd test` interrupted: pytest must get to clean up (stop its guests, remove its
runtime files in /dev/shm) instead of being killed by the wrapper that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# A child that, like pytest, cleans up when interrupted: it takes a moment, then exits 2.
CHILD = """
import signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def clean_up(signum, frame):
    time.sleep(1.0)
    (out / "cleaned").write_text("yes")
    sys.exit(2)
signal.signal(signal.SIGINT, clean_up)
(out / "ready").write_text("yes")
time.sleep(60)
"""
WRAPPER = ("import sys; from cxlssd.setup_commands import run_to_its_end; "
           "sys.exit(run_to_its_end(sys.argv[1:]))")


def start(tmp_path: Path) -> subprocess.Popen[bytes]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    wrapper = subprocess.Popen([sys.executable, "-c", WRAPPER, sys.executable, str(script), str(tmp_path)],
                               start_new_session=True, env=env)
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists():
        assert time.monotonic() < deadline and wrapper.poll() is None, "the child did not start"
        time.sleep(0.05)
    return wrapper


@pytest.mark.parametrize("how", ["ctrl-c to the process group", "sigterm to the wrapper"])
def test_the_wrapper_waits_for_pytest_to_clean_up(tmp_path: Path, how: str) -> None:
    wrapper = start(tmp_path)
    try:
        if how == "ctrl-c to the process group":
            os.killpg(wrapper.pid, signal.SIGINT)
        else:
            wrapper.send_signal(signal.SIGTERM)
        assert wrapper.wait(timeout=30) == 2  # the child's status, after its clean-up
        assert (tmp_path / "cleaned").read_text() == "yes"
    finally:
        if wrapper.poll() is None:
            os.killpg(wrapper.pid, signal.SIGKILL)
            wrapper.wait()

"""The context-manager half of objects with an explicit lifecycle; process identity, liveness and exit.

QEMU's Python names the pair ``launch()``/``shutdown()``, a file ``open()``/
``close()``, a thread ``start()``/``stop()``: each class keeps its own names and
says which they are by defining ``_begin`` and ``_end``; ``with obj:`` then runs
the pair, and ``_end`` learns whether the block raised (to stop cleanly without
hiding that error behind another).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (also when another user owns it): the liveness
    check behind reaping, the ring's consumer, the plugin's QEMU and injection."""
    try:
        os.kill(pid, 0)
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:
        return False
    return True


def process_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/PID/stat`` field 22),
    or None if there is no such process. A pid can be reused; (pid, start) cannot."""
    try:
        text = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ")".
    fields = text[text.rindex(b")") + 2 :].split()
    return int(fields[19])


@dataclass(frozen=True)
class ProcessId:
    """A process as it can be named across PID reuse: its pid and start time.
    Written as ``"PID START"`` into pid files (``owner.pid``, ``qemu.pid``) and
    records (``firmware.json``); nothing is signalled unless both still match."""

    pid: int
    start_ticks: int

    @classmethod
    def of(cls, pid: int) -> ProcessId | None:
        """The identity of the running process ``pid`` (None if it is gone)."""
        start = process_start_ticks(pid)
        return None if start is None else cls(pid, start)

    @classmethod
    def of_self(cls) -> ProcessId:
        """The identity of this process."""
        found = cls.of(os.getpid())
        assert found is not None
        return found

    @classmethod
    def of_child(cls, process: subprocess.Popen[bytes]) -> ProcessId:
        """The identity of a child process this one has not waited for (until then
        it stays in ``/proc``, even after it exits)."""
        found = cls.of(process.pid)
        assert found is not None, "the child was waited for already"
        return found

    @classmethod
    def parse(cls, text: str) -> ProcessId | None:
        """The identity written by :meth:`text`; None for anything else (a bare pid,
        garbage): such a record names no process this platform may signal."""
        parts = text.split()
        if len(parts) != 2 or not all(part.isascii() and part.isdecimal() for part in parts):
            return None
        pid, start = int(parts[0]), int(parts[1])
        return cls(pid, start) if pid > 0 else None

    @classmethod
    def read(cls, path: Path) -> ProcessId | None:
        """The identity in pid file ``path`` (None if missing, not a regular file or garbled)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            return cls.parse(file.read(64).decode("ascii", errors="replace"))

    def text(self) -> str:
        return f"{self.pid} {self.start_ticks}"

    def write(self, path: Path) -> None:
        path.write_text(self.text())

    def alive(self) -> bool:
        """Whether this very process still runs (not another one with its pid)."""
        return process_start_ticks(self.pid) == self.start_ticks

    def kill(self, signum: int = signal.SIGKILL) -> bool:
        """Send ``signum`` if this very process still runs; whether it was sent. The
        pidfd pins the process between the identity check and the signal."""
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError:
            return False
        try:
            if not self.alive():
                return False
            signal.pidfd_send_signal(pidfd, signum)
            return True
        except ProcessLookupError:
            return False
        finally:
            os.close(pidfd)


class LockHeld(Exception):
    """Another process holds the lock (``holder``: the pid it wrote, or "?")."""

    def __init__(self, holder: str) -> None:
        super().__init__(f"held by pid {holder}")
        self.holder = holder


@contextlib.contextmanager
def exclusive_lock(path: Path, wait: bool) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing, never through a
    symlink) for the block, with this process's pid written in it. If another process
    holds it: wait for it, or (``wait=False``) raise :class:`LockHeld`. The kernel
    releases it when the holder dies, so a killed holder never leaves it stuck."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise LockHeld(os.pread(fd, 32, 0).decode(errors="replace").strip() or "?") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)


def describe_exit(returncode: int) -> str:
    """How a child process ended, from its ``returncode`` ("killed by SIGKILL")."""
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
        return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


class Lifecycle:
    """``with obj:`` = ``obj._begin()`` ... ``obj._end(error)``."""

    def _begin(self) -> None:
        """Start (nothing by default: some objects are ready once constructed)."""

    def _end(self, error: BaseException | None) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._begin()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._end(exc)

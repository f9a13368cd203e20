"""The context-manager half of objects with an explicit lifecycle; process liveness and exit.

QEMU's Python names the pair ``launch()``/``shutdown()``, a file ``open()``/
``close()``, a thread ``start()``/``stop()``: each class keeps its own names and
says which they are by defining ``_begin`` and ``_end``; ``with obj:`` then runs
the pair, and ``_end`` learns whether the block raised (to stop cleanly without
hiding that error behind another).
"""

from __future__ import annotations

import contextlib
import os
import signal
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

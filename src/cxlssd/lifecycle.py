"""The context-manager half of objects with an explicit lifecycle.

QEMU's Python names the pair ``launch()``/``shutdown()``, a file ``open()``/
``close()``, a thread ``start()``/``stop()``: each class keeps its own names and
says which they are by defining ``_begin`` and ``_end``; ``with obj:`` then runs
the pair, and ``_end`` learns whether the block raised (to stop cleanly without
hiding that error behind another).
"""

from __future__ import annotations

from types import TracebackType
from typing import Self


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

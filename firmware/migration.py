"""Page migration policy: when the firmware asks the host to promote a page.

The controller owns the mechanism: a per-page hit counter (SSD-DRAM hits: log or
cache), reset every ``window_accesses`` accesses, and a host DRAM budget. The policy
owns the decisions: the hit count that triggers a promotion (``threshold``), how it
adapts at the end of each window, and which promoted page to demote when the budget
is full. A new policy implements :class:`MigrationPolicy` and registers a factory
taking a :class:`MigrationConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from cxlssd.firmware.registry import Registry


@dataclass(frozen=True)
class MigrationConfig:
    initial_threshold: int = 4
    min_threshold: int = 1
    max_threshold: int = 7
    raise_at_or_below_share: float = 0.25
    lower_at_or_above_share: float = 0.75
    window_accesses: int = 10_000


class MigrationPolicy(Protocol):
    #: a page is promoted on the SSD-DRAM hit that brings its count to this value
    threshold: int
    #: accesses per window (counters reset and ``end_window`` is called after each)
    window_accesses: int

    def end_window(self, accesses: int, promoted_accesses: int) -> None:
        """A window ended: ``promoted_accesses`` of its ``accesses`` hit promoted pages."""
        ...

    def demotion_victim(self, pages: np.ndarray, last_access: np.ndarray) -> int:
        """The promoted page to demote when host DRAM is full.

        ``pages``: promoted pages; ``last_access[i]``: request number of the last
        access to ``pages[i]``."""
        ...


MIGRATION_POLICIES: Registry[MigrationPolicy] = Registry("migration policy", "migration.policy")


@MIGRATION_POLICIES.register("fixed")
class FixedThreshold:
    """Promote at a constant hit count; demote the least recently used page."""

    def __init__(self, config: MigrationConfig) -> None:
        self.threshold = config.initial_threshold
        self.window_accesses = config.window_accesses
        #: (threshold after the window, promoted share of the window) per window
        self.history: list[tuple[int, float]] = []

    def end_window(self, accesses: int, promoted_accesses: int) -> None:
        self.history.append((self.threshold, promoted_accesses / accesses if accesses else 0.0))

    def demotion_victim(self, pages: np.ndarray, last_access: np.ndarray) -> int:
        return int(pages[np.argmin(last_access)])


@MIGRATION_POLICIES.register("adaptive")
class AdaptiveThreshold(FixedThreshold):
    """SkyByte: raise the threshold when promoted pages serve few accesses (promotions
    were not worth it), lower it when they serve most (promote more eagerly)."""

    def __init__(self, config: MigrationConfig) -> None:
        super().__init__(config)
        self.config = config

    def end_window(self, accesses: int, promoted_accesses: int) -> None:
        c = self.config
        share = promoted_accesses / accesses if accesses else 0.0
        if share <= c.raise_at_or_below_share:
            self.threshold = min(self.threshold + 1, c.max_threshold)
        elif share >= c.lower_at_or_above_share:
            self.threshold = max(self.threshold - 1, c.min_threshold)
        self.history.append((self.threshold, share))

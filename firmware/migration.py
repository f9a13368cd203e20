"""Page migration policy: when the firmware asks the host to promote a page.

The controller owns the mechanism: a per-page counter of data-cache hits (SkyByte
counts those only, not log hits), a window of ``window_accesses`` accesses over which
the promoted pages' share of accesses is measured, and a host DRAM budget. The policy
owns the decisions: the hit count that triggers a promotion (``threshold``), how it
adapts (after every counted hit, or at the end of each window), whether a window's
end also resets the per-page counters, and which promoted page to demote when the
budget is full. A new policy implements :class:`MigrationPolicy` and registers a
factory taking a :class:`MigrationConfig`.

Registered: ``skybyte`` (the evaluated rule, the SkyByte designs' default),
``adaptive`` (the same bounds, adapted once per window) and ``fixed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from cxlssd.firmware.registry import Registry


@dataclass(frozen=True)
class MigrationConfig:
    initial_threshold: int = 7
    min_threshold: int = 1
    max_threshold: int = 7
    raise_at_or_below_share: float = 0.25
    lower_at_or_above_share: float = 0.75
    window_accesses: int = 10_000


@dataclass(frozen=True)
class MoveCost:
    """The CPU's part of the moves the guest OS carries out for the firmware's decisions
    (host_os/promoter.c brackets each look at the mailbox for the transfer engine,
    firmware/hints.py): the rest of the daemon's work is the device's, as the promotion
    thread's is in SkyByte's artifact (ftl.cc ``promotion_thread``: no CPU cost)."""

    #: per look that moved pages (the wake-up, the system call's entry)
    ns_per_batch: int = 0
    #: per page moved (its page-table entry, a share of the TLB shootdown)
    ns_per_page: int = 0


class MigrationPolicy(Protocol):
    #: a page is promoted on the SSD-DRAM hit that brings its count to this value
    threshold: int
    #: accesses per window (the promoted share restarts; ``end_window`` is called)
    window_accesses: int
    #: whether a window's end also resets the per-page hit counters (else a page's
    #: count lasts until it is evicted from the data cache or promoted)
    window_resets_counts: bool
    #: whether :meth:`counted_hit` is called after every counted data-cache hit
    per_access: bool

    def end_window(self, accesses: int, promoted_accesses: int) -> None:
        """A window ended: ``promoted_accesses`` of its ``accesses`` hit promoted pages."""
        ...

    def counted_hit(self, promoted_share: float, promoted: bool) -> None:
        """A data-cache hit was counted (``per_access`` policies): the window's promoted
        share so far, and whether this hit decided a promotion."""
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

    window_resets_counts = True
    per_access = False

    def __init__(self, config: MigrationConfig) -> None:
        self.threshold = config.initial_threshold
        self.window_accesses = config.window_accesses
        #: (threshold after the window, promoted share of the window) per window
        self.history: list[tuple[int, float]] = []

    def end_window(self, accesses: int, promoted_accesses: int) -> None:
        self.history.append((self.threshold, promoted_accesses / accesses if accesses else 0.0))

    def counted_hit(self, promoted_share: float, promoted: bool) -> None:
        pass

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


@MIGRATION_POLICIES.register("skybyte")
class SkyByteThreshold(FixedThreshold):
    """SkyByte's rule (the paper, and the authors' artifact's code): the threshold
    starts at the top of its range and adapts after every counted data-cache hit
    from the window's promoted share so far: +1 at <= 25 %, -1 at >= 75 % when the
    hit promoted a page. A window's end restarts the share and the threshold;
    per-page counts last until the page leaves the data cache or is promoted. This
    uses the fraction the paper describes; the artifact divides as integers and its
    window reset does not zero its hit count, so its threshold stays at the top
    (``min_threshold`` = ``max_threshold`` runs that; docs/firmware.md)."""

    window_resets_counts = False
    per_access = True

    def __init__(self, config: MigrationConfig) -> None:
        super().__init__(config)
        self.config = config

    def counted_hit(self, promoted_share: float, promoted: bool) -> None:
        c = self.config
        if promoted_share <= c.raise_at_or_below_share:
            self.threshold = min(self.threshold + 1, c.max_threshold)
        elif promoted and promoted_share >= c.lower_at_or_above_share:
            self.threshold = max(self.threshold - 1, c.min_threshold)

    def end_window(self, accesses: int, promoted_accesses: int) -> None:
        super().end_window(accesses, promoted_accesses)
        self.threshold = self.config.initial_threshold

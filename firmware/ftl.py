"""Page-mapped FTL with per-die garbage collection and pluggable placement and victim policies.

Mapping only, no timing (the flash backend times what the FTL decides). A logical
page (LPN, = DPA >> 12) is on the die it was last written to (:meth:`PageFtl.die_of`);
a never-written page reads from die ``lpn % n_dies``, where a sequential fill (and
``precondition``) puts it. The *placement* policy (``flash.placement``) picks the die
of each host program: ``write-pointer`` (default) takes the dies in turn, as SkyByte's
artifact's write pointer does (``ftl.cc`` ``get_new_page``/``ssd_advance_write_pointer``:
channel first, then the unit on it), so consecutive programs spread over the dies
whatever their pages; ``striped`` writes a page on die ``lpn % n_dies`` always (ours
before issue 13). Each die writes into one *active* block; when a new active block is
taken while the die has fewer free blocks than ``free_threshold x blocks_per_die``, one
victim block is collected: its valid pages move to the active block and it is erased.
Relocation never triggers GC itself. That is ``gc.unit: die`` (ours, the default). With
``gc.unit: line`` GC works as SkyByte's artifact's (``bytefs_gc.cc``,
``ALLOCATION_SECHEM_LINE``): a *line* is the block of the same index on every die; once
a block opening leaves fewer than ``free_threshold x blocks_per_die`` free lines, lines
are collected, fewest valid pages first, each at most once, until ``stop_threshold x
blocks_per_die`` lines are free (the artifact: 20 % and 35 %); their valid pages are
re-placed by the placement (the write pointer: over all dies) and every die erases its
block of the line. Lines stay aligned only if the dies fill evenly, so ``line`` needs the
write pointer.

A *failed* die (``die-fault`` knob) takes no new writes and is never collected: the
write pointer skips it; striped placement writes a page whose die failed to a stand-in,
``healthy[(lpn // n_dies) % len(healthy)]`` (spread over the healthy dies). A
*forced* collection (``gc-storm`` knob) also takes a victim whose pages are all valid
(pure relocation).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from cxlssd.errors import ConfigError, InputError
from cxlssd.firmware.registry import Registry

FREE, ACTIVE, CLOSED = 0, 1, 2
#: what GC collects: a die's block (ours) or a line, the same block on every die (the artifact)
GC_UNITS = ("die", "line")


class VictimPolicy(Protocol):
    """Chooses which closed block of a die GC collects."""

    def choose(self, valid: np.ndarray, opened: np.ndarray, closed: np.ndarray) -> int:
        """Index (within the die) of the victim among blocks where ``closed`` is true.

        ``valid``: valid pages per block; ``opened``: when each block was opened
        (a global sequence number). Called only when some block is closed.
        """
        ...


GC_VICTIM_POLICIES: Registry[VictimPolicy] = Registry("GC victim policy", "gc.victim")


@GC_VICTIM_POLICIES.register("greedy")
class GreedyVictim:
    """The closed block with the fewest valid pages (least copying)."""

    def choose(self, valid: np.ndarray, opened: np.ndarray, closed: np.ndarray) -> int:
        return int(np.argmin(np.where(closed, valid, np.iinfo(valid.dtype).max)))


@GC_VICTIM_POLICIES.register("fifo")
class FifoVictim:
    """The oldest closed block (wear-levelling friendly, more copying)."""

    def choose(self, valid: np.ndarray, opened: np.ndarray, closed: np.ndarray) -> int:
        return int(np.argmin(np.where(closed, opened, np.iinfo(opened.dtype).max)))


class Placement(Protocol):
    """Chooses the die of each host program."""

    def die_for(self, lpn: int, ftl: PageFtl) -> int:
        """The die that takes the next program of ``lpn``: a healthy one (not in
        ``ftl.failed``)."""
        ...


PLACEMENTS: Registry[Placement] = Registry("flash placement", "flash.placement")


@PLACEMENTS.register("write-pointer")
class WritePointerPlacement:
    """The dies in turn (die ``d`` is on channel ``d % channels``, so channel first),
    as SkyByte's artifact's write pointer. It skips a failed die, and a die down to its
    last free block (kept for GC's relocations) while another die has room: without
    line-wide GC (see the module doc) the dies' valid pages drift apart."""

    def __init__(self) -> None:
        self.next_die = 0

    def die_for(self, lpn: int, ftl: PageFtl) -> int:
        n = ftl.n_dies
        for _ in range(n):
            die = self.next_die
            self.next_die = (die + 1) % n
            if die not in ftl.failed and ftl.has_room(die):
                return die
        # every healthy die at its floor: write into a die's GC reserve; _open_block
        # raises the clear ConfigError once no free block is left
        return ftl.stand_in(lpn)


@PLACEMENTS.register("striped")
class StripedPlacement:
    """Page ``lpn`` on die ``lpn % n_dies`` (static striping), or its stand-in while
    that die is failed."""

    def die_for(self, lpn: int, ftl: PageFtl) -> int:
        die = lpn % ftl.n_dies
        return ftl.stand_in(lpn) if die in ftl.failed else die


@dataclass
class GcResult:
    """One collected block: on ``die``, ``moved`` valid pages relocated, then erased."""

    die: int
    block: int
    moved: int


@dataclass
class LineGcResult:
    """One collected line (block ``block`` of every die in ``dies``): ``read_from[d]``
    valid pages read on die ``d`` and ``programmed_on[d]`` re-placed on it, then every
    die in ``dies`` erased its block."""

    block: int
    dies: list[int]
    read_from: list[int]
    programmed_on: list[int]

    @property
    def moved(self) -> int:
        return sum(self.read_from)


class PageFtl:
    """Logical-to-physical page map over ``n_dies`` dies."""

    def __init__(
        self,
        logical_pages: int,
        n_dies: int,
        pages_per_block: int,
        overprovisioning: float,
        free_threshold: float,
        victim: VictimPolicy,
        precondition: bool = False,
        placement: Placement | None = None,
        unit: str = "die",
        stop_threshold: float = 0.35,
    ) -> None:
        if unit not in GC_UNITS:
            raise ConfigError(f"unknown gc.unit {unit!r}: one of {', '.join(GC_UNITS)}")
        self.unit = unit
        self.logical_pages = logical_pages
        self.n_dies = n_dies
        self.pages_per_block = pages_per_block
        logical_per_die = -(-logical_pages // n_dies)
        data_blocks = -(-logical_per_die // pages_per_block)
        # at least two spare blocks per die: GC needs an active block and one to free
        self.blocks_per_die = max(
            -(-int(logical_per_die * (1 + overprovisioning)) // pages_per_block),
            data_blocks + 2,
        )
        self.gc_threshold_blocks = int(np.ceil(free_threshold * self.blocks_per_die))
        self.gc_stop_blocks = int(np.ceil(stop_threshold * self.blocks_per_die))
        self.victim = victim
        self.placement: Placement = placement if placement is not None else WritePointerPlacement()
        self.pages_per_die = self.blocks_per_die * pages_per_block
        n_blocks = n_dies * self.blocks_per_die
        self.l2p = np.full(logical_pages, -1, dtype=np.int64)
        self.p2l = np.full(n_blocks * pages_per_block, -1, dtype=np.int64)
        self.valid = np.zeros(n_blocks, dtype=np.int32)
        self.state = np.full(n_blocks, FREE, dtype=np.int8)
        self.opened = np.zeros(n_blocks, dtype=np.int64)
        self._open_seq = 0
        self.free: list[deque[int]] = [deque(range(self.blocks_per_die)) for _ in range(n_dies)]
        self.active = [-1] * n_dies  # global block id per die
        self.write_ptr = [pages_per_block] * n_dies  # "full" until a block is opened
        # dies whose last block opening asked for GC (gc.unit line: any die, for a pass)
        self.gc_pending: list[int] = []
        self.line_openings = 0  # gc.unit line: block openings since the last line pass
        self._relocating = False  # a line pass is re-placing pages (it may use the GC reserve)
        self.failed: set[int] = set()  # dies that take no new writes
        self._healthy = list(range(n_dies))
        if precondition:
            self._precondition()
        for die in range(n_dies):
            self._open_block(die)
        self.gc_pending.clear()
        self.line_openings = 0

    def _precondition(self) -> None:
        """Map every LPN once, densely per die, as after a sequential fill."""
        ppb, bpd = self.pages_per_block, self.blocks_per_die
        lpn = np.arange(self.logical_pages, dtype=np.int64)
        die, local = lpn % self.n_dies, lpn // self.n_dies
        ppn = (die * bpd + local // ppb) * ppb + local % ppb
        self.l2p[:] = ppn
        self.p2l[ppn] = lpn
        np.add.at(self.valid, ppn // ppb, 1)
        for d in range(self.n_dies):
            used = -(-int(np.count_nonzero(die == d)) // ppb)
            blocks = range(d * bpd, d * bpd + used)
            self.state[list(blocks)] = CLOSED
            for _ in blocks:
                self.free[d].popleft()

    def die_of(self, lpn: int) -> int:
        """The die holding ``lpn`` (for a never-written page, die ``lpn % n_dies``)."""
        ppn = int(self.l2p[lpn])
        return ppn // self.pages_per_die if ppn >= 0 else lpn % self.n_dies

    def stand_in(self, lpn: int) -> int:
        """A healthy die standing in for ``lpn``'s striped die (spread over the healthy dies)."""
        return self._healthy[lpn // self.n_dies % len(self._healthy)]

    def has_room(self, die: int) -> bool:
        """Whether ``die`` can take a program and keep a free block for GC (a line pass
        relocating takes that block too)."""
        reserve = 0 if self._relocating else 1
        return self.write_ptr[die] < self.pages_per_block or len(self.free[die]) > reserve

    def fail(self, dies: list[int]) -> None:
        """Take ``dies`` out of service for writes; InputError if the healthy dies could
        not hold the pages mapped now (with the two spare blocks each that GC needs)."""
        healthy = [d for d in range(self.n_dies) if d not in self.failed and d not in dies]
        room = len(healthy) * (self.blocks_per_die - 2) * self.pages_per_block
        mapped = int(np.count_nonzero(self.l2p >= 0))
        if not healthy or mapped > room:
            raise InputError(
                f"failing die(s) {dies} leaves {len(healthy)} healthy dies with room for {room} pages, "
                f"fewer than the {mapped} mapped: raise flash.overprovisioning or fail fewer dies"
            )
        self.failed.update(dies)
        self._healthy = healthy

    def restore(self, dies: list[int]) -> None:
        """Put failed ``dies`` back in service (their pages are readable again)."""
        self.failed.difference_update(dies)
        self._healthy = [d for d in range(self.n_dies) if d not in self.failed]

    def _open_block(self, die: int) -> None:
        if not self.free[die]:
            raise ConfigError(
                "the flash ran out of free blocks; raise flash.overprovisioning "
                "or gc.free_threshold"
            )
        block = die * self.blocks_per_die + self.free[die].popleft()
        self.state[block] = ACTIVE
        self.opened[block] = self._open_seq
        self._open_seq += 1
        self.active[die] = block
        self.write_ptr[die] = 0
        if self.unit == "die":
            if len(self.free[die]) < self.gc_threshold_blocks:
                self.gc_pending.append(die)
            return
        # a line pass at most once per line of block openings (ours: the artifact's FTL
        # thread checks in a loop), at once when a die is down to its last free block
        self.line_openings += 1
        free = self.free_lines()
        if free < self.gc_threshold_blocks and (self.line_openings >= len(self._healthy) or free <= 1):
            self.gc_pending.append(die)

    def _place(self, lpn: int, die: int) -> None:
        if self.write_ptr[die] == self.pages_per_block:
            self.state[self.active[die]] = CLOSED
            self._open_block(die)
        block = self.active[die]
        ppn = block * self.pages_per_block + self.write_ptr[die]
        self.write_ptr[die] += 1
        old = self.l2p[lpn]
        if old >= 0:
            self.p2l[old] = -1
            self.valid[old // self.pages_per_block] -= 1
        self.l2p[lpn] = ppn
        self.p2l[ppn] = lpn
        self.valid[block] += 1

    def program(self, lpn: int) -> int:
        """Write ``lpn`` to a fresh page (out of place) on the die placement picks; returns it."""
        die = self.placement.die_for(lpn, self)
        self._place(lpn, die)
        return die

    def collect(self, die: int, force: bool = False) -> GcResult | None:
        """Collect one victim block on ``die``; None if no closed block has an invalid
        page (with ``force``: if it has no closed block, or no free block to move
        into), or if the die is failed."""
        bpd, ppb = self.blocks_per_die, self.pages_per_block
        lo = die * bpd
        closed = self.state[lo : lo + bpd] == CLOSED
        if die in self.failed or not closed.any() or (force and not self.free[die]):
            return None
        local = self.victim.choose(self.valid[lo : lo + bpd], self.opened[lo : lo + bpd], closed)
        block = lo + local
        if not closed[local] or (self.valid[block] == ppb and not force):
            return None
        pages = self.p2l[block * ppb : (block + 1) * ppb]
        moved = pages[pages >= 0].tolist()
        for lpn in moved:
            self._place(lpn, die)
        self.state[block] = FREE
        self.free[die].append(local)
        return GcResult(die, block, len(moved))

    def free_lines(self) -> int:
        """Lines free on every healthy die (the dies open blocks in the same order, so
        under the write pointer this is each die's free blocks, give or take the one
        block being opened)."""
        return min(len(self.free[d]) for d in self._healthy)

    def collect_line(self, skip: AbstractSet[int] = frozenset()) -> LineGcResult | None:
        """Collect one line (a block index closed on every healthy die, not in
        ``skip``) chosen by the victim policy; None if none is closed or the chosen one
        has no invalid page. Its valid pages are re-placed by the placement."""
        bpd, ppb = self.blocks_per_die, self.pages_per_block
        dies = list(self._healthy)
        per_die = np.array(dies, dtype=np.int64)[:, None] * bpd + np.arange(bpd)
        closed = (self.state[per_die] == CLOSED).all(axis=0)
        if skip:
            closed[list(skip)] = False
        if not closed.any():
            return None
        valid = self.valid[per_die].sum(axis=0)
        local = self.victim.choose(valid, self.opened[per_die].min(axis=0), closed)
        room = sum(ppb - self.write_ptr[d] + ppb * len(self.free[d]) for d in dies)
        if not closed[local] or valid[local] == ppb * len(dies) or valid[local] > room:
            return None
        read_from = [0] * self.n_dies
        programmed_on = [0] * self.n_dies
        self._relocating = True
        try:
            for die in dies:
                block = die * bpd + local
                pages = self.p2l[block * ppb : (block + 1) * ppb]
                for lpn in pages[pages >= 0].tolist():
                    read_from[die] += 1
                    programmed_on[self.program(lpn)] += 1
        finally:
            self._relocating = False
        for die in dies:
            self.state[die * bpd + local] = FREE
            self.free[die].append(local)
        return LineGcResult(local, dies, read_from, programmed_on)

    def free_blocks(self, die: int) -> int:
        return len(self.free[die])

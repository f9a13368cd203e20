"""The device's transfer engine and the guest's lifetime hints (docs/offload.md).

G10 and TeraIO move tensors between fast and slow memory *while the computation
goes on*. In a cxlssd guest a page changes place only by the kernel's
``move_pages`` on the program's own vCPU, which is synchronous and, under TCG,
copies a page a byte at a time through the MMIO window. A program that wants
asynchronous transfers brackets such a move with markers, and the firmware
accounts for it as a transfer of a device-side DMA engine instead:

* ``XFER_BEGIN`` (``addr`` = ticket << 1 | to-device) and ``XFER_END`` (``addr`` =
  ticket) enclose one move on one vCPU. The device requests of the copy in between
  are the engine's work, not the vCPU's: they are served as issued at the bracket's
  begin (the engine starts on every page at once, each flash read queued on its
  die) and charge the vCPU nothing (posted), so the device's timeline holds them
  where the engine does them. What the vCPU's clock advanced by in between (the
  kernel's copy: its instructions) is taken back from it; the vCPU is charged
  ``host_ns_per_transfer`` + ``host_ns_per_page`` per page moved instead (the
  system call, the engine's descriptor and the page-table updates, which stay the
  CPU's work). (Served at the vCPU's own times, the copy's device work stayed
  booked along the time that was taken back, and the accesses after the bracket
  queued behind it: the credit came back as stall, docs/offload.md.)
* The engine serves transfers one at a time in issue order: a transfer starts at
  ``max(its begin clock, the engine's previous transfer done)`` and lasts
  ``first_page_ns + max(bytes / link_bytes_per_s, flash pages x read_ns / dies)``:
  the link streams the pages while the flash dies read the ones that were not in
  SSD DRAM in parallel (the pages the copy read from flash, counted from the
  bracket's device responses).
* ``XFER_WAIT`` (``addr`` = ticket): the vCPU needs the transfer's data; it is
  charged ``max(0, done - now)``. What the transfer took beyond that wait ran
  while the vCPU computed: the overlap.
* ``XFER_BEGIN`` with ``XFER_BY_OS`` set: the guest OS's promotion daemon carrying
  out the firmware's decisions (one bracket per look at the mailbox,
  host_os/promoter.c). SkyByte's promotion thread is the device's: the program's
  CPU pays nothing for a move (artifact, ftl.cc ``promotion_thread``). So the
  daemon's work in the bracket is taken back as a transfer's copy is, the CPU is
  charged ``migration.move_host_ns_per_batch`` / ``_per_page`` instead (0 as
  evaluated), and nobody waits for it. A bracket belongs to the thread that opened
  it: the daemon may preempt a program inside the program's own bracket.
* ``DAEMON`` (the kernel helper, at the guest scheduler's switches; ``addr`` =
  ``DAEMON_OFF`` or ``DAEMON_ON``): the daemon's thread left its CPU or got it back.
  It runs SCHED_FIFO, yet ``move_pages(2)`` blocks inside a look (it waits for an RCU
  grace period) and the program runs meanwhile: that time is the program's, so a look
  takes back only the time its daemon was on the CPU. What the daemon runs on its CPU
  outside its looks (from the switch that wakes it to its first look, between looks,
  from its last look to the switch that puts it back to wait) is the promotion
  thread's too: taken back the same way (``os_outside_looks_ns``), its requests the
  engine's. Only a thread that sent DAEMON markers gets this: without the kernel
  helper nothing says when the daemon waits.

Lifetime hints (``HINT``, ``addr`` = kind << 56 | op << 48 | pages << 32 | first
device page) name a run of device pages of one tensor:

* ``NEED`` (it is used at op ``op``): the firmware reads the pages that are not in
  its data cache from flash into it now, in the background (no vCPU is charged),
  so the later transfer or in-place use finds them in SSD DRAM.
* ``DEAD`` (its value is dead after op ``op``, the next use overwrites it): the
  firmware drops the pages from its data cache without writing them back, which
  saves the flash programs of dirty dead pages and frees the slots.

Every input is a marker in the stream, so a recorded run replays to the same
answers (DESIGN.md decision 5).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import numpy as np

from cxlssd.abi.protocol import HINT_DEAD, HINT_NEED, MAX_HINT_PAGES, XFER_BY_OS
from cxlssd.firmware.controller import Controller
from cxlssd.firmware.request import FLAG_ENGINE, FLAG_OS_MOVE, FLAG_POSTED, PAGE_BYTES, PAGE_SHIFT, Op, Source

log = logging.getLogger(__name__)

#: the vCPU id the firmware's own hint reads are issued as (no guest vCPU has it)
ENGINE_VCPU = 0xFFFF
#: finished transfers kept for a XFER_WAIT (tickets are the guest's: a program that
#: never waits must not grow the firmware's memory)
MAX_UNWAITED_TRANSFERS = 4096


@dataclass(frozen=True)
class EngineConfig:
    """The transfer engine's parameters (ours: SkyByte describes no DMA engine)."""

    #: a PCIe 5.0 x8 CXL link, 32 GB/s raw a direction, 80 % of it for data (assumed)
    link_bytes_per_s: int = 25_600_000_000
    #: the CPU's part of a transfer: the system call, the engine's descriptor, its
    #: completion (assumed)
    host_ns_per_transfer: int = 2000
    #: ... and of each page: its page-table entry and a share of a batched TLB shootdown
    #: (assumed; Linux's own page migration, copy included, moves 4 KiB pages at ~1-2 us
    #: each, most of it not the copy: docs/offload.md shows the result with that cost too)
    host_ns_per_page: int = 250


@dataclass
class TransferCounters:
    transfers: int = 0
    promotions: int = 0  # transfers to host DRAM
    demotions: int = 0  # ... and back
    pages: int = 0
    bytes: int = 0
    flash_pages: int = 0  # pages the engine read from flash
    busy_ns: int = 0  # the engine's time spent on transfers
    guest_copy_ns: int = 0  # what the vCPU's clock advanced by in the brackets (the copy's
    # instructions), taken back
    host_ns: int = 0  # the CPU's part charged instead (host_ns_per_page)
    waits: int = 0
    wait_ns: int = 0  # what the vCPU waited for transfers: the part not overlapped
    waited_busy_ns: int = 0  # the duration of the transfers waited for
    # the promotion daemon's looks at the mailbox (XFER_BY_OS brackets), apart from the
    # program's transfers above
    os_looks: int = 0
    os_pages: int = 0  # pages it moved in them
    os_flash_pages: int = 0
    os_busy_ns: int = 0  # the engine's time on them
    os_taken_back_ns: int = 0  # the daemon's vCPU time in them, taken back
    os_host_ns: int = 0  # the CPU's part charged instead (migration.move_host_ns_*)
    # requests of another thread on a vCPU while a bracket was open there and its thread
    # was not known to be switched out (DAEMON markers): that thread ran inside the
    # bracket, and its time between its requests was taken back with it
    foreign_requests: int = 0
    os_switched_out: int = 0  # times the daemon left its CPU inside a look (DAEMON_OFF)
    os_others_ns: int = 0  # the vCPU time others ran in its looks meanwhile: not taken back
    # the daemon's time on its CPU outside its looks (woken, between looks, going back to
    # wait), taken back: what the kernel helper's DAEMON markers delimit
    os_outside_looks_ns: int = 0
    hint_markers: int = 0
    need_pages: int = 0
    need_prefetched: int = 0  # NEED pages read into the data cache
    dead_pages: int = 0
    dead_dropped: int = 0  # DEAD pages dropped from the data cache
    dead_dirty_dropped: int = 0  # ... of them dirty: a flash program saved


@dataclass
class _Open:
    ticket: int
    to_device: bool
    by_os: bool
    begin_clock_ns: int
    pages: int = 0
    flash_pages: int = 0
    # what brackets of other threads that ran inside this one charged the vCPU: in this
    # bracket's clock advance, and not its work
    inner_host_ns: int = 0
    # the vCPU's clock when the bracket's thread left its CPU (DAEMON_OFF), while it is out
    switched_out_clock_ns: int | None = None
    others_ns: int = 0  # what other threads ran in it meanwhile: not its work
    # the clock when its thread's current stretch on the CPU began (the bracket's begin, or
    # its DAEMON_ON), and its work in the stretches before, taken back when it left
    stretch_clock_ns: int = 0
    taken_back_ns: int = 0
    # not a look: the daemon on its CPU outside its looks (closed by its next look or by
    # its leaving the CPU), from this local time
    outside_looks: bool = False
    begin_local_ns: int = 0

    def stretch_ns(self, now_ns: int) -> int:
        """Its thread's work in its current stretch on the CPU, at clock ``now_ns``: the
        clock's advance less what brackets of other threads charged there."""
        return now_ns - self.stretch_clock_ns - self.inner_host_ns


class TransferEngine:
    """Settles transfer brackets and hints per vCPU (see the module doc).

    A bracket belongs to the guest thread that opened it (the kernel helper tags every
    request with its thread; 0 when no helper runs: then the vCPU's): the promotion
    daemon's bracket may run inside a program's, and each claims only its own
    requests."""

    def __init__(self, controller: Controller, config: EngineConfig | None = None) -> None:
        self.controller = controller
        self.config = config or EngineConfig()
        self.counters = TransferCounters()
        self.free_ns = 0  # when the engine's last transfer is done
        self._open: dict[tuple[int, int], _Open] = {}  # (vCPU, thread) -> its bracket
        self._done: dict[int, tuple[int, int]] = {}  # ticket -> (start, done)
        self._daemons: set[int] = set()  # threads that sent DAEMON markers

    def clock_ns(self, vcpu: int, local_ns: int) -> int:
        return local_ns + self.controller.vcpu_stall_ns(vcpu)

    @property
    def brackets_open(self) -> bool:
        return bool(self._open)

    def _key(self, vcpu: int, thread: int) -> tuple[int, int]:
        """The open bracket's key that a request of ``thread`` on ``vcpu`` belongs to (a
        bracket opened where no thread was known claims the whole vCPU)."""
        return (vcpu, thread) if (vcpu, thread) in self._open else (vcpu, 0)

    def in_bracket(self, vcpu: int, thread: int) -> bool:
        """Whether the device requests of ``thread`` on ``vcpu`` are the engine's now."""
        return self._key(vcpu, thread) in self._open

    def begin(self, vcpu: int, thread: int, arg: int, local_ns: int) -> None:
        key = (vcpu, thread)
        by_os = bool(arg & XFER_BY_OS)
        arg &= ~XFER_BY_OS
        if key in self._open and self._open[key].outside_looks:
            self._end_outside_looks(key, local_ns)
        if key in self._open:
            log.warning("transfer %d began on vCPU %d, thread %d inside transfer %d: the earlier one is "
                        "dropped", arg >> 1, vcpu, thread, self._open[key].ticket)
        now_ns = self.clock_ns(vcpu, local_ns)
        self._open[key] = _Open(arg >> 1, bool(arg & 1), by_os, now_ns, stretch_clock_ns=now_ns)

    def page_moved(self, vcpu: int, thread: int) -> None:
        """A PROMOTED/DEMOTED report (inside a bracket: one of its pages)."""
        bracket = self._open.get(self._key(vcpu, thread))
        if bracket is not None:
            bracket.pages += 1

    def _claims(self, requests: np.ndarray) -> list[tuple[_Open, np.ndarray, int]]:
        """Each open bracket with the mask of its requests in ``requests`` and its vCPU."""
        claims = []
        for (vcpu, thread), bracket in self._open.items():
            mine = requests["vcpu"] == vcpu
            if thread:
                mine &= requests["thread"] == thread
            claims.append((bracket, mine, vcpu))
        return claims

    def as_engine_work(self, requests: np.ndarray) -> np.ndarray:
        """``requests`` with those of the threads inside a bracket made the engine's:
        issued at the bracket's begin, posted and marked ``FLAG_ENGINE`` (a copy; the
        others unchanged)."""
        for key, bracket in list(self._open.items()):
            vcpu, thread = key
            if bracket.outside_looks and np.any((requests["vcpu"] == vcpu) & (requests["thread"] != thread)):
                # another thread runs there: the daemon left without a DAEMON_OFF (it closed
                # the helper's file on its way out, and the helper stopped marking it);
                # when is not known, so nothing is taken back
                del self._open[key]
        if not self._open:
            return requests
        engine = requests.copy()
        claimed = np.zeros(requests.shape[0], dtype=bool)
        on_vcpus = np.zeros(requests.shape[0], dtype=bool)
        for bracket, mine, vcpu in self._claims(requests):
            if bracket.switched_out_clock_ns is None:
                on_vcpus |= requests["vcpu"] == vcpu
            if not mine.any():
                continue
            claimed |= mine
            begin_ns = bracket.begin_clock_ns
            if self.controller.compute_timebase:  # the controller adds the vCPU's stall
                begin_ns -= self.controller.vcpu_stall_ns(vcpu)
            engine["time_ns"][mine] = max(0, begin_ns)
            engine["flags"][mine] |= FLAG_POSTED | FLAG_ENGINE | (FLAG_OS_MOVE if bracket.by_os else 0)
        self.counters.foreign_requests += int(np.count_nonzero(on_vcpus & ~claimed))
        return engine

    def daemon_switched(self, vcpu: int, thread: int, on_cpu: bool, local_ns: int) -> None:
        """A DAEMON marker: ``thread`` left ``vcpu`` (``on_cpu`` False) or got it back.
        Only a bracket that thread has open there notes it; outside its looks, the time
        it is on the CPU is taken back as its looks' is."""
        self._daemons.add(thread)
        key = (vcpu, thread)
        bracket = self._open.get(key)
        if bracket is None:
            if on_cpu:
                self._begin_outside_looks(key, local_ns)
            return
        if bracket.outside_looks:
            if not on_cpu:
                self._end_outside_looks(key, local_ns)
            return
        now_ns = self.clock_ns(vcpu, local_ns)
        if not on_cpu:
            if bracket.switched_out_clock_ns is None:
                # Its work so far is taken back now, not at the look's end: the thread that
                # runs next (a program parked on a long read resumes here) must not find the
                # clock ahead by the daemon's work. Taken back at the end, it was: the read was
                # timed after that work and waited for it again at its resume (a trace of
                # skybyte-full's radix, 2026-12-07: 38 switches, hidden -0.62 ms).
                own_ns = max(0, bracket.stretch_ns(now_ns))
                self.controller.charge_stall(vcpu, -own_ns)
                bracket.taken_back_ns += own_ns
                bracket.inner_host_ns = 0
                bracket.switched_out_clock_ns = now_ns - own_ns
                self.counters.os_switched_out += 1
        elif bracket.switched_out_clock_ns is not None:
            bracket.others_ns += now_ns - bracket.switched_out_clock_ns
            bracket.switched_out_clock_ns = None
            bracket.stretch_clock_ns = now_ns

    def _begin_outside_looks(self, key: tuple[int, int], local_ns: int) -> None:
        self._open[key] = _Open(0, False, True, self.clock_ns(key[0], local_ns), outside_looks=True,
                                begin_local_ns=local_ns)

    def _end_outside_looks(self, key: tuple[int, int], local_ns: int) -> None:
        """The daemon's instructions on its CPU since it got it (or ended a look): taken
        back. Its local time, not the clock: the stall the vCPU was charged meanwhile is
        the program's (the device read the doorbell interrupted it at, which the program
        waits for when it runs again)."""
        span = self._open.pop(key)
        own_ns = max(0, local_ns - span.begin_local_ns)
        self.controller.charge_stall(key[0], -own_ns)
        self.counters.os_outside_looks_ns += own_ns

    def served(self, requests: np.ndarray, out: np.ndarray) -> None:
        """Device requests served while a bracket is open: count the pages read from flash."""
        for bracket, mine, _ in self._claims(requests):
            bracket.flash_pages += int(np.count_nonzero(out["source"][mine] == Source.FLASH))

    def end(self, vcpu: int, thread: int, ticket: int, local_ns: int) -> None:
        key = self._key(vcpu, thread)
        bracket = self._open.get(key)
        if bracket is not None and not bracket.outside_looks:
            del self._open[key]
        if bracket is None or bracket.outside_looks or bracket.ticket != ticket:
            log.warning("transfer %d ended on vCPU %d, thread %d without its begin: ignored",
                        ticket, vcpu, thread)
            return
        cfg, c = self.config, self.counters
        # its last stretch on the CPU (the stretches before were taken back as they ended)
        copy_ns = bracket.stretch_ns(self.clock_ns(vcpu, local_ns))
        if bracket.by_os:
            cost = self.controller.move_cost
            host_ns = cost.ns_per_batch + cost.ns_per_page * bracket.pages if bracket.pages else 0
        else:
            host_ns = cfg.host_ns_per_transfer + cfg.host_ns_per_page * bracket.pages
        self.controller.charge_stall(vcpu, host_ns - copy_ns)
        for (other_vcpu, _), outer in self._open.items():  # brackets this one ran inside
            if other_vcpu == vcpu and outer.switched_out_clock_ns is None:  # (out: in its others)
                outer.inner_host_ns += host_ns
        nbytes = bracket.pages * PAGE_BYTES
        duration_ns = 0
        if bracket.pages:
            timeline = self.controller.flash.timeline if self.controller.flash is not None else None
            flash_ns = 0
            first_ns = self.controller.latencies.hit_ns if timeline is not None else 0
            if timeline is not None and bracket.flash_pages:
                flash_ns = bracket.flash_pages * timeline.read_ns // timeline.n_dies
                first_ns += timeline.read_ns
            link_ns = nbytes * 1_000_000_000 // cfg.link_bytes_per_s
            duration_ns = first_ns + max(link_ns, flash_ns)
        start_ns = max(bracket.begin_clock_ns, self.free_ns)
        self.free_ns = start_ns + duration_ns
        if bracket.by_os:  # nobody waits for the daemon's moves
            c.os_looks += 1
            c.os_pages += bracket.pages
            c.os_flash_pages += bracket.flash_pages
            c.os_busy_ns += duration_ns
            c.os_taken_back_ns += copy_ns + bracket.taken_back_ns
            c.os_others_ns += bracket.others_ns
            c.os_host_ns += host_ns
            if thread in self._daemons:  # still on its CPU: until it waits again, or looks
                self._begin_outside_looks((vcpu, thread), local_ns)
            return
        self._done[ticket] = (start_ns, self.free_ns)
        if len(self._done) > MAX_UNWAITED_TRANSFERS:  # never waited for: forget the oldest
            del self._done[next(iter(self._done))]
        c.transfers += 1
        c.demotions += bracket.to_device
        c.promotions += not bracket.to_device
        c.pages += bracket.pages
        c.bytes += nbytes
        c.flash_pages += bracket.flash_pages
        c.busy_ns += duration_ns
        c.guest_copy_ns += copy_ns
        c.host_ns += host_ns

    def wait(self, vcpu: int, ticket: int, local_ns: int) -> None:
        span = self._done.pop(ticket, None)
        if span is None:
            log.warning("vCPU %d waits for transfer %d, which is not known: ignored", vcpu, ticket)
            return
        wait_ns = max(0, span[1] - self.clock_ns(vcpu, local_ns))
        self.controller.charge_stall(vcpu, wait_ns)
        self.counters.waits += 1
        self.counters.wait_ns += wait_ns
        self.counters.waited_busy_ns += span[1] - span[0]

    def hint(self, vcpu: int, arg: int, local_ns: int) -> None:
        kind, pages, first = arg >> 56, (arg >> 32) & MAX_HINT_PAGES, arg & 0xFFFF_FFFF
        cache = self.controller.cache
        self.counters.hint_markers += 1
        last = min(first + pages, self.controller.device_pages)
        if kind == HINT_NEED:
            self.counters.need_pages += pages
            if cache is None:
                return
            now_ns = self.clock_ns(vcpu, local_ns)
            for page in range(first, last):
                if cache.lookup(page) >= 0:
                    continue
                # read at once, each page on its die; charged to no guest vCPU
                self.controller.submit(now_ns, page << PAGE_SHIFT, Op.READ, vcpu=ENGINE_VCPU)
                self.controller.charge_stall(ENGINE_VCPU, -self.controller.vcpu_stall_ns(ENGINE_VCPU))
                self.counters.need_prefetched += 1
        elif kind == HINT_DEAD:
            self.counters.dead_pages += pages
            if cache is None:
                return
            for page in range(first, last):
                if cache.lookup(page) >= 0:
                    self.counters.dead_dropped += 1
                    self.counters.dead_dirty_dropped += cache.invalidate(page)
        else:
            log.warning("unknown hint kind %d from vCPU %d: ignored", kind, vcpu)

    def counter_dict(self) -> dict[str, int]:
        return asdict(self.counters)

"""The CXL-SSD controller: composes the components and answers device requests.

Request path (MQSim-like layering): host interface (:mod:`.request`) -> promoted-page
check -> write log (:mod:`.writelog`) / data cache (:mod:`.cache`) -> FTL
(:mod:`.ftl`) -> transaction scheduling (:mod:`.scheduler`) -> flash timings.

:meth:`Controller.process` is the one entry point: a numpy array of
:data:`~.request.REQUEST_DTYPE` in, an array of :data:`~.request.RESPONSE_DTYPE` out,
in stream order. The live driver hands it ring chunks; the replay driver hands it
trace chunks; :meth:`Controller.submit` is a one-element batch. The model's
semantics are those of :meth:`Controller._step` (one request). For speed, runs of
requests that are *simple* against the state at the start of the run (hits on
promoted pages, the log or the cache; log appends below the flush level; no
promotion trigger) are applied with numpy in :meth:`Controller._apply_simple`, which
must give exactly what ``_step`` would; other requests go through
:meth:`Controller._run_fast`, ``_step`` written out inline for speed (it calls
``_step`` itself for the rare cases). ``tests/firmware/test_controller.py`` and
``test_fast_path.py`` check both against ``vectorize=False`` (``_step`` only).

Timebase: with ``timebase="compute"`` (synthetic traces, the live plugin) a
request's ``time_ns`` excludes device stalls and the controller adds the stall it
has charged that vCPU so far (closed loop); with ``"issue"`` (a driver whose clock
already includes stalls) ``time_ns`` is used as is. A read's latency is charged to
its vCPU; a write's too, unless it carries ``FLAG_POSTED`` (an LLC write-back, which
never stalls the CPU). A long-delay answer hides nothing by itself: with one thread
per vCPU there is nothing to switch to, so the thread waits for its data and
re-issues the access (latency + an SSD-DRAM hit); several threads per vCPU are
scheduled by :mod:`.threads`, and live runs by the guest (:mod:`.live_switching`).

Page moves count towards no promotion: SkyByte's promotion thread moves pages inside
the device (artifact, ftl.cc ``promotion_thread``), where the guest's kernel copies
them through the device. So the transfer engine's requests (``FLAG_ENGINE``, the
copy's) and the LLC's later write-back of each line such a copy read for ownership
(a demotion's stores, in a design without the write log) are served as any, but
count neither a hit towards promotion nor an access of the promotion window
(``move_requests``). Counted, they made every demoted page hot at once.
"""

from __future__ import annotations

import logging
from collections.abc import Set as AbstractSet
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from cxlssd.errors import InputError
from cxlssd.firmware.cache import (
    REPLACEMENT_POLICIES,
    DataCache,
    FifoPolicy,
    LruPolicy,
    assign_last,
)
from cxlssd.firmware.context_switch import (
    CONTEXT_SWITCH_POLICIES,
    ContextSwitchPolicy,
    NeverSwitch,
    ThresholdSwitch,
)
from cxlssd.firmware.flash import FlashBackend
from cxlssd.firmware.ftl import GC_VICTIM_POLICIES, PLACEMENTS, PageFtl
from cxlssd.firmware.migration import (
    MIGRATION_POLICIES,
    MigrationConfig,
    MigrationPolicy,
    MoveCost,
    SkyByteThreshold,
)
from cxlssd.firmware.profile import Profile
from cxlssd.firmware.request import (
    FLAG_DIRTY,
    FLAG_ENGINE,
    FLAG_OS_MOVE,
    FLAG_POSTED,
    LINE_BYTES,
    PAGE_BYTES,
    PAGE_SHIFT,
    REQUEST_DTYPE,
    RESPONSE_DTYPE,
    Op,
    Source,
)
from cxlssd.firmware.scheduler import FlashTimeline
from cxlssd.firmware.writelog import ALL_LINES, WriteLog

log = logging.getLogger(__name__)

TIMEBASES = ("compute", "issue")
_LINE_MASK = 63
# vectorised-run window (requests): start, floor, ceiling; below the floor the
# controller runs _SCALAR_RUN requests one by one, and tries numpy again (with a
# _VEC_MIN window) only if they ended with at least _VEC_MIN simple requests in a
# row: a numpy run costs ~100 us however short, the per-request path ~1 us a request
_VEC_START, _VEC_MIN, _VEC_MAX, _SCALAR_RUN = 256, 64, 1 << 16, 1024


def _line_bit(addr: int) -> np.uint64:
    """The bit of ``addr``'s line in a page's 64-bit line mask."""
    return np.uint64(1 << ((addr >> 6) & _LINE_MASK))


@dataclass(frozen=True)
class Latencies:
    """The terms of SkyByte's latencies (ns). Its published figures are totals as the
    host sees them, and each term is counted once (shared/DESIGN.md section 1):

    * SSD-DRAM hit (data cache or write log) = device DRAM 46 + CXL link 40 + index 72
      = 158 ns (:attr:`hit_ns`);
    * log append = device DRAM 46 + CXL link 40 = 86 ns (:attr:`log_append_ns`);
    * flash read = the 158 ns path + the flash array's time (and its queueing): the
      read is issued after the link and the index lookup, and the data is read from
      the device DRAM once it is there;
    * host DRAM (promoted pages, dram-only) = 46 ns.
    """

    cxl_link_ns: int = 40
    index_ns: int = 72
    device_dram_ns: int = 46
    host_dram_ns: int = 46

    @property
    def hit_ns(self) -> int:
        """An SSD-DRAM hit, as the host sees it."""
        return self.device_dram_ns + self.cxl_link_ns + self.index_ns

    @property
    def log_append_ns(self) -> int:
        """A write-log append, as the host sees it."""
        return self.device_dram_ns + self.cxl_link_ns

    @property
    def flash_issue_ns(self) -> int:
        """From a request's start to its flash read's issue (a miss in the index)."""
        return self.cxl_link_ns + self.index_ns

    def by_source(self) -> np.ndarray:
        """Latency of a simple (non-flash) access by :class:`Source` (reads; appends
        take :attr:`log_append_ns`)."""
        table = np.zeros(len(Source), dtype=np.int64)
        table[Source.LOG] = table[Source.CACHE] = self.hit_ns
        table[Source.PROMOTED] = table[Source.DRAM] = self.host_dram_ns
        return table


@dataclass
class ModelCounters:
    """Per-request accounting (flash, log and cache keep their own counters)."""

    requests: int = 0  # reads + writes
    reads: int = 0
    writes: int = 0
    notifications: int = 0  # Op.PROMOTED / Op.DEMOTED records
    served: dict[str, int] = field(default_factory=lambda: {s.name.lower(): 0 for s in Source})
    cache_hits: int = 0
    cache_misses: int = 0
    latency_ns_total: int = 0  # sum of modelled latencies
    stall_ns_total: int = 0  # what the vCPUs were charged (latency, or switch cost)
    long_delays: int = 0
    long_delay_latency_ns: int = 0  # latency of the accesses answered with a long delay
    promotions_decided: int = 0
    demotions_decided: int = 0
    promotions_applied: int = 0
    demotions_applied: int = 0
    dirty_demotions: int = 0
    promotions_failed: int = 0  # decided, then given up by the host (host-managed)
    host_accesses: int = 0  # LLC misses served by promoted pages in host DRAM (host-managed)
    # ... of them, a move's copies (a demotion reading its page from host DRAM): the
    # device's work, counted towards no promotion and no recency
    move_host_accesses: int = 0
    move_requests: int = 0  # page moves' requests, counted towards no promotion (docstring)
    demotion_reads_unfilled: int = 0  # a demotion's reads of its new frame, not cached: no fill
    demotion_programs: int = 0  # demoted pages programmed whole, past the data cache
    left_behind_writes: int = 0  # write-backs to a frame freed by its promotion (host DRAM's)


class Controller:
    """One modelled CXL-SSD (or the DRAM-only ideal): state, policies and counters."""

    def __init__(
        self,
        *,
        device_pages: int,
        latencies: Latencies,
        cache: DataCache | None,
        flash: FlashBackend | None,
        write_log: WriteLog | None = None,
        migration: MigrationPolicy | None = None,
        host_capacity_pages: int = 0,
        move_cost: MoveCost | None = None,
        auto_apply: bool = True,
        context_switch: ContextSwitchPolicy | None = None,
        timebase: str = "compute",
        vectorize: bool = True,
        host_managed: bool = False,
    ) -> None:
        if timebase not in TIMEBASES:
            raise ValueError(f"timebase must be one of {TIMEBASES}, got {timebase!r}")
        if host_managed and auto_apply:
            raise ValueError("host-managed promotions are carried out by the host, not auto-applied")
        self.dram_only = cache is None
        self.device_pages = device_pages
        self.latencies = latencies
        self.cache = cache
        self.flash = flash
        self.log = write_log
        self.migration = migration
        self.host_capacity_pages = host_capacity_pages
        self.move_cost = move_cost or MoveCost()
        self.auto_apply = auto_apply
        # The guest OS moves promoted pages (live runs): a promoted page leaves the
        # device (its device page is freed and may be reused), and accesses to it
        # reach the firmware only as counts (count_host_accesses), never as requests.
        self.host_managed = host_managed
        self.context_switch: ContextSwitchPolicy = context_switch or CONTEXT_SWITCH_POLICIES.get(
            "never"
        )()
        self.compute_timebase = timebase == "compute"
        self.vectorize = vectorize
        self.counters = ModelCounters()
        self.set_latencies()  # derived per-source latencies
        self._seq = 0  # requests served so far (recency stamps)
        self._vcpu_stall_ns = [0] * (1 << 16)  # charged stall per vCPU (compute timebase)
        # numpy runs assume a constant promotion threshold: not for per-access policies
        self._numpy_runs = vectorize and not (migration is not None and migration.per_access)
        self._vec_window = _VEC_START if self._numpy_runs else 0
        self._clock_ns = 0
        # promotion state, per device page
        self.promoted = np.zeros(device_pages, dtype=bool)
        self.promoted_dirty = np.zeros(device_pages, dtype=bool)
        self.pending = np.zeros(device_pages, dtype=bool)  # decided, not yet carried out
        self._pending_count = 0  # pending.sum(), kept up to date
        self.last_access = np.zeros(device_pages, dtype=np.int64)  # of promoted pages
        self._promoted_set: set[int] = set()  # device-managed: the pages promoted[] marks
        # host-managed: RAM pages promoted from each device page (its keys are the promoted
        # pages). A promoted page's device page is freed, and the guest may put another
        # page there and promote that too.
        self._host_pages: dict[int, int] = {}
        self._host_total = 0
        self._pending_demotions: set[int] = set()
        # per page, when its last flash fill is done, less the link and index a hit
        # passes first: a hit that starts earlier waits the difference
        self.fill_done_ns = np.zeros(device_pages, dtype=np.int64)
        self.hit_count = np.zeros(device_pages, dtype=np.uint16)
        self.hit_epoch = np.zeros(device_pages, dtype=np.int32)  # window of hit_count
        # per page, the lines a move's copy read for ownership: their next write-back is
        # the move's too (see the module's docstring)
        self.moved_lines = np.zeros(device_pages, dtype=np.uint64)
        # per page, the lines of a demotion's new frame read for ownership while it was not
        # cached: their write-backs go past the data cache (_demoted_line_written)
        self.demoted_lines = np.zeros(device_pages, dtype=np.uint64)
        # host-managed: frames their promotion freed, until the guest reuses them
        # (_left_behind)
        self.freed_by_promotion = np.zeros(device_pages, dtype=bool)
        self._epoch = 0
        self._window_left = migration.window_accesses if migration else 0
        self._window_promoted = 0

    # ----------------------------------------------------------------- building

    @classmethod
    def from_profile(
        cls, profile: Profile, timebase: str = "compute", vectorize: bool = True
    ) -> Controller:
        """Compose a controller from a resolved :class:`~.profile.Profile`."""
        p = profile
        device_pages = p["device.capacity_bytes"] // PAGE_BYTES
        latencies = Latencies(**{k: p[f"latency.{k}"] for k in Latencies.__dataclass_fields__})
        if p["kind"] == "dram-only":
            return cls(
                device_pages=device_pages, latencies=latencies, cache=None, flash=None,
                timebase=timebase, vectorize=vectorize,
            )
        timeline = FlashTimeline(
            p["flash.channels"], p["flash.dies_per_channel"], p["flash.read_ns"],
            p["flash.program_ns"], p["flash.erase_ns"], p["flash.transfer_ns"],
        )
        ftl = PageFtl(
            device_pages, timeline.n_dies, p["flash.pages_per_block"],
            p["flash.overprovisioning"], p["gc.free_threshold"],
            GC_VICTIM_POLICIES.get(p["gc.victim"])(), p["flash.precondition"],
            PLACEMENTS.get(p["flash.placement"])(), p["gc.unit"], p["gc.stop_threshold"],
        )
        flash = FlashBackend(ftl, timeline, p["gc.read_priority"], p["flash.idle_at_roi_begin"])
        log_bytes = p.capacity_bytes("write_log.size_bytes") if p["write_log.enabled"] else 0
        cache_pages = (p.capacity_bytes("ssd_dram.size_bytes") - log_bytes) // PAGE_BYTES
        ways = p["cache.ways"]
        policy = REPLACEMENT_POLICIES.get(p["cache.policy"])(cache_pages // ways * ways)
        cache = DataCache(device_pages, cache_pages, ways, policy)
        write_log = None
        if p["write_log.enabled"]:
            write_log = WriteLog(
                device_pages, log_bytes // p["write_log.entry_bytes"],
                p["write_log.flush_threshold"], cache, flash, p["write_log.compact_to"],
                p["write_log.flush_at_roi_begin"],
            )
        migration = None
        if p["migration.enabled"]:
            config = MigrationConfig(
                **{k: p[f"migration.{k}"] for k in MigrationConfig.__dataclass_fields__}
            )
            migration = MIGRATION_POLICIES.get(p["migration.policy"])(config)
        switch = None
        if p["context_switch.enabled"]:
            switch = CONTEXT_SWITCH_POLICIES.get(p["context_switch.policy"])(
                p["context_switch.threshold_ns"], p["context_switch.switch_cost_ns"]
            )
        return cls(
            device_pages=device_pages, latencies=latencies, cache=cache, flash=flash,
            write_log=write_log, migration=migration,
            host_capacity_pages=p.capacity_bytes("migration.host_capacity_bytes") // PAGE_BYTES,
            move_cost=MoveCost(p["migration.move_host_ns_per_batch"], p["migration.move_host_ns_per_page"]),
            auto_apply=p["migration.auto_apply"], context_switch=switch,
            timebase=timebase, vectorize=vectorize,
        )

    # ----------------------------------------------------------------- public API

    def process(self, requests: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Serve ``requests`` (REQUEST_DTYPE) in order; returns RESPONSE_DTYPE records.

        ``out`` may be a preallocated response array of the same length.
        """
        self._check(requests)
        n = requests.shape[0]
        if out is None:
            out = np.empty(n, dtype=RESPONSE_DTYPE)
        out["promote_page"] = -1
        out["demote_page"] = -1
        pos = 0
        while pos < n:
            if self.vectorize and self._vec_window:
                stop = min(n, pos + self._vec_window)
                if self.migration is not None:
                    stop = min(stop, pos + self._window_left)
                done = self._apply_simple(requests, out, pos, stop)
                pos += done
                if pos == stop:
                    self._vec_window = min(2 * self._vec_window, _VEC_MAX)
                    continue
                if done < 16:
                    self._vec_window //= 2
                    if self._vec_window < _VEC_MIN:
                        self._vec_window = 0
                stop = pos + 1  # the request that was not simple
                self._run_scalar(requests, out, pos, stop)
            elif self.vectorize:
                stop = min(n, pos + _SCALAR_RUN)
                if self._run_fast(requests, out, pos, stop) >= _VEC_MIN and self._numpy_runs:
                    self._vec_window = _VEC_MIN
            else:
                stop = min(n, pos + _SCALAR_RUN)
                self._run_scalar(requests, out, pos, stop)
            pos = stop
        return out

    def submit(
        self, time_ns: int, addr: int, op: int = Op.READ, vcpu: int = 0, size: int = LINE_BYTES,
        flags: int = 0,
    ) -> np.void:
        """Serve one request (a one-element :meth:`process`); returns its response."""
        request = np.zeros(1, dtype=REQUEST_DTYPE)
        request[0] = (time_ns, addr, vcpu, size, op, flags, 0)
        return self.process(request)[0]

    def check_requests(self, requests: np.ndarray) -> None:
        """Raise :class:`InputError` unless every request of ``requests`` is valid."""
        self._check(requests)

    def serve_one(
        self, time_ns: int, addr: int, vcpu: int, op: int, flags: int = 0
    ) -> tuple[int, int, int, bool, int, int]:
        """Serve one request already checked (:meth:`check_requests`), by the reference
        path; returns (start_ns, latency_ns, source, long_delay, promote_page,
        demote_page). For drivers that decide the next request from this answer."""
        return self._step(time_ns, addr, vcpu, op, flags)

    def host_promoted(self, page: int) -> None:
        """The host finished promoting ``page`` (DPA >> 12) into its DRAM."""
        self._apply_promotion(page)

    def host_demoted(self, page: int, dirty: bool = False) -> None:
        """The host moved ``page`` back to the device (``dirty``: written while promoted)."""
        self._apply_demotion(page, dirty, self._now())

    def host_gave_up(self, page: int) -> None:
        """The host could not promote ``page`` (host-managed): it may be decided again."""
        if self.pending[page]:
            self.pending[page] = False
            self._pending_count -= 1
            self.counters.promotions_failed += 1

    def cached(self, page: int) -> bool:
        """Whether ``page`` (DPA >> 12) is in the data cache (SSD DRAM) now."""
        return self.cache is not None and self.cache.lookup(page) >= 0

    def count_host_accesses(self, pages: np.ndarray, moving: np.ndarray | None = None) -> None:
        """LLC misses that promoted pages (original device page numbers) served from
        host DRAM (host-managed): their recency and the migration window's
        promoted share. The CPU already paid the DRAM latency: nothing is charged.
        ``moving`` marks a move's copies (a demotion reads its page from host DRAM):
        SkyByte's promotion thread copies in the device, past its access counting
        (artifact ftl.cc: only ``byte_issue`` counts), so they count towards neither."""
        n = int(pages.shape[0])
        if not n:
            return
        self.counters.host_accesses += n
        if moving is not None and moving.any():
            self.counters.move_host_accesses += int(np.count_nonzero(moving))
            pages = pages[~moving]
            n = int(pages.shape[0])
        if self.migration is None or not n:
            return
        self.last_access[pages] = self._seq
        while n:  # a bulk longer than the window's rest goes on into the next window
            take = min(n, self._window_left)
            self._window_promoted += take
            self._window_left -= take
            n -= take
            if self._window_left == 0:
                self._end_window()

    def charge_stall(self, vcpu: int, stall_ns: int) -> None:
        """Add ``stall_ns`` (negative: take back) to what ``vcpu`` was charged: the live
        context-switch protocol settles long delays after the request was served."""
        self._vcpu_stall_ns[vcpu] += stall_ns
        self.counters.stall_ns_total += stall_ns

    def promoted_pages(self) -> np.ndarray:
        """Pages currently in host DRAM, sorted."""
        return np.array(sorted(self._in_host()), dtype=np.int64)

    def _in_host(self) -> AbstractSet[int]:
        """The device pages that have a copy in host DRAM."""
        return self._host_pages.keys() if self.host_managed else self._promoted_set

    def pending_promotions(self) -> np.ndarray:
        """Pages the firmware decided to promote that the host has not promoted yet."""
        return np.flatnonzero(self.pending)

    def set_latencies(self, **changes: int) -> None:
        """Change fixed latencies (``cxl_link_ns=...``) from the next request on
        (firmware knobs); the derived per-source latencies follow."""
        self.latencies = replace(self.latencies, **changes)
        self._lat_table = self.latencies.by_source()
        self._lat_hit = self.latencies.hit_ns
        self._lat_append = self.latencies.log_append_ns

    def flash_timeline(self) -> FlashTimeline:
        """The flash timing model (its read/program/erase times can change at run time)."""
        if self.flash is None:
            raise InputError("a dram-only design has no flash")
        return self.flash.timeline

    @property
    def now_ns(self) -> int:
        """The firmware's clock: the latest request start it has seen."""
        return self._clock_ns

    def roi_begins(self, time_ns: int) -> None:
        """A ROI begins at device time ``time_ns``: the flash's ``idle_at_roi_begin``,
        then the write log's ``flush_at_roi_begin`` (its flush booked on the idle dies,
        as the artifact books its warm-up flush at time 0 of its measured run)."""
        idled = self.flash is not None and self.flash.roi_begins(time_ns)
        if self.log is not None:
            if idled:
                self.log.end_flush(time_ns)
            self.log.roi_begins(time_ns)

    def vcpu_stall_ns(self, vcpu: int) -> int:
        """The stall charged to ``vcpu`` so far (what its modelled clock adds to
        the requests' ``time_ns`` in the compute timebase)."""
        return self._vcpu_stall_ns[vcpu]

    @property
    def threshold(self) -> int | None:
        """The migration policy's current promotion threshold (None without migration)."""
        return self.migration.threshold if self.migration is not None else None

    def counter_dict(self) -> dict[str, Any]:
        """Every counter, nested by component, plus derived rates."""
        c = self.counters
        out: dict[str, Any] = {"model": asdict(c)}
        lookups = c.cache_hits + c.cache_misses
        out["model"]["cache_hit_rate"] = c.cache_hits / lookups if lookups else 0.0
        out["model"]["mean_latency_ns"] = c.latency_ns_total / c.requests if c.requests else 0.0
        if self.flash is not None:
            out["flash"] = self.flash.counters.as_dict()
            host_bytes = c.writes * LINE_BYTES
            programmed = out["flash"]["programs_total"] * PAGE_BYTES
            # device-level: bytes programmed per byte the host wrote
            out["flash"]["device_write_amplification"] = (
                programmed / host_bytes if host_bytes else 0.0
            )
        if self.cache is not None:
            out["cache"] = {
                "capacity_pages": self.cache.n_slots,
                "occupied_pages": self.cache.occupancy(),
                "evictions": self.cache.evictions,
                "dirty_evictions": self.cache.dirty_evictions,
            }
        if self.log is not None:
            out["write_log"] = self.log.counters.as_dict()
            out["write_log"]["capacity_entries"] = self.log.capacity
        if self.migration is not None:
            history = getattr(self.migration, "history", [])
            out["migration"] = {
                "threshold": self.migration.threshold,
                "promoted_pages": self._host_total if self.host_managed else len(self._promoted_set),
                "threshold_history": [h[0] for h in history],
                "promoted_share_history": [round(h[1], 6) for h in history],
            }
        return out

    # ----------------------------------------------------------------- internals

    def _now(self) -> int:
        """The latest request start seen: when host notifications take effect."""
        return self._clock_ns

    def _check(self, requests: np.ndarray) -> None:
        if requests.dtype != REQUEST_DTYPE:
            raise InputError(
                f"requests must be a numpy array of REQUEST_DTYPE, got dtype {requests.dtype}"
            )
        if requests.shape[0] == 0:
            return
        bad = (requests["op"] > Op.DEMOTED) | (requests["addr"] >> PAGE_SHIFT >= self.device_pages)
        rw = requests["op"] <= Op.WRITE
        offset = requests["addr"] & _LINE_MASK
        bad |= rw & ((requests["size"] == 0) | (offset + requests["size"] > LINE_BYTES))
        if bad.any():
            i = int(np.argmax(bad))
            r = requests[i]
            raise InputError(
                f"request {i} is invalid (op={r['op']}, addr={r['addr']:#x}, size={r['size']}): "
                f"ops are 0-3, addresses must be below the device capacity "
                f"({self.device_pages * PAGE_BYTES} bytes; raise device.capacity_bytes), "
                f"reads/writes must be 1-{LINE_BYTES} bytes within one {LINE_BYTES} B line"
            )

    def _run_scalar(self, requests: np.ndarray, out: np.ndarray, lo: int, hi: int) -> None:
        chunk = requests[lo:hi]
        results = [
            self._step(*fields)
            for fields in zip(
                chunk["time_ns"].tolist(), chunk["addr"].tolist(), chunk["vcpu"].tolist(),
                chunk["op"].tolist(), chunk["flags"].tolist(), strict=True,
            )
        ]
        columns = list(zip(*results, strict=True))
        for name, column in zip(
            ("start_ns", "latency_ns", "source", "long_delay", "promote_page", "demote_page"),
            columns, strict=True,
        ):
            out[name][lo:hi] = column
        out["ready_ns"][lo:hi] = out["start_ns"][lo:hi] + out["latency_ns"][lo:hi]

    def _run_fast(self, requests: np.ndarray, out: np.ndarray, lo: int, hi: int) -> int:
        """Serve ``requests[lo:hi]`` one by one, exactly as :meth:`_step` would.

        The same semantics as ``_step``, with the common cases (promoted, log and
        cache hits; log appends below the flush level; misses) written out inline over
        local variables and memoryviews of the state arrays (scalar access to a
        memoryview or a list is several times cheaper than to a numpy array). Every
        other request (host notifications, a promotion trigger, an append that
        flushes or stalls) goes to ``_step`` itself. Counters of the inline requests
        are added at the end, with numpy (``_step`` counts its own).
        ``test_controller.py`` checks this path against ``vectorize=False``.

        Returns how many requests at the end of the run were simple in the sense of
        :meth:`_apply_simple` (a hint for when numpy runs may pay off again).
        """
        chunk = requests[lo:hi]
        n = hi - lo
        ops = chunk["op"].tolist()
        addrs = chunk["addr"].tolist()
        vcpus = chunk["vcpu"].tolist()
        times = chunk["time_ns"].tolist()
        posted_list = (chunk["flags"] & FLAG_POSTED).tolist()
        # a page move's requests go to _step (_of_a_move): the engine's, and write-backs
        # to a page whose lines a move read
        engine_list = (chunk["flags"] & FLAG_ENGINE).tolist() if self.migration is not None else [0] * n
        moved_lines = self.moved_lines.data
        freed = self.freed_by_promotion.data
        starts = [0] * n
        lats = [0] * n
        srcs = [0] * n
        longs = [False] * n
        stepped: list[int] = []  # requests served by _step
        decisions: list[tuple[int, int, int]] = []
        step = self._step
        stall = self._vcpu_stall_ns
        compute = self.compute_timebase
        dram_only = self.dram_only
        lat_dram = self.latencies.host_dram_ns
        lat_hit = self._lat_hit
        lat_append = self._lat_append
        lat_issue = self.latencies.flash_issue_ns
        lat_device = self.latencies.device_dram_ns
        fill_done = self.fill_done_ns.data
        # context switch: the two shipped policies inline, any other through its method
        cs = self.context_switch
        cs_call = None
        cs_threshold = 1 << 62
        if type(cs) is ThresholdSwitch:
            cs_threshold = cs.threshold_ns
        elif type(cs) is not NeverSwitch:
            cs_call = cs.long_delay
        promoted = self.promoted.data
        promoted_dirty = self.promoted_dirty.data
        last_access = self.last_access.data
        # data cache and flash
        cache = self.cache
        flash = self.flash
        if cache is not None:
            slot_of_page = cache.slot_of_page.data
            cache_dirty = cache.dirty.data
            cache_insert = cache.insert
            policy = cache.policy
            lru_stamp = policy.stamp.data if type(policy) is LruPolicy else None
            policy_hit = None if type(policy) in (LruPolicy, FifoPolicy) else policy.hit
        if flash is not None:
            flash_read = flash.read
            flash_program = flash.program
        # write log
        wlog = self.log
        if wlog is not None:
            log_mask = wlog.mask.data
            flush_mask, flush_until = wlog.flush_mask.data, wlog.flush_until_ns.data
            page_entries = wlog.page_entries.data
            page_first = wlog.page_first.data
            used, inflight, appended = wlog.used, wlog.inflight, wlog.appended
            next_free = wlog.next_free_ns
            flush_level, log_capacity = wlog.flush_level, wlog.capacity
        log_appends = log_invalidations = 0
        # migration
        mig = self.migration
        per_access = False
        if mig is not None:
            pending = self.pending.data
            hit_count = self.hit_count.data
            hit_epoch = self.hit_epoch.data
            threshold = mig.threshold
            window_size = mig.window_accesses
            per_access = mig.per_access
            # the shipped per-access rule inline, any other through its method
            skybyte_rule = mig.config if type(mig) is SkyByteThreshold else None
            if skybyte_rule is not None:
                raise_share = skybyte_rule.raise_at_or_below_share
                max_threshold = skybyte_rule.max_threshold
        epoch = self._epoch
        window_left = self._window_left
        window_promoted = self._window_promoted
        seq = self._seq
        last_complex = -1  # the last miss or _step request
        i = -1
        for op, addr, vcpu, time_ns, posted, engine in zip(
            ops, addrs, vcpus, times, posted_list, engine_list, strict=True
        ):
            i += 1
            page = addr >> 12
            start = time_ns + stall[vcpu] if compute else time_ns
            if op > 1 or engine or (
                mig is not None and (freed[page] or (posted and op == 1 and moved_lines[page]))
            ):
                slow = True
            else:
                slow = False
                write = op == 1
                if dram_only:
                    latency, source = lat_dram, 5  # Source.DRAM
                elif promoted[page]:
                    latency, source = lat_dram, 4  # Source.PROMOTED
                    last_access[page] = seq
                    window_promoted += 1
                    if write:
                        promoted_dirty[page] = True
                else:
                    line = (addr >> 6) & 63
                    append = False
                    if wlog is not None and write:
                        latency, source, append = lat_append, 1, True  # Source.LOG
                        bit = 1 << line
                        old = log_mask[page]
                        if start >= next_free:  # the flush has freed a page: WriteLog.retire
                            wlog.retire(start)
                            inflight, next_free = wlog.inflight, wlog.next_free_ns
                        if used + inflight + 1 > log_capacity or (used + 1 >= flush_level and not inflight):
                            slow = True  # a stall or a compaction: WriteLog.append
                    elif wlog is not None and (  # WriteLog.contains
                        log_mask[page] >> line & 1
                        or (flush_mask[page] >> line & 1 and start < flush_until[page])
                    ) and not (
                        slot_of_page[page] >= 0 and fill_done[page] <= start
                    ):  # as _step: a filled cached page serves the read first
                        latency, source = lat_hit, 1  # Source.LOG
                    else:
                        slot = slot_of_page[page]
                        if slot >= 0:
                            latency, source = lat_hit, 2  # Source.CACHE
                            if fill_done[page] > start:  # the page's fill is still in flight
                                latency += fill_done[page] - start
                        else:
                            source = 3  # Source.FLASH
                    # SkyByte counts data-cache hits only (not log hits, appends or fills in flight)
                    counting = (
                        source == 2 and mig is not None and not pending[page] and fill_done[page] <= start
                    )
                    if counting:
                        count = hit_count[page] + 1 if hit_epoch[page] == epoch else 1
                        if count >= threshold:
                            slow = True  # a promotion decision: _count_hit
                    if not slow:
                        if source == 2:
                            if lru_stamp is not None:
                                lru_stamp[slot] = seq
                            elif policy_hit is not None:
                                policy_hit(slot, seq)
                            if write:
                                cache_dirty[slot] = True
                        elif source == 3:  # a miss, as in _miss
                            done = flash_read(page, start + lat_issue)
                            fill_done[page] = done - lat_issue
                            victim, victim_dirty = cache_insert(page, seq, write)
                            if victim_dirty:
                                flash_program(victim, start)
                            if mig is not None and victim >= 0:
                                hit_count[victim] = 0  # a count lives while the page is cached
                            latency = done + lat_device - start
                            last_complex = i
                        elif append:  # as WriteLog.append
                            log_mask[page] = old | bit
                            if not page_entries[page]:
                                page_first[page] = appended
                            page_entries[page] += 1
                            appended += 1
                            used += 1
                            log_appends += 1
                            if old & bit:
                                log_invalidations += 1
                        if counting:
                            hit_count[page] = count if count < 0xFFFF else 0xFFFF
                            hit_epoch[page] = epoch
                            if per_access:  # no promotion here: only a raise can happen
                                share = window_promoted / (window_size - window_left + 1)
                                if skybyte_rule is None:
                                    assert mig is not None
                                    mig.threshold = threshold
                                    mig.counted_hit(share, False)
                                    threshold = mig.threshold
                                elif share <= raise_share and threshold < max_threshold:
                                    threshold += 1
            if slow:
                # hand over to the reference path with the state it reads
                last_complex = i
                stepped.append(i)
                self._seq = seq
                self._window_left, self._window_promoted = window_left, window_promoted
                if mig is not None:
                    mig.threshold = threshold
                if wlog is not None:
                    wlog.used, wlog.inflight, wlog.appended = used, inflight, appended
                start, latency, source, long_delay, promote, demote = step(
                    time_ns, addr, vcpu, op, int(chunk["flags"][i])
                )
                starts[i] = start
                lats[i] = latency
                srcs[i] = source
                longs[i] = long_delay
                if promote >= 0 or demote >= 0:
                    decisions.append((i, promote, demote))
                seq = self._seq
                epoch = self._epoch
                window_left, window_promoted = self._window_left, self._window_promoted
                if mig is not None:
                    threshold = mig.threshold
                if wlog is not None:
                    used, inflight, appended = wlog.used, wlog.inflight, wlog.appended
                    next_free = wlog.next_free_ns
                continue
            seq += 1
            if posted:
                long_delay = False
            else:
                long_delay = latency > cs_threshold if cs_call is None else cs_call(latency)
                stall[vcpu] += latency + lat_hit if long_delay else latency
            starts[i] = start
            lats[i] = latency
            srcs[i] = source
            longs[i] = long_delay
            if mig is not None:
                window_left -= 1
                if window_left == 0:
                    self._window_promoted = window_promoted
                    mig.threshold = threshold
                    self._end_window()
                    epoch = self._epoch
                    window_left, window_promoted = self._window_left, self._window_promoted
                    threshold = mig.threshold
        self._seq = seq
        self._window_left, self._window_promoted = window_left, window_promoted
        if mig is not None:
            mig.threshold = threshold
        if wlog is not None:
            wlog.used, wlog.inflight, wlog.appended = used, inflight, appended
            wlog.counters.appends += log_appends
            wlog.counters.invalidations += log_invalidations
        o = out[lo:hi]
        o["start_ns"] = starts
        o["latency_ns"] = lats
        o["source"] = srcs
        o["long_delay"] = longs
        o["ready_ns"] = o["start_ns"] + o["latency_ns"]
        for i, promote, demote in decisions:
            o["promote_page"][i] = promote
            o["demote_page"][i] = demote
        # the counters _step would have kept for the inline requests
        if stepped:
            inline = np.ones(n, dtype=bool)
            inline[stepped] = False
            o, chunk = o[inline], chunk[inline]
        k = o.shape[0]
        if k:
            c = self.counters
            latency_a, long_a = o["latency_ns"], o["long_delay"]
            n_writes = int(np.count_nonzero(chunk["op"] == Op.WRITE))
            c.requests += k
            c.writes += n_writes
            c.reads += k - n_writes
            served = np.bincount(o["source"], minlength=len(Source)).tolist()
            for source_id, count_served in enumerate(served):
                if count_served:
                    c.served[Source(source_id).name.lower()] += count_served
            c.cache_hits += served[Source.CACHE]
            c.cache_misses += served[Source.FLASH]
            latency_total = int(latency_a.sum())
            n_long = int(np.count_nonzero(long_a))
            long_latency = int(latency_a[long_a].sum()) if n_long else 0
            posted_latency = int(latency_a[(chunk["flags"] & FLAG_POSTED) != 0].sum())
            c.latency_ns_total += latency_total
            c.stall_ns_total += latency_total - posted_latency + n_long * lat_hit
            c.long_delays += n_long
            c.long_delay_latency_ns += long_latency
            self._clock_ns = max(self._clock_ns, int(o["start_ns"].max()))
        return n - 1 - last_complex

    def _step(
        self, time_ns: int, addr: int, vcpu: int, op: int, flags: int
    ) -> tuple[int, int, int, bool, int, int]:
        """Serve one request: the model's reference semantics.

        Returns (start_ns, latency_ns, source, long_delay, promote_page, demote_page).
        """
        c = self.counters
        page = addr >> PAGE_SHIFT
        start = time_ns + self._vcpu_stall_ns[vcpu] if self.compute_timebase else time_ns
        if op >= Op.PROMOTED:
            c.notifications += 1
            if self.dram_only:
                pass
            elif op == Op.PROMOTED:
                self._apply_promotion(page)
            elif self.promoted[page]:
                self._apply_demotion(page, bool(flags & FLAG_DIRTY), start)
            return start, 0, Source.NONE, False, -1, -1
        if start > self._clock_ns:
            self._clock_ns = start
        seq = self._seq
        self._seq = seq + 1
        c.requests += 1
        write = op == Op.WRITE
        if write:
            c.writes += 1
        else:
            c.reads += 1
        promote = demote = -1
        hit = False  # served by the data cache: counts towards promotion (SkyByte)
        moving = self.migration is not None and self._of_a_move(page, addr, write, flags)
        if self.dram_only:
            latency, source = self.latencies.host_dram_ns, Source.DRAM
        elif self.promoted[page]:
            latency, source = self.latencies.host_dram_ns, Source.PROMOTED
            self.last_access[page] = seq
            self._window_promoted += not moving  # as the window counts (below)
            if write:
                self.promoted_dirty[page] = True
        elif self.freed_by_promotion[page] and self._left_behind(page, write, flags):
            latency, source = self.latencies.host_dram_ns, Source.PROMOTED
            self.last_access[page] = seq
            self._window_promoted += not moving
            c.left_behind_writes += 1
        else:
            line = (addr >> 6) & _LINE_MASK
            wlog = self.log
            if wlog is not None and write:
                ready = wlog.append(page, 1 << line, start)
                latency, source = ready - start + self._lat_append, Source.LOG
            elif wlog is not None and wlog.contains(page, line, start) and not self._filled(page, start):
                # SkyByte's artifact (ftl.cc byte_issue) looks the data cache up before the
                # log's index: a read of a logged line whose page is cached and filled is a
                # cache hit (same 158 ns), counted for promotion and in the LRU order
                latency, source = self._lat_hit, Source.LOG
            else:
                assert self.cache is not None
                slot = int(self.cache.slot_of_page[page])
                if moving and self.demoted_lines[page] and write:
                    past_cache = self._demoted_line_written(page, addr, slot < 0, start)
                else:
                    past_cache = moving and slot < 0 and not write and self._demotion_read(page, addr, flags)
                if past_cache:
                    latency, source = self._lat_hit, Source.CACHE
                elif slot >= 0:
                    self.cache.policy.hit(slot, seq)
                    if write:
                        self.cache.dirty[slot] = True
                    # an access to a page whose fill is in flight waits for the rest of it;
                    # it does not count towards promotion (the artifact's MSHR hit)
                    waiting = max(0, int(self.fill_done_ns[page]) - start)
                    latency, source, hit = self._lat_hit + waiting, Source.CACHE, waiting == 0
                    c.cache_hits += 1
                else:
                    latency, source = self._miss(page, start, seq, write), Source.FLASH
                    c.cache_misses += 1
            if hit and self.migration is not None and not moving:
                promote, demote = self._count_hit(page, start)
        if flags & FLAG_POSTED:
            long_delay, charged = False, 0
        else:
            long_delay = self.context_switch.long_delay(latency)
            # one thread per vCPU: nothing to switch to; it waits, then re-issues the access
            charged = latency + self._lat_hit if long_delay else latency
        self._vcpu_stall_ns[vcpu] += charged
        c.served[Source(source).name.lower()] += 1
        c.latency_ns_total += latency
        c.stall_ns_total += charged
        if long_delay:
            c.long_delays += 1
            c.long_delay_latency_ns += latency
        if self.migration is not None and not moving:
            self._window_left -= 1
            if self._window_left == 0:
                self._end_window()
        return start, latency, source, long_delay, promote, demote

    def _of_a_move(self, page: int, addr: int, write: bool, flags: int) -> bool:
        """Whether a request is a page move's (module docstring), noting the lines the
        engine reads of a page not being promoted: their write-back will be the move's."""
        posted_write = write and flags & FLAG_POSTED
        if not (flags & FLAG_ENGINE or posted_write):
            return False  # (most requests: no line bit to build)
        bit = _line_bit(addr)
        if flags & FLAG_ENGINE:
            if not write and not self.pending[page]:
                self.moved_lines[page] |= bit
        elif not self.moved_lines[page] & bit:
            return False
        else:
            self.moved_lines[page] &= ~bit
        self.counters.move_requests += 1
        return True

    def _left_behind(self, page: int, write: bool, flags: int) -> bool:
        """Whether a request is the LLC's write-back of a line it held of a page before the
        guest promoted it (the kernel's copy read the line; the dirty copy stays in the LLC
        at the old frame's address). In SkyByte the page keeps its address and the line
        lands in the promoted copy in host DRAM (artifact, ftl.cc: ``host_dram`` is looked
        up first), so it costs the device nothing and counts as a promoted page's access.
        Any other request means the guest reuses the frame (a read for ownership of its
        new data, a W design's store): the frame is the device's again."""
        assert self.cache is not None
        if write and flags & FLAG_POSTED and self.cache.slot_of_page[page] < 0:
            return True
        self.freed_by_promotion[page] = False
        return False

    def _demotion_read(self, page: int, addr: int, flags: int) -> bool:
        """Whether a read is a demotion's, of its new frame (not cached): the guest's copy
        reads each line for ownership and overwrites it, so no data is needed. SkyByte
        writes a demoted page to flash past the data cache (artifact, ftl.cc
        ``promotion_thread``: ``single_block_write``; with the write log, 64 appends, as a
        W design's stores are here, with no read), so the frame gets no fill and no slot;
        its line is noted for its write-back."""
        if not flags & FLAG_OS_MOVE or self.pending[page]:
            return False  # a promotion's copy reads its page's data
        self.demoted_lines[page] |= _line_bit(addr)
        self.counters.demotion_reads_unfilled += 1
        return True

    def _demoted_line_written(self, page: int, addr: int, uncached: bool, now: int) -> bool:
        """A write-back of a line noted by :meth:`_demotion_read`: past the data cache
        while the page is not cached (the last such line programs the page once, as
        SkyByte's block write); into the cache if the guest has read the page in since."""
        bit = _line_bit(addr)
        if not self.demoted_lines[page] & bit:
            return False
        self.demoted_lines[page] &= ~bit
        if uncached and not self.demoted_lines[page]:
            assert self.flash is not None
            self.flash.program(page, now)
            self.counters.demotion_programs += 1
        return uncached

    def _filled(self, page: int, time_ns: int) -> bool:
        """Whether ``page`` is in the data cache with its fill done at ``time_ns``."""
        assert self.cache is not None
        return bool(self.cache.slot_of_page[page] >= 0 and self.fill_done_ns[page] <= time_ns)

    def _miss(self, page: int, start: int, seq: int, dirty: bool) -> int:
        """Read ``page`` from flash into the cache; returns the request's latency."""
        assert self.flash is not None and self.cache is not None
        lat = self.latencies
        done = self.flash.read(page, start + lat.flash_issue_ns)
        self.fill_done_ns[page] = done - lat.flash_issue_ns
        victim, victim_dirty = self.cache.insert(page, seq, dirty)
        if victim_dirty:  # write-back in the background, after the read (read priority)
            self.flash.program(victim, start)
        if victim >= 0:
            self.hit_count[victim] = 0  # a page's hit count lives while it is cached
        return done + lat.device_dram_ns - start

    def _count_hit(self, page: int, now: int) -> tuple[int, int]:
        """Count an SSD-DRAM hit on ``page``; returns (promote, demote) decisions or -1."""
        assert self.migration is not None
        if self.pending[page]:
            return -1, -1
        count = int(self.hit_count[page]) if self.hit_epoch[page] == self._epoch else 0
        count += 1
        self.hit_count[page] = min(count, 0xFFFF)
        self.hit_epoch[page] = self._epoch
        if count < self.migration.threshold:
            self._adapt(False)
            return -1, -1
        self.hit_count[page] = 0  # a promoted page counts afresh when it comes back
        self.counters.promotions_decided += 1
        demote = -1
        in_host = self._host_total if self.host_managed else len(self._promoted_set)
        in_use = in_host + self._pending_count - len(self._pending_demotions)
        if self._in_host() and in_use >= self.host_capacity_pages:
            candidates = self._demotion_candidates()
            if candidates.size:
                demote = self.migration.demotion_victim(
                    candidates, self.last_access[candidates]
                )
                self.counters.demotions_decided += 1
        if self.auto_apply:
            if demote >= 0:
                self._apply_demotion(demote, bool(self.promoted_dirty[demote]), now)
            self._apply_promotion(page)
        else:
            self.pending[page] = True
            self._pending_count += 1
            if demote >= 0:
                self._pending_demotions.add(demote)
        self._adapt(True)
        return page, demote

    def _adapt(self, promoted: bool) -> None:
        """After a counted data-cache hit: a per-access policy sees the window's
        promoted share so far (this access included)."""
        assert self.migration is not None
        if self.migration.per_access:
            seen = self.migration.window_accesses - self._window_left + 1
            self.migration.counted_hit(self._window_promoted / seen, promoted)

    def _demotion_candidates(self) -> np.ndarray:
        """Promoted pages not already being demoted, sorted."""
        if self.host_managed or len(self._promoted_set) < 4096:
            return np.array(sorted(self._in_host() - self._pending_demotions), dtype=np.int64)
        candidates = np.flatnonzero(self.promoted)  # the same pages, without sorting a set
        if self._pending_demotions:
            leaving = np.fromiter(self._pending_demotions, dtype=np.int64)
            candidates = candidates[~np.isin(candidates, leaving)]
        return candidates

    def _apply_promotion(self, page: int) -> None:
        if self.promoted[page] or self.dram_only:
            return
        assert self.cache is not None
        # its frame leaves the device: no move's write-back to come (what the LLC still
        # holds of the page is left behind: _left_behind)
        self.moved_lines[page] = 0
        self.demoted_lines[page] = 0
        if self.pending[page]:
            self.pending[page] = False
            self._pending_count -= 1
        if self.host_managed:
            # the device page was freed: nothing to serve from here, only the budget.
            # Its data cache slot is freed too, dirty or not (the data is in host DRAM):
            # SkyByte evicts a promoted page from the SSD DRAM (artifact, ftl.cc
            # promotion_thread: do_promotion_evict)
            assert self.cache is not None
            self.cache.invalidate(page)
            self.freed_by_promotion[page] = True
            self.last_access[page] = self._seq
            self._host_pages[page] = self._host_pages.get(page, 0) + 1
            self._host_total += 1
            self.counters.promotions_applied += 1
            return
        self.promoted[page] = True
        # the cached copy moves to the host; if it was dirty the host copy is too
        self.promoted_dirty[page] = self.cache.invalidate(page)
        self.last_access[page] = self._seq
        self._promoted_set.add(page)
        self.counters.promotions_applied += 1

    def _apply_demotion(self, page: int, dirty: bool, now: int) -> None:
        if self.host_managed and page in self._host_pages:
            # the host's copy went back through the device as ordinary writes
            self._host_pages[page] -= 1
            self._host_total -= 1
            if not self._host_pages[page]:
                del self._host_pages[page]
            self._pending_demotions.discard(page)
            self.counters.demotions_applied += 1
            return
        if not self.promoted[page]:
            return
        assert self.cache is not None
        self.promoted[page] = False
        self.promoted_dirty[page] = False
        self._promoted_set.discard(page)
        self._pending_demotions.discard(page)
        self.counters.demotions_applied += 1
        if not dirty:
            return  # the device's copy is current
        self.counters.dirty_demotions += 1
        if self.log is not None:  # SkyByte: a dirty demotion goes through the write log
            self.log.append(page, ALL_LINES, now)
        else:
            victim, victim_dirty = self.cache.insert(page, self._seq, dirty=True)
            if victim >= 0:
                self.hit_count[victim] = 0
            if victim_dirty:
                assert self.flash is not None
                self.flash.program(victim, now)

    def _end_window(self) -> None:
        assert self.migration is not None
        window = self.migration.window_accesses
        self.migration.end_window(window, self._window_promoted)
        if self.migration.window_resets_counts:
            self._epoch += 1
        self._window_promoted = 0
        self._window_left = self.migration.window_accesses

    # ----------------------------------------------------------------- fast path

    def _apply_simple(self, requests: np.ndarray, out: np.ndarray, lo: int, hi: int) -> int:
        """Serve the longest prefix of ``requests[lo:hi]`` made of simple requests, with
        numpy; returns its length. Equivalent to calling :meth:`_step` on each."""
        r = requests[lo:hi]
        op = r["op"]
        addr = r["addr"]
        page = (addr >> np.uint64(PAGE_SHIFT)).astype(np.int64)
        rw = op <= Op.WRITE
        write = op == Op.WRITE
        source = np.zeros(hi - lo, dtype=np.uint8)
        counted = None  # requests that are SSD-DRAM hits (migration counters)
        appends = None  # log writes
        if self.dram_only:
            simple = rw
            source[:] = Source.DRAM
        else:
            assert self.cache is not None
            promoted = self.promoted[page]
            cached = self.cache.slot_of_page[page] >= 0
            device = rw & ~promoted
            if self.log is not None:
                line = (addr >> np.uint64(6)) & np.uint64(_LINE_MASK)
                logged = ((self.log.mask[page] >> line) & np.uint64(1)).astype(bool)
                appends = device & write
                # a read of a cached page is a cache hit, logged line or not (as _step);
                # one whose page is not cached and whose line was appended earlier in
                # the run, or is being flushed, is taken for a miss, which ends the run
                log_read = device & ~write & logged & ~cached
                cache_hit = device & ~write & cached
                source[appends | log_read] = Source.LOG
            else:
                cache_hit = device & cached
            if cache_hit.any():
                # a hit on a page whose fill may still be in flight is not simple
                cache_hit &= ~self._may_wait_for_fill(r, page)
            source[cache_hit] = Source.CACHE
            source[rw & promoted] = Source.PROMOTED
            simple = source != Source.NONE
            counted = simple & (source == Source.CACHE)
        if self.migration is not None:  # a page move's requests go to _step (_of_a_move)
            flags = r["flags"]
            simple &= (flags & FLAG_ENGINE) == 0
            simple &= ~(write & ((flags & FLAG_POSTED) != 0) & (self.moved_lines[page] != 0))
            simple &= ~self.freed_by_promotion[page]
        k = int(np.argmin(simple)) if not simple.all() else hi - lo
        if appends is not None and k:
            k = self._appends_allowed(appends[:k], k)
        if counted is not None and self.migration is not None and k:
            k = self._hits_allowed(page[:k], counted[:k], k)
        if k == 0:
            return 0
        self._commit_simple(r[:k], out, lo, page[:k], source[:k], write[:k],
                            None if appends is None else line[:k])
        return k

    def _may_wait_for_fill(self, r: np.ndarray, page: np.ndarray) -> np.ndarray:
        """Requests that might meet their page's fill in flight: their earliest
        possible start (stalls only grow) is before the fill is done."""
        floor = r["time_ns"].astype(np.int64)
        if self.compute_timebase:
            vcpu = r["vcpu"]
            for v in np.unique(vcpu).tolist():
                floor[vcpu == v] += self._vcpu_stall_ns[v]
        return self.fill_done_ns[page] > floor

    def _appends_allowed(self, appends: np.ndarray, k: int) -> int:
        """Cut ``k`` before the log append that would start a compaction or stall."""
        assert self.log is not None
        index = np.flatnonzero(appends)
        allowed = self.log.quiet_appends()
        return k if index.size <= allowed else int(index[allowed])

    def _hits_allowed(self, page: np.ndarray, counted: np.ndarray, k: int) -> int:
        """Cut ``k`` before the hit that brings a page's count to the threshold."""
        assert self.migration is not None
        index = np.flatnonzero(counted)
        if index.size == 0:
            return k
        pages = page[index]
        order = np.argsort(pages, kind="stable")
        sorted_pages = pages[order]
        starts = np.ones(index.size, dtype=bool)
        starts[1:] = sorted_pages[1:] != sorted_pages[:-1]
        positions = np.arange(index.size)
        rank = np.empty(index.size, dtype=np.int64)
        rank[order] = positions - np.maximum.accumulate(np.where(starts, positions, 0))
        base = np.where(self.hit_epoch[pages] == self._epoch, self.hit_count[pages], 0)
        total = base + rank + 1
        trigger = (total >= self.migration.threshold) & ~self.pending[pages]
        if trigger.any():
            k = int(index[np.argmax(trigger)])
            keep = index < k
            pages, total = pages[keep], total[keep]
        if pages.size:
            assign_last(self.hit_count, pages, np.minimum(total, 0xFFFF).astype(np.uint16))
            self.hit_epoch[pages] = self._epoch
        return k

    def _commit_simple(
        self, r: np.ndarray, out: np.ndarray, lo: int, page: np.ndarray, source: np.ndarray,
        write: np.ndarray, line: np.ndarray | None,
    ) -> None:
        """Apply the state changes and outputs of ``k`` simple requests."""
        k = r.shape[0]
        hi = lo + k
        c = self.counters
        seq = self._seq + np.arange(k, dtype=np.int64)
        self._seq += k
        latency = self._lat_table[source]
        if line is not None:
            assert self.log is not None
            log_write = write & (source == Source.LOG)
            latency[log_write] = self._lat_append
            self.log.append_batch(page[log_write], line[log_write])
        posted = (r["flags"] & FLAG_POSTED) != 0
        long_delay = self.context_switch.long_delay_batch(latency) & ~posted
        charged = np.where(long_delay, latency + self._lat_hit, np.where(posted, 0, latency))
        time_ns = r["time_ns"].astype(np.int64)
        vcpu = r["vcpu"]
        stall = self._vcpu_stall_ns
        groups = [int(vcpu[0])] if (vcpu == vcpu[0]).all() else np.unique(vcpu).tolist()
        for v in groups:
            mine = slice(None) if len(groups) == 1 else vcpu == v
            running = np.cumsum(charged[mine])
            if self.compute_timebase:
                time_ns[mine] += stall[v] + running - charged[mine]
            stall[v] += int(running[-1])
        self._clock_ns = max(self._clock_ns, int(time_ns.max()))
        if line is not None and log_write.any():  # as each WriteLog.append would
            assert self.log is not None
            self.log.retire(int(time_ns[log_write].max()))
        out["start_ns"][lo:hi] = time_ns
        out["latency_ns"][lo:hi] = latency
        out["ready_ns"][lo:hi] = time_ns + latency
        out["source"][lo:hi] = source
        out["long_delay"][lo:hi] = long_delay
        # component state
        if self.cache is not None:
            hits = source == Source.CACHE
            slots = self.cache.slot_of_page[page[hits]]
            self.cache.policy.hit_batch(slots, seq[hits])
            if self.log is None:
                self.cache.dirty[slots[write[hits]]] = True
            c.cache_hits += int(hits.sum())
            on_host = source == Source.PROMOTED
            if on_host.any():
                assign_last(self.last_access, page[on_host], seq[on_host])
                self.promoted_dirty[page[on_host & write]] = True
                self._window_promoted += int(on_host.sum())
        # counters
        n_writes = int(write.sum())
        c.requests += k
        c.writes += n_writes
        c.reads += k - n_writes
        for s, n in enumerate(np.bincount(source, minlength=len(Source)).tolist()):
            if n:
                c.served[Source(s).name.lower()] += n
        c.latency_ns_total += int(latency.sum())
        c.stall_ns_total += int(charged.sum())
        n_long = int(long_delay.sum())
        if n_long:
            c.long_delays += n_long
            c.long_delay_latency_ns += int(latency[long_delay].sum())
        if self.migration is not None:
            self._window_left -= k
            if self._window_left == 0:
                self._end_window()

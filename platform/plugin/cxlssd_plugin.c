/*
 * cxlssd TCG plugin: the platform's "hardware fast path" (DESIGN.md decision 2).
 *
 * It sees every guest load/store with its guest-physical address and
 *   - counts guest instructions per vCPU (inline scoreboard adds, no callback; per
 *     instruction while active, see on_tb_trans);
 *   - counts per vCPU all accesses, MMIO accesses, CXL loads and CXL stores;
 *     per CXL window loads, stores and distinct 64-byte lines touched;
 *   - runs every cacheable access (RAM and the CXL windows; other MMIO is
 *     uncached) through a shared last-level cache model: set-associative,
 *     64-byte lines, true LRU, write-back, write-allocate; counts per vCPU its
 *     hits, misses and dirty write-backs, split DRAM / CXL;
 *   - turns LLC misses (a read of the line, also for store misses: write-allocate)
 *     and dirty write-backs whose line lies in a CXL window into device requests
 *     and writes them into a single-producer/single-consumer ring in a second
 *     shared-memory file (ring=PATH), which the Python firmware drains;
 *   - keeps the counters in a shared-memory file (shm=PATH) that the platform
 *     reads while the guest runs, and into which it publishes the CXL windows
 *     (with their DPA base) once the guest has committed its regions;
 *   - writes the counters as JSON at exit (out=PATH);
 *   - keeps a local modelled clock per vCPU: instructions x insn_ps plus the
 *     DRAM read latency of every LLC miss outside the windows; device requests
 *     carry it, and the firmware adds the device's stalls (docs/plugin.md);
 *   - recognises ROI markers (an 8-byte NOP, guest/runtime/cxlssd.h) and
 *     snapshots the vCPU's counters into an ROI event table, with a marker
 *     record in the ring so the firmware sees it in stream order;
 *   - answers the guest's clock reads (marker cmd 3): it queues the marker,
 *     waits until the firmware has served everything before it and written
 *     the vCPU's modelled clock into the paravirtual page (pv=PATH, an
 *     ivshmem BAR in the guest), and only then lets the guest read it;
 *   - starts dormant with mode=dormant: only instructions and markers are
 *     watched (boot runs at nearly plain-TCG speed) until the platform asks
 *     for the active mode through the shared header; switching flushes QEMU's
 *     translated code (qemu_plugin_reset) so every block is instrumented anew.
 *
 * Arguments (QEMU: -plugin libcxlssd.so,ARG=VALUE,...):
 *   out=PATH            JSON counters written at exit (atomically: PATH.tmp, rename)
 *   shm=PATH            shared counters file, created (must not exist), layout below
 *   window=BASE:SIZE[:DPA]  a CXL window known at start (repeatable, up to 8);
 *                       C notation (0x.. or decimal), 64-byte aligned, non-overlapping;
 *                       DPA = device physical address of BASE (default 0)
 *   llc=BYTES           LLC size (default 2 MiB; 0 = no LLC: every access misses)
 *   llc_ways=N          LLC associativity (default 16); BYTES / (64 N) must be a power of 2
 *   ring=PATH           device-request ring file, created (must not exist), layout below
 *   ring_records=N      ring capacity in records, a power of 2 (default 65536)
 *   ring_timeout_ms=N   how long a full ring may stall the guest before the
 *                       plugin gives up on the consumer (default 5000)
 *   insn_ps=N           picoseconds per guest instruction (default 333: 3 GHz at CPI 1)
 *   dram_ps=N           picoseconds of an LLC miss to DRAM (default 46000)
 *   string_bytes=N      bytes a REP MOVS/STOS moves in one instruction's time
 *                       (default 32, 1..4096; see count_string_store)
 *   ram_top=BYTES       end of the guest's RAM in physical addresses (default 1 TiB):
 *                       promotion reports for pages above it are ignored, so the
 *                       promoted-page table (4 bytes per RAM page) stays bounded
 *   mode=active|dormant start mode (default active)
 *   pv=PATH             the paravirtual clock page: an existing file of at least
 *                       4096 bytes (also the guest's ivshmem memdev); the plugin
 *                       writes its header, the firmware the answers (clock 0: no
 *                       firmware attached)
 * Any other argument, a malformed value or a repeated key makes loading fail
 * with a message on stderr (QEMU then refuses to start).
 *
 * The shared files' layouts (counters: header, window slots, vCPU slots, ROI events;
 * the ring: header and request records; the pv page) and the marker commands are in
 * abi/cxlssd_abi.h, shared with the firmware's readers (abi/protocol.py) and the
 * guest runtime; docs/plugin.md explains each field. The protocol around them:
 *
 * Counters: the magic is written last (the file is ready when it is there). The
 * platform may rewrite insn_ps, dram_ps and the store-miss mode while dormant; the
 * plugin reads them when it activates. A publisher (the platform) fills window slot
 * n's base, size and DPA, THEN stores n + 1 into the published count; the plugin
 * picks new windows up on the next access. Every counter is monotonic and written
 * with single aligned 64-bit stores, so a reader never sees a torn value (but a
 * snapshot of several counters is not atomic). The instruction count of a vCPU is
 * refreshed on each of its memory accesses, when it goes idle and at exit.
 *
 * Ring: record time_ns = the local clock; a write-back is flagged posted; a marker
 * record has op MARKER, flags = cmd, size 0 and addr = ROI event index << 16 | ROI id
 * (or the guest's arg0). The producer writes a record, then stores head + 1
 * (release); the consumer reads records [tail, head), then stores the new tail
 * (release). Requests are only queued while a consumer is attached; otherwise they
 * are counted as dropped. A full ring stalls the guest (spin, then short sleeps)
 * until the consumer frees space; if the consumer's process is gone or it detaches
 * the plugin stops at once, and after ring_timeout_ms without progress it gives up;
 * either way it sets the producer state (consumer gone or stalled), drops that
 * request and every later one (counted) and never waits again.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cxlssd_abi.h"
#include "qemu_plugin_api.h"

CXLSSD_PLUGIN_EXPORT int qemu_plugin_version = CXLSSD_QEMU_PLUGIN_API_VERSION;

#define LINE_SHIFT 6 /* 64-byte lines */
#define LINE_BYTES (1u << LINE_SHIFT)
/* A window's line bitmap costs size/512 bytes of plugin memory (2 MiB per GiB). */
#define MAX_WINDOW_BYTES (1ULL << 40)
#define QUERY_NONE 0u
#define QUERY_ARMED 1u
#define QUERY_SENT 2u
#define QUERY_IMPLICIT 3u /* a device read the plugin queried on its own: the kernel helper switches */

#define DEFAULT_LLC_BYTES (2ULL << 20)
#define DEFAULT_LLC_WAYS 16u
#define MAX_LLC_WAYS 64u
#define DEFAULT_RING_RECORDS 65536ULL
#define DEFAULT_RING_TIMEOUT_MS 5000ULL
#define DEFAULT_INSN_PS 333ULL
#define DEFAULT_DRAM_PS 46000ULL
#define DEFAULT_STRING_BYTES 32ULL
#define MAX_STRING_BYTES 4096ULL
#define MAX_CLOCK_PS 1000000000ULL /* 1 ms per instruction or miss: surely a mistake */
#define MAX_RAM_TOP (1ULL << 40) /* 1 TiB of guest RAM: a 1 GiB promoted-page table at most */

/* The plugin's private copy of a window, read on the hot path. */
struct window {
    uint64_t base, size, dpa_base;
    uint64_t *lines; /* bitmap of touched lines, NULL if the window was rejected */
    struct cxlssd_window_slot *slot;
};

static struct {
    uint8_t *area; /* the counters: the shm mapping, or private memory without shm= */
    size_t area_bytes;
    struct cxlssd_counters_header *hdr;
    struct cxlssd_window_slot *wslots;
    struct cxlssd_vcpu_slot *vslots;
    struct cxlssd_roi_event *roi;
    unsigned int n_vslots;
    uint64_t *last_insns; /* per vCPU: instructions already on its local clock */
    /* per vCPU: where the running REP MOVS/STOS stores next, and its bytes not yet charged */
    struct string_op {
        uint64_t next_up, next_down, uncharged_bytes;
    } *string_ops;
    uint64_t string_bytes;
    struct cxlssd_pv_slot *pv;   /* the paravirtual clock page's slots (NULL without pv=) */
    unsigned int n_pv;
    uint64_t *clock_seq;  /* per vCPU: clock reads so far */
    uint64_t *query_seq;  /* per vCPU: queries sent to the firmware so far */
    uint8_t *query_state; /* per vCPU: QUERY_NONE / ARMED (marker seen) / SENT */
    uint64_t *promote_due_ps; /* per vCPU: its modelled time of the next look at the mailbox */
    uint8_t *promote_due;     /* per vCPU: a device request passed that time */
    /* Promoted pages: RAM page number -> device page + 1 (0: not promoted), grown on demand. */
    uint32_t *promoted;
    uint64_t promoted_cap, n_promoted;
    uint64_t promoted_max_pfn; /* ram_top >> 12: no table entry at or above it */

    /* Windows taken over from the table; only grows, under `lock`. The hot
     * path reads `n_known` (acquire) and then windows[0 .. n_known). */
    struct window windows[CXLSSD_WINDOW_SLOTS];
    uint32_t n_known;
    /* Bounding range of all known windows: one compare rejects almost every
     * access (all of DRAM) before the per-window loop. */
    uint64_t lo, span;
    pthread_mutex_t lock;

    /* LLC: sets x ways entries, each set ordered most- to least-recently
     * used; an entry is ((line + 1) << 1) | dirty, 0 = invalid. */
    uint64_t *llc;
    uint64_t llc_bytes, llc_set_mask;
    uint32_t llc_ways;
    /* More than one vCPU thread (MTTCG): the LLC and the ring producer are
     * shared, so they go under one spinlock. A single vCPU never takes it. */
    int shared;
    int busy;

    /* Device-request ring (NULL without ring=). */
    struct cxlssd_ring_header *ring;
    struct cxlssd_request *records;
    uint64_t ring_mask, ring_head; /* private copy of head (single producer) */
    uint64_t timeout_ns, insn_ps, dram_ps;
    uint32_t store_miss_write; /* an LLC store miss to CXL memory is a log write, not a fetch */
    uint32_t llc_cold_at_roi;  /* an ROI begins on an empty LLC, its dirty lines dropped */
    uint32_t rois_open;        /* ROI_BEGINs not yet ended (since the activation) */
    int ring_given_up;

    /* Mode: `active` changes only inside the reset callback (all vCPUs stopped). */
    qemu_plugin_id_t id;
    int active;
    int switching; /* a reset is under way */

    struct qemu_plugin_scoreboard *insn_board;
    qemu_plugin_u64 insns;
    const char *out_path;
} P = {.lock = PTHREAD_MUTEX_INITIALIZER};

#define LOAD_RELAXED(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define STORE_RELAXED(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define BUMP(p) STORE_RELAXED((p), *(p) + 1)

/* ---- windows ------------------------------------------------------------- */

static const char *window_problem(uint64_t base, uint64_t size, uint32_t upto)
{
    if (size == 0) {
        return "size is 0";
    }
    if ((base | size) & (LINE_BYTES - 1)) {
        return "base and size must be multiples of 64";
    }
    if (size > MAX_WINDOW_BYTES || base + size < base) {
        return "window too large";
    }
    for (uint32_t i = 0; i < upto; i++) {
        const struct cxlssd_window_slot *w = &P.wslots[i];
        if (!(LOAD_RELAXED(&w->flags) & CXLSSD_WINDOW_REJECTED) && base < w->base + w->size &&
            w->base < base + size) {
            return "overlaps another window";
        }
    }
    return NULL;
}

/* Slow path: take over windows published since the last look. Rare (once per
 * window), so a mutex is fine; it serialises vCPUs racing to do it. */
static void adopt_windows(uint32_t published)
{
    pthread_mutex_lock(&P.lock);
    uint32_t known = P.n_known;
    if (published > CXLSSD_WINDOW_SLOTS) {
        published = CXLSSD_WINDOW_SLOTS;
    }
    for (uint32_t i = known; i < published; i++) {
        struct cxlssd_window_slot *slot = &P.wslots[i];
        struct window *w = &P.windows[i];
        uint64_t base = LOAD_RELAXED(&slot->base), size = LOAD_RELAXED(&slot->size);
        const char *problem = window_problem(base, size, i);
        w->slot = slot;
        if (problem == NULL) {
            w->lines = calloc((size >> LINE_SHIFT) / 64 + 1, sizeof(uint64_t));
            problem = w->lines ? NULL : "out of memory for its line bitmap";
        }
        if (problem != NULL) {
            char msg[160];
            snprintf(msg, sizeof msg, "cxlssd plugin: window %u [%#" PRIx64 " +%#" PRIx64 "] ignored: %s\n",
                     i, base, size, problem);
            fputs(msg, stderr);
            STORE_RELAXED(&slot->flags, CXLSSD_WINDOW_REJECTED);
            w->base = w->size = 0;
            continue;
        }
        w->base = base;
        w->size = size;
        w->dpa_base = LOAD_RELAXED(&slot->dpa_base);
        STORE_RELAXED(&slot->flags, CXLSSD_WINDOW_ACCEPTED);
    }
    /* Recompute the bounding range over the accepted windows. */
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint32_t i = 0; i < published; i++) {
        if (P.windows[i].size) {
            lo = P.windows[i].base < lo ? P.windows[i].base : lo;
            hi = P.windows[i].base + P.windows[i].size > hi ? P.windows[i].base + P.windows[i].size : hi;
        }
    }
    if (hi > lo) {
        STORE_RELAXED(&P.lo, lo);
        STORE_RELAXED(&P.span, hi - lo);
    }
    __atomic_store_n(&P.n_known, published, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&P.lock);
}

/* The window holding physical address pa, or NULL (DRAM, other MMIO). */
static inline struct window *find_window(uint64_t pa, uint32_t known)
{
    if (pa - LOAD_RELAXED(&P.lo) >= LOAD_RELAXED(&P.span)) {
        return NULL;
    }
    for (uint32_t i = 0; i < known; i++) {
        struct window *w = &P.windows[i];
        if (pa - w->base < w->size) {
            return w;
        }
    }
    return NULL;
}

static void touch_lines(struct window *w, uint64_t offset, unsigned int bytes)
{
    uint64_t first = offset >> LINE_SHIFT;
    uint64_t last = (offset + bytes - 1) >> LINE_SHIFT;
    uint64_t max_line = (w->size - 1) >> LINE_SHIFT;
    if (last > max_line) {
        last = max_line;
    }
    for (uint64_t line = first; line <= last; line++) {
        uint64_t *word = &w->lines[line >> 6];
        uint64_t bit = 1ULL << (line & 63);
        /* Plain load first: once a line is marked, no atomic RMW is needed. */
        if (!(LOAD_RELAXED(word) & bit) && !(__atomic_fetch_or(word, bit, __ATOMIC_RELAXED) & bit)) {
            __atomic_fetch_add(&w->slot->lines_touched, 1, __ATOMIC_RELAXED);
        }
    }
}

/* ---- local modelled clock ------------------------------------------------- */

/* Bring vCPU's local clock up to `insns` instructions and return it (ps).
 * Only its own vCPU thread writes a slot's clock. */
static inline uint64_t clock_at(unsigned int vcpu, struct cxlssd_vcpu_slot *s, uint64_t insns)
{
    uint64_t t = s->local_ps + (insns - P.last_insns[vcpu]) * P.insn_ps;
    P.last_insns[vcpu] = insns;
    STORE_RELAXED(&s->local_ps, t);
    return t;
}

/* ---- device-request ring --------------------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void give_up(uint32_t why)
{
    static const char *const causes[] = {
        [CXLSSD_RING_CONSUMER_GONE] = "the firmware (ring consumer) is gone",
        [CXLSSD_RING_CONSUMER_STALLED] = "the firmware (ring consumer) made no progress within the timeout",
    };
    P.ring_given_up = 1;
    __atomic_store_n(&P.ring->producer_state, why, __ATOMIC_RELEASE);
    fprintf(stderr, "cxlssd plugin: %s; device requests are dropped from now on\n", causes[why]);
}

/* One step of waiting for the consumer: sleep a little (two cores are shared
 * with it: sleep rather than spin) and, every 64 steps, check it is still
 * there and progressing. Returns 1 after giving up on it. */
static int consumer_lost(uint64_t start, uint64_t spins)
{
    struct cxlssd_ring_header *r = P.ring;
    struct timespec pause = {0, 20000};
    nanosleep(&pause, NULL);
    if ((spins & 63) == 0) {
        uint64_t pid = LOAD_RELAXED(&r->consumer_pid);
        if (LOAD_RELAXED(&r->consumer_state) != CXLSSD_RING_ATTACHED ||
            (pid != 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH)) {
            give_up(CXLSSD_RING_CONSUMER_GONE);
            return 1;
        }
        if (now_ns() - start > P.timeout_ns) {
            give_up(CXLSSD_RING_CONSUMER_STALLED);
            return 1;
        }
    }
    return 0;
}

static struct {
    uint64_t waits, sleeps, wait_ns;
} firmware_waits;

/* What the vCPU waits for: room in the ring, an answer in a pv word, the ring served. */
static int room_left(const uint64_t *tail, uint64_t head)
{
    return head - __atomic_load_n(tail, __ATOMIC_ACQUIRE) <= P.ring_mask;
}

static int answered(const uint64_t *answer, uint64_t seq)
{
    return __atomic_load_n(answer, __ATOMIC_ACQUIRE) == seq;
}

static int served_up_to(const uint64_t *tail, uint64_t head)
{
    return __atomic_load_n(tail, __ATOMIC_ACQUIRE) >= head;
}

/* Wait until `done(word, value)`: spin a little (a short answer comes within
 * microseconds), then sleep in short steps. 1 when done, 0 after giving up on the
 * consumer (never to wait again). */
static int wait_for_consumer(int (*done)(const uint64_t *, uint64_t), const uint64_t *word, uint64_t value)
{
    uint64_t start = now_ns(), spins = 0;
    int ok = 1;
    while (!done(word, value)) {
        if (++spins < 1024) {
            __builtin_ia32_pause();
        } else if (consumer_lost(start, spins)) {
            ok = 0;
            break;
        }
    }
    /* host time the vCPUs waited for the firmware: emulation cost, not a result */
    __atomic_fetch_add(&firmware_waits.waits, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&firmware_waits.sleeps, spins < 1024 ? 0 : spins - 1023, __ATOMIC_RELAXED);
    __atomic_fetch_add(&firmware_waits.wait_ns, now_ns() - start, __ATOMIC_RELAXED);
    return ok;
}

/* Wait until the ring has room for one record. Returns 0 when it does, or
 * gives up on the consumer (never to wait again) and returns -1. */
static int ring_wait(void)
{
    struct cxlssd_ring_header *r = P.ring;
    uint64_t start = now_ns();
    __atomic_fetch_add(&r->full_waits, 1, __ATOMIC_RELAXED);
    const int room = wait_for_consumer(room_left, &r->tail, P.ring_head);
    __atomic_fetch_add(&r->wait_ns, now_ns() - start, __ATOMIC_RELAXED);
    return room ? 0 : -1;
}

/* A free ring slot for one record, or NULL (the record is dropped: no
 * consumer, or it was given up on). */
static struct cxlssd_request *ring_slot(void)
{
    struct cxlssd_ring_header *r = P.ring;
    if (P.ring_given_up || LOAD_RELAXED(&r->consumer_state) != CXLSSD_RING_ATTACHED ||
        (P.ring_head - __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE) > P.ring_mask && ring_wait() != 0)) {
        __atomic_fetch_add(&r->dropped, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    return &P.records[P.ring_head & P.ring_mask];
}

static void ring_publish(struct cxlssd_request *rec, uint64_t time_ps, uint64_t addr, unsigned int vcpu, uint16_t size,
                         uint8_t op, uint8_t flags)
{
    rec->time_ns = time_ps / 1000u;
    rec->addr = addr;
    rec->vcpu = (uint16_t)vcpu;
    rec->size = size;
    rec->op = op;
    rec->flags = flags;
    /* the kernel helper's word: the pid fits (the guest's pid_max is 32 768 up to 32 vCPUs) */
    rec->thread = vcpu < P.n_pv ? (uint16_t)LOAD_RELAXED(&P.pv[vcpu].thread) : 0;
    P.ring_head++;
    __atomic_store_n(&P.ring->head, P.ring_head, __ATOMIC_RELEASE);
}

/* Transparent context switching (docs/host-os.md): with doorbell_fd=N (the eventfd of
 * vector 0 of the guest's ivshmem-doorbell device, inherited from the platform) and a
 * firmware that switches (CXLSSD_FEATURE_CONTEXT_SWITCH in the pv header), every device
 * read is a query the vCPU waits for. On a long-delay answer the plugin rings the doorbell
 * and holds the vCPU until QEMU's main loop has taken the ring (the eventfd reads empty
 * again), which it does in the same handler that raises the guest's MSI-X interrupt: the
 * guest kernel helper then takes it at the next block boundary (measured: the interrupt
 * entry, or one translation block later) and parks the thread. */
#define DOORBELL_TIMEOUT_NS 100000000ULL
/* QEMU's main loop reads the eventfd, then raises the MSI-X interrupt: a vCPU let go
 * at once can start the next translation block before the interrupt is pending, and
 * the kernel reacts a block late. Held this much longer, it (nearly) never is. */
#define DOORBELL_GRACE_NS 20000ULL
/* A vector of the doorbell the plugin rings: its eventfd and the host time ringing cost. */
struct doorbell {
    int fd;
    uint64_t rings, timeouts, wait_ns, max_wait_ns;
};
static struct doorbell switch_bell = {.fd = -1};
/* Promotion (docs/host-os.md): with promote_fd=N (vector 1's eventfd) and a firmware that
 * promotes, decisions reach the guest at points fixed by its execution. At its first device
 * request after every PROMOTE_CHECK_PS of a vCPU's modelled time, the vCPU waits until the
 * firmware has served every request so far, so the mailbox holds all their decisions
 * however far the firmware lagged in host time; if decisions came since the last ring, the
 * plugin rings vector 1 and holds the vCPU as for a switch, and the kernel helper wakes the
 * promotion daemon at the next block boundary. 100 us is ours: the interval the daemon
 * polled at before. */
#define PROMOTE_CHECK_PS 100000000ULL
static struct doorbell promote_bell = {.fd = -1};
static uint64_t promote_checks, promote_rung_head = UINT64_MAX;
static const struct cxlssd_pv_header *pv_header;
/* cache_map=PATH: per device page, its SSD DRAM slot or -1, published by the firmware: only
 * reads of pages not cached may be long, so only they are asked about (a round trip to the
 * firmware each). The firmware is behind the vCPU: a page it evicts in requests it has not
 * served yet still shows as cached, and its read is then charged in full without a switch. */
static const int32_t *cache_map;
static uint64_t cache_map_pages;

/* Whether a device read of `vcpu` at device address `addr` is a query of its own (no QUERY
 * marker before it): a page that may be long under a design that switches. */
static inline int implicit_query(unsigned int vcpu, uint64_t addr)
{
    if (switch_bell.fd < 0 || vcpu >= P.n_pv || P.query_state[vcpu] != QUERY_NONE) {
        return 0;
    }
    /* Only inside an ROI unless the design asks for more: outside, nothing is a result,
     * and each query costs a round trip to the firmware and a doorbell (docs/host-os.md). */
    const uint32_t features = LOAD_RELAXED(&pv_header->features);
    if (!(features & CXLSSD_FEATURE_CONTEXT_SWITCH) ||
        (!(features & CXLSSD_FEATURE_SWITCH_OUTSIDE_ROI) && LOAD_RELAXED(&P.rois_open) == 0)) {
        return 0;
    }
    uint64_t page = addr >> 12;
    return cache_map == NULL || page >= cache_map_pages || LOAD_RELAXED(&cache_map[page]) < 0;
}

/* A request is issued at the vCPU's local clock; the firmware adds its latency
 * to the vCPU's stall unless it is posted (a write-back never stalls the vCPU). */
static void device_request(unsigned int vcpu, struct cxlssd_vcpu_slot *s, const struct window *w, uint64_t line,
                           uint8_t op, int posted, uint64_t now_ps)
{
    if (op == CXLSSD_OP_READ) {
        BUMP(&s->device_reads);
    } else {
        BUMP(&s->device_writes);
    }
    if (P.ring == NULL) {
        return; /* counting only */
    }
    struct cxlssd_request *rec = ring_slot();
    if (rec == NULL) {
        BUMP(&s->device_dropped);
        return;
    }
    uint8_t flags = posted ? CXLSSD_FLAG_POSTED : 0;
    const uint64_t addr = (line << LINE_SHIFT) - w->base + w->dpa_base;
    if (op == CXLSSD_OP_READ && P.query_state != NULL && P.query_state[vcpu] == QUERY_ARMED) {
        flags = CXLSSD_FLAG_QUERY;
        P.query_state[vcpu] = QUERY_SENT;
    } else if (op == CXLSSD_OP_READ && !posted && implicit_query(vcpu, addr)) {
        flags = CXLSSD_FLAG_QUERY;
        P.query_state[vcpu] = QUERY_IMPLICIT;
    }
    ring_publish(rec, now_ps, addr, vcpu, LINE_BYTES, op, flags);
    if (promote_bell.fd >= 0 && vcpu < P.n_pv && now_ps >= P.promote_due_ps[vcpu]) {
        P.promote_due[vcpu] = 1;
    }
}

/* An LLC miss on a promoted page: DRAM serves it (the local clock already has
 * the DRAM latency); the firmware counts it for its promotion policy. */
static inline void host_request(unsigned int vcpu, uint64_t line, int store, uint64_t now_ps)
{
    uint64_t pfn = line >> (12 - LINE_SHIFT);
    if (P.ring == NULL || pfn >= P.promoted_cap || P.promoted[pfn] == 0) {
        return;
    }
    struct cxlssd_request *rec = ring_slot();
    if (rec != NULL) {
        uint64_t addr = (uint64_t)(P.promoted[pfn] - 1) << 12 | (line << LINE_SHIFT & 0xfffu);
        ring_publish(rec, now_ps, addr, vcpu, LINE_BYTES, store ? CXLSSD_OP_WRITE : CXLSSD_OP_READ, CXLSSD_FLAG_HOST | CXLSSD_FLAG_POSTED);
    }
}

/* ---- LLC ------------------------------------------------------------------- */

/* One access to one line: LRU lookup, fill on a miss, write-back of a dirty
 * victim. Caller holds the spinlock if vCPUs share the cache. */
static void llc_access(unsigned int vcpu, struct cxlssd_vcpu_slot *s, uint64_t line, int store, struct window *w,
                       uint32_t known, uint64_t insns)
{
    const uint64_t key = (line + 1) << 1;
    const uint32_t ways = P.llc_ways;
    uint64_t *set = P.llc + (line & P.llc_set_mask) * ways;
    const int cxl = w != NULL;
    if ((set[0] & ~1ULL) == key) { /* MRU hit: the common case, no reordering */
        set[0] |= (uint64_t)store;
        BUMP(&s->llc_hits[cxl]);
        return;
    }
    for (uint32_t i = 1; i < ways; i++) {
        uint64_t e = set[i];
        if ((e & ~1ULL) == key) {
            memmove(set + 1, set, i * sizeof *set);
            set[0] = e | (uint64_t)store;
            BUMP(&s->llc_hits[cxl]);
            return;
        }
    }
    /* Miss: the LRU way goes, everything shifts down one, the line enters at MRU. */
    uint64_t victim = set[ways - 1];
    memmove(set + 1, set, (ways - 1) * sizeof *set);
    set[0] = key | (uint64_t)store;
    BUMP(&s->llc_misses[cxl]);
    uint64_t now_ps = clock_at(vcpu, s, insns);
    if (w != NULL && store && P.store_miss_write) {
        /* SkyByte's W designs: the store's line goes to the write log without a
         * fetch (the CPU waits for the append); the log holds it, so the LLC's copy is clean. */
        set[0] = key;
        device_request(vcpu, s, w, line, CXLSSD_OP_WRITE, 0, now_ps);
    } else if (w != NULL) {
        device_request(vcpu, s, w, line, CXLSSD_OP_READ, 0, now_ps); /* fill (read for ownership on a store) */
    } else {
        STORE_RELAXED(&s->local_ps, now_ps + P.dram_ps); /* blocking read from DRAM */
        if (P.n_promoted) {
            host_request(vcpu, line, store, now_ps);
        }
    }
    if (victim & 1) {
        uint64_t vline = (victim >> 1) - 1;
        struct window *vw = find_window(vline << LINE_SHIFT, known);
        BUMP(&s->writebacks[vw != NULL]);
        if (vw != NULL) {
            device_request(vcpu, s, vw, vline, CXLSSD_OP_WRITE, 1, now_ps);
        }
    }
}

/* Every line invalid, none dirty (nothing is written back). */
static void llc_clear(void)
{
    memset(P.llc, 0, (P.llc_set_mask + 1) * P.llc_ways * sizeof *P.llc);
}

static void llc_lock(void)
{
    while (__atomic_exchange_n(&P.busy, 1, __ATOMIC_ACQUIRE)) {
        while (LOAD_RELAXED(&P.busy)) {
            __builtin_ia32_pause();
        }
    }
}

static void llc_unlock(void)
{
    __atomic_store_n(&P.busy, 0, __ATOMIC_RELEASE);
}

/* ---- hot path ------------------------------------------------------------ */

/* Runs after every guest load/store. Kept lean: a RAM access costs the hwaddr
 * lookup, a few counter stores, one range compare and (usually) one tag
 * compare at the MRU way of its LLC set. CXL accesses are MMIO in QEMU 10.0
 * and already cost ~0.5 us each in QEMU, so their extra work here is noise. */
static inline void mem_access(unsigned int vcpu, qemu_plugin_meminfo_t info, uint64_t vaddr)
{
    struct cxlssd_vcpu_slot *s = &P.vslots[vcpu];
    BUMP(&s->mem_accesses);
    /* Keeps the live instruction count current for readers of the shm file:
     * the scoreboard (inline adds) lives in QEMU's memory, not in the file. */
    const uint64_t insns = qemu_plugin_u64_get(P.insns, vcpu);
    STORE_RELAXED(&s->insns, insns);

    struct qemu_plugin_hwaddr *hw = qemu_plugin_get_hwaddr(info, vaddr);
    if (__builtin_expect(hw == NULL, 0)) {
        return;
    }
    const int io = qemu_plugin_hwaddr_is_io(hw);
    if (io) {
        BUMP(&s->io_accesses);
    }

    uint32_t published = LOAD_RELAXED(&P.hdr->n_windows);
    uint32_t known = __atomic_load_n(&P.n_known, __ATOMIC_ACQUIRE);
    if (__builtin_expect(published != known, 0)) {
        adopt_windows(published);
        known = __atomic_load_n(&P.n_known, __ATOMIC_ACQUIRE);
    }
    const uint64_t pa = qemu_plugin_hwaddr_phys_addr(hw);
    const int store = qemu_plugin_mem_is_store(info);
    const unsigned int bytes = 1u << qemu_plugin_mem_size_shift(info);
    struct window *w = find_window(pa, known);
    if (w != NULL) {
        if (store) {
            BUMP(&s->cxl_stores);
            __atomic_fetch_add(&w->slot->stores, 1, __ATOMIC_RELAXED);
        } else {
            BUMP(&s->cxl_loads);
            __atomic_fetch_add(&w->slot->loads, 1, __ATOMIC_RELAXED);
        }
        touch_lines(w, pa - w->base, bytes);
    } else if (io) {
        return; /* MMIO outside the CXL windows is uncached: no LLC */
    }

    /* An access spanning two lines touches both (taken as physically
     * contiguous: a page-crossing access is split by QEMU's softmmu anyway). */
    uint64_t line = pa >> LINE_SHIFT, last = (pa + bytes - 1) >> LINE_SHIFT;
    if (P.shared) {
        llc_lock();
    }
    if (P.llc != NULL) {
        llc_access(vcpu, s, line, store, w, known, insns);
        if (__builtin_expect(last != line, 0)) {
            llc_access(vcpu, s, last, store, find_window(last << LINE_SHIFT, known), known, insns);
        }
    } else {
        /* No LLC: every access is a miss, and a store is a posted write. */
        for (uint64_t l = line; l <= last; l++) {
            struct window *lw = l == line ? w : find_window(l << LINE_SHIFT, known);
            uint64_t now_ps = clock_at(vcpu, s, insns);
            BUMP(&s->llc_misses[lw != NULL]);
            if (lw != NULL) {
                device_request(vcpu, s, lw, l, store ? CXLSSD_OP_WRITE : CXLSSD_OP_READ, store, now_ps);
            } else {
                if (!store) {
                    STORE_RELAXED(&s->local_ps, now_ps + P.dram_ps);
                }
                if (P.n_promoted) {
                    host_request(vcpu, l, store, now_ps);
                }
            }
        }
    }
    if (P.shared) {
        llc_unlock();
    }
}

/* A REP MOVS/STOS store: TCG runs the op one element (1-8 bytes) per iteration, and
 * counting each iteration as an instruction charged a 4 KiB page copy 4 096
 * instructions (1.4 us) where a core with fast strings (the guest's CPU reports erms
 * and fsrm) moves it at tens of bytes a cycle. The op is charged one instruction when
 * it starts and one per string_bytes bytes it stores; its line misses are charged by
 * the LLC model as for any access. An op starts where a store does not continue the
 * previous one (the next element up, or down with the direction flag set); one with a
 * zero count stores nothing and is not counted. */
static void count_string_store(unsigned int vcpu, uint64_t vaddr, unsigned int bytes)
{
    struct string_op *op = &P.string_ops[vcpu];
    uint64_t charge = 0;
    if (vaddr != op->next_up && vaddr != op->next_down) {
        charge = 1;
        op->uncharged_bytes = 0;
    }
    op->next_up = vaddr + bytes;
    op->next_down = vaddr - bytes;
    op->uncharged_bytes += bytes;
    charge += op->uncharged_bytes / P.string_bytes;
    op->uncharged_bytes %= P.string_bytes;
    if (charge) {
        qemu_plugin_u64_add(P.insns, vcpu, charge);
    }
}

static void answer_query(unsigned int vcpu);
static void look_at_mailbox(unsigned int vcpu, int idle);

static void on_mem(unsigned int vcpu, qemu_plugin_meminfo_t info, uint64_t vaddr, void *userdata)
{
    if (__builtin_expect(vcpu >= P.n_vslots, 0)) {
        return;
    }
    if (userdata != NULL && qemu_plugin_mem_is_store(info)) {
        count_string_store(vcpu, vaddr, 1u << qemu_plugin_mem_size_shift(info));
    }
    mem_access(vcpu, info, vaddr);
    if (__builtin_expect(P.query_state != NULL && P.query_state[vcpu] != QUERY_NONE, 0)) {
        answer_query(vcpu);
    }
    if (__builtin_expect(P.promote_due != NULL && vcpu < P.n_pv && P.promote_due[vcpu], 0)) {
        look_at_mailbox(vcpu, 0);
    }
}

/* ---- markers and modes --------------------------------------------------- */

/* The marker code (cmd << 16 | id) of a marker instruction, or 0. */
static uint32_t marker_code(const struct qemu_plugin_insn *insn)
{
    uint8_t b[CXLSSD_MARKER_BYTES];
    if (qemu_plugin_insn_size(insn) != CXLSSD_MARKER_BYTES || qemu_plugin_insn_data(insn, b, sizeof b) != sizeof b) {
        return 0;
    }
    if (b[0] != 0x0f || b[1] != 0x1f || b[2] != 0x84 || b[3] != 0x00 || b[7] != (CXLSSD_MARKER_MAGIC >> 24)) {
        return 0;
    }
    uint32_t cmd = b[6];
    return cmd >= CXLSSD_CMD_ROI_BEGIN && cmd <= CXLSSD_CMD_LAST ? cmd << 16 | b[5] << 8 | b[4] : 0;
}

/* Whether the instruction is a REP MOVS or REP STOS (the fast-string ops): legacy
 * prefixes including F3 or F2, an optional REX, then A4/A5 (MOVS) or AA/AB (STOS).
 * The guest's code is 64-bit; 0x40-0x4f is taken as REX. */
static int is_fast_string(const struct qemu_plugin_insn *insn)
{
    uint8_t b[15];
    size_t n = qemu_plugin_insn_data(insn, b, sizeof b);
    int rep = 0;
    size_t i = 0;
    for (; i < n; i++) {
        if (b[i] == 0xf3 || b[i] == 0xf2) {
            rep = 1;
        } else if (b[i] != 0x66 && b[i] != 0x67 && b[i] != 0x2e && b[i] != 0x3e && b[i] != 0x26 &&
                   b[i] != 0x36 && b[i] != 0x64 && b[i] != 0x65 && b[i] != 0xf0) {
            break;
        }
    }
    if (i < n && (b[i] & 0xf0) == 0x40) {
        i++;
    }
    return rep && i < n && (b[i] == 0xa4 || b[i] == 0xa5 || b[i] == 0xaa || b[i] == 0xab);
}

/* Wait until the firmware stores `seq` at `answer`; 0 if it was lost meanwhile. */
static int await_answer(const uint64_t *answer, uint64_t seq)
{
    return wait_for_consumer(answered, answer, seq);
}

/* Ring `bell`; with `hold`, keep the vCPU until QEMU has taken the ring (not from a vCPU
 * that idles: it holds QEMU's global lock there, which the main loop needs to take it). */
static void ring_doorbell(struct doorbell *bell, int hold)
{
    uint64_t one = 1, start = now_ns();
    if (write(bell->fd, &one, sizeof one) != (ssize_t)sizeof one) {
        return;
    }
    bell->rings++;
    if (!hold) {
        return;
    }
    struct pollfd pending = {.fd = bell->fd, .events = POLLIN};
    while (poll(&pending, 1, 0) == 1 && (pending.revents & POLLIN)) {
        if (now_ns() - start > DOORBELL_TIMEOUT_NS) {
            if (bell->timeouts++ == 0) {
                fputs("cxlssd plugin: QEMU did not take a doorbell ring within 100 ms\n", stderr);
            }
            break;
        }
        __builtin_ia32_pause();
    }
    for (uint64_t taken = now_ns(); now_ns() - taken < DOORBELL_GRACE_NS;) {
        __builtin_ia32_pause();
    }
    uint64_t waited_ns = now_ns() - start; /* host time the vCPU was held (emulation cost, not a result) */
    bell->wait_ns += waited_ns;
    bell->max_wait_ns = waited_ns > bell->max_wait_ns ? waited_ns : bell->max_wait_ns;
}

/* Wait until the firmware has served every request published so far; 0 if it was lost. */
static int ring_served(void)
{
    return wait_for_consumer(served_up_to, &P.ring->tail, P.ring_head);
}

/* A look at the mailbox (see promote_bell): PROMOTE_CHECK_PS after the last, or when the
 * vCPU idles (`idle`: nothing else would ring for the decisions of its last requests). */
static void look_at_mailbox(unsigned int vcpu, int idle)
{
    if (!idle) {
        P.promote_due[vcpu] = 0;
        P.promote_due_ps[vcpu] = LOAD_RELAXED(&P.vslots[vcpu].local_ps) + PROMOTE_CHECK_PS;
    }
    if (!(LOAD_RELAXED(&pv_header->features) & CXLSSD_FEATURE_PROMOTION) || P.ring_given_up) {
        return;
    }
    if (P.shared) {
        llc_lock(); /* P.ring_head is the producers' */
    }
    const int served = ring_served();
    if (P.shared) {
        llc_unlock();
    }
    if (!served) {
        return;
    }
    promote_checks++;
    const struct cxlssd_pv_mailbox *box =
        (const struct cxlssd_pv_mailbox *)((const uint8_t *)pv_header + pv_header->mailbox_offset);
    const uint64_t head = __atomic_load_n(&box->head, __ATOMIC_ACQUIRE);
    if (head != LOAD_RELAXED(&box->tail) && head != promote_rung_head) {
        promote_rung_head = head;
        ring_doorbell(&promote_bell, !idle);
    }
}

/* The access after a query marker has happened: if it went to the device, wait
 * for the firmware's answer (long delay or not, ready time, ticket); if it did
 * not (an LLC hit, RAM: a promoted page), the data is there: not long. */
static void answer_query(unsigned int vcpu)
{
    struct cxlssd_pv_slot *slot = &P.pv[vcpu];
    const uint8_t state = P.query_state[vcpu];
    P.query_state[vcpu] = QUERY_NONE;
    if (state == QUERY_SENT || state == QUERY_IMPLICIT) {
        uint64_t ticket = ++P.query_seq[vcpu];
        if (await_answer(&slot->query_ticket, ticket)) {
            if (state == QUERY_IMPLICIT && __atomic_load_n(&slot->query_long, __ATOMIC_ACQUIRE)) {
                ring_doorbell(&switch_bell, 1);
            }
            return;
        }
    }
    STORE_RELAXED(&slot->query_long, 0);
    STORE_RELAXED(&slot->query_ready_ns, 0);
}

/* Record (or forget) that device page `page` lives in RAM at `ram_pa`. */
static void set_promoted(uint64_t ram_pa, uint64_t page, int promoted)
{
    uint64_t pfn = ram_pa >> 12;
    if (page >= UINT32_MAX || pfn >= P.promoted_max_pfn) {
        return; /* not a page of the guest's RAM (a guest-supplied report): ignored */
    }
    if (pfn >= P.promoted_cap) {
        if (!promoted) {
            return;
        }
        uint64_t cap = P.promoted_cap ? P.promoted_cap : 1u << 16;
        while (cap <= pfn) {
            cap *= 2;
        }
        uint32_t *grown = realloc(P.promoted, cap * sizeof *grown);
        if (grown == NULL) {
            return;
        }
        memset(grown + P.promoted_cap, 0, (cap - P.promoted_cap) * sizeof *grown);
        P.promoted = grown;
        P.promoted_cap = cap;
    }
    uint32_t was = P.promoted[pfn];
    P.promoted[pfn] = promoted ? (uint32_t)page + 1 : 0;
    P.n_promoted += (uint64_t)(promoted && !was) - (uint64_t)(!promoted && was);
}

/* The run-time markers (query, switch, resume, promotion reports): arguments
 * from the vCPU's pv slot; a record in the ring so the firmware sees them in
 * stream order. Not ROI events. */
static void runtime_marker(unsigned int vcpu, uint32_t cmd, uint32_t id, uint64_t now_ps)
{
    if (vcpu >= P.n_pv) {
        return;
    }
    struct cxlssd_pv_slot *slot = &P.pv[vcpu];
    if (cmd == CXLSSD_CMD_QUERY) {
        P.query_state[vcpu] = QUERY_ARMED;
        return;
    }
    /* A SWITCH says in its id who switched (CXLSSD_SWITCH_*), a DAEMON whether the daemon
     * left or got back its CPU: the kernel's, no argument in the slot to race on. */
    const int by_id = cmd == CXLSSD_CMD_SWITCH || cmd == CXLSSD_CMD_DAEMON;
    uint64_t arg0 = by_id ? id : LOAD_RELAXED(&slot->arg0), arg1 = LOAD_RELAXED(&slot->arg1);
    if (P.shared) {
        llc_lock();
    }
    if (cmd == CXLSSD_CMD_DEMOTED && arg1 >> 12 < P.promoted_cap && P.promoted[arg1 >> 12] != 0) {
        arg0 = P.promoted[arg1 >> 12] - 1; /* the device page it was promoted from */
    }
    if (cmd == CXLSSD_CMD_PROMOTED || cmd == CXLSSD_CMD_DEMOTED) {
        set_promoted(arg1, arg0, cmd == CXLSSD_CMD_PROMOTED);
    }
    if (P.ring != NULL) {
        struct cxlssd_request *rec = ring_slot();
        if (rec != NULL) {
            ring_publish(rec, now_ps, arg0, vcpu, 0, CXLSSD_OP_MARKER, (uint8_t)cmd);
        }
    }
    if (P.shared) {
        llc_unlock();
    }
}

/* A clock read: queue it, then wait until the firmware has served the ring up
 * to it and answered in the vCPU's pv slot (or gave up on the firmware: then
 * the answer is 0). The guest reads the slot after the marker. */
static void clock_read(unsigned int vcpu, uint64_t now_ps)
{
    if (vcpu >= P.n_pv) {
        return;
    }
    struct cxlssd_pv_slot *slot = &P.pv[vcpu];
    uint64_t seq = ++P.clock_seq[vcpu];
    struct cxlssd_request *rec = NULL;
    if (P.ring != NULL && P.active) {
        if (P.shared) {
            llc_lock();
        }
        rec = ring_slot();
        if (rec != NULL) {
            ring_publish(rec, now_ps, seq << 16, vcpu, 0, CXLSSD_OP_MARKER, CXLSSD_CMD_CLOCK);
        }
        if (P.shared) {
            llc_unlock();
        }
    }
    if (rec != NULL && !await_answer(&slot->seq, seq)) {
        rec = NULL;
    }
    if (rec == NULL) {
        STORE_RELAXED(&slot->clock_ns, 0);
        __atomic_store_n(&slot->seq, seq, __ATOMIC_RELEASE);
        return;
    }
    /* The firmware has served everything before the read: a look now sees every decision
     * so far. A program that waits for its moves (cxlssd_settle) reads the clock while it
     * waits, and makes no device request that would look. The idle look does not ring
     * under -icount (measured: a settle waited 13 minutes with one decision in the
     * mailbox): -icount runs every vCPU on QEMU's one round-robin thread, whose wait
     * (rr_wait_io_event, accel/tcg/tcg-accel-ops-rr.c) never calls the plugins' idle
     * callback; only the per-vCPU threads' qemu_wait_io_event does (cpu.clock: host). */
    look_at_mailbox(vcpu, 0);
}

/* Runs before a marker executes: snapshot the vCPU into the ROI table and
 * queue a marker record, so the firmware knows its stall at that point. */
static void on_marker(unsigned int vcpu, void *userdata)
{
    uint32_t code = (uint32_t)(uintptr_t)userdata;
    if (!P.active || vcpu >= P.n_vslots) {
        __atomic_fetch_add(&P.hdr->markers_ignored, 1, __ATOMIC_RELAXED);
        if (code >> 16 == CXLSSD_CMD_CLOCK) {
            clock_read(vcpu, 0); /* answers 0 at once: no modelled clock while dormant */
        } else if (code >> 16 == CXLSSD_CMD_QUERY && vcpu < P.n_pv) {
            STORE_RELAXED(&P.pv[vcpu].query_long, 0); /* no firmware: never a long delay */
        }
        return;
    }
    struct cxlssd_vcpu_slot *s = &P.vslots[vcpu];
    const uint64_t insns = qemu_plugin_u64_get(P.insns, vcpu);
    STORE_RELAXED(&s->insns, insns);
    if (code >> 16 == CXLSSD_CMD_CLOCK) {
        /* Not an ROI event; with several vCPUs the clock only needs this vCPU's slot. */
        clock_read(vcpu, clock_at(vcpu, s, insns));
        return;
    }
    if (code >> 16 > CXLSSD_CMD_CLOCK) {
        runtime_marker(vcpu, code >> 16, code & 0xffffu, clock_at(vcpu, s, insns));
        return;
    }
    if (P.shared) {
        llc_lock();
    }
    uint64_t now_ps = clock_at(vcpu, s, insns);
    if (code >> 16 == CXLSSD_CMD_ROI_BEGIN && P.llc_cold_at_roi && P.llc != NULL) {
        /* An ROI begins on an empty LLC, as SkyByte's measured run starts MacSim's caches
         * cold: its dirty lines are dropped, as the artifact's warm-up run's last ones
         * never reach its SSD model (written back, their programs fell in the ROI). So
         * what the set-up, and whatever ran beside it, left in the LLC does not change it. */
        llc_clear();
    }
    if (code >> 16 == CXLSSD_CMD_ROI_BEGIN) {
        P.rois_open++;
    } else if (code >> 16 == CXLSSD_CMD_ROI_END && P.rois_open > 0) {
        P.rois_open--;
    }
    uint64_t index = P.hdr->roi_events;
    if (index < CXLSSD_ROI_SLOTS) {
        struct cxlssd_roi_event *e = &P.roi[index];
        e->code = code;
        e->vcpu = (uint16_t)vcpu;
        e->local_ps = now_ps;
        memcpy(e->counters, s, sizeof e->counters);
    }
    /* Release: a reader that sees the count sees the event. */
    __atomic_store_n(&P.hdr->roi_events, index + 1, __ATOMIC_RELEASE);
    if (P.ring != NULL) {
        struct cxlssd_request *rec = ring_slot();
        if (rec != NULL) {
            ring_publish(rec, now_ps, index << 16 | (code & 0xffffu), vcpu, 0, CXLSSD_OP_MARKER, (uint8_t)(code >> 16));
        }
    }
    if (P.shared) {
        llc_unlock();
    }
}

static void register_callbacks(qemu_plugin_id_t id);

/* Runs once QEMU has flushed every translated block and unregistered the
 * plugin's callbacks, with all vCPUs stopped: the mode can change safely. */
static void after_reset(qemu_plugin_id_t id)
{
    uint32_t want = LOAD_RELAXED(&P.hdr->requested_mode) == CXLSSD_MODE_ACTIVE;
    if (want && !P.active) {
        uint64_t insn_ps = LOAD_RELAXED(&P.hdr->insn_ps), dram_ps = LOAD_RELAXED(&P.hdr->dram_ps);
        if (insn_ps == 0 || insn_ps > MAX_CLOCK_PS || dram_ps > MAX_CLOCK_PS) {
            fprintf(stderr, "cxlssd plugin: refusing to activate: insn_ps %" PRIu64 " / dram_ps %" PRIu64
                            " out of range\n", insn_ps, dram_ps);
            want = 0;
        } else {
            P.insn_ps = insn_ps;
            P.dram_ps = dram_ps;
            P.store_miss_write = LOAD_RELAXED(&P.hdr->store_miss_write) != 0;
            P.llc_cold_at_roi = LOAD_RELAXED(&P.hdr->llc_cold_at_roi) != 0;
            P.rois_open = 0;
            /* A cold LLC on every activation keeps runs reproducible; the
             * clock continues from where it stopped (dormant time is not counted). */
            if (P.llc != NULL) {
                llc_clear();
            }
            for (unsigned int i = 0; i < P.n_vslots; i++) {
                P.last_insns[i] = qemu_plugin_u64_get(P.insns, i);
            }
            /* A new run starts with a new firmware: its tickets count from 1 and
             * it knows of no promoted page. */
            if (P.query_seq != NULL) {
                memset(P.query_seq, 0, P.n_pv * sizeof *P.query_seq);
                memset(P.promote_due_ps, 0, P.n_pv * sizeof *P.promote_due_ps);
                memset(P.promote_due, 0, P.n_pv);
            }
            promote_rung_head = UINT64_MAX;
            if (P.promoted != NULL) {
                memset(P.promoted, 0, P.promoted_cap * sizeof *P.promoted);
                P.n_promoted = 0;
            }
            /* A new run may have a new firmware: give it a chance again. */
            if (P.ring != NULL && P.ring_given_up) {
                P.ring_given_up = 0;
                __atomic_store_n(&P.ring->producer_state, CXLSSD_STATE_RUNNING, __ATOMIC_RELEASE);
            }
            P.hdr->activations++;
        }
    }
    P.active = (int)want;
    register_callbacks(id);
    __atomic_store_n(&P.hdr->mode, want ? CXLSSD_MODE_ACTIVE : CXLSSD_MODE_DORMANT, __ATOMIC_RELEASE);
    __atomic_store_n(&P.switching, 0, __ATOMIC_RELEASE);
}

/* Pick up what the platform published: windows, a requested mode. Called on
 * translation and when a vCPU idles, which a running guest does constantly. */
static void poll_requests(void)
{
    uint32_t published = LOAD_RELAXED(&P.hdr->n_windows);
    if (published != __atomic_load_n(&P.n_known, __ATOMIC_ACQUIRE)) {
        adopt_windows(published);
    }
    uint32_t want = LOAD_RELAXED(&P.hdr->requested_mode) == CXLSSD_MODE_ACTIVE;
    if ((int)want != P.active && !__atomic_exchange_n(&P.switching, 1, __ATOMIC_ACQ_REL)) {
        qemu_plugin_reset(P.id, after_reset);
    }
}

/* ---- translation, idle, exit --------------------------------------------- */

static void on_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    poll_requests();
    size_t n = qemu_plugin_tb_n_insns(tb);
    /* Dormant: one inline add per block, counted on block entry (cheap; a block left
     * early over-counts its tail). Active: one per instruction, exact. An MMIO access
     * that is not its block's last instruction, as a CXL access mid-block is, makes
     * QEMU 10 leave the block there and run that instruction alone, instrumented for
     * memory only (cpu_io_recompile, CF_MEMI_ONLY), then go on in a new block: a
     * per-block count would count the rest of the block twice, every time. A REP
     * MOVS/STOS is not counted per iteration but by the bytes it stores (on_mem). */
    if (!P.active) {
        qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(tb, QEMU_PLUGIN_INLINE_ADD_U64, P.insns, n);
    }
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        const int fast_string = P.active && is_fast_string(insn);
        if (P.active && !fast_string) {
            qemu_plugin_register_vcpu_insn_exec_inline_per_vcpu(insn, QEMU_PLUGIN_INLINE_ADD_U64, P.insns, 1);
        }
        uint32_t code = marker_code(insn);
        if (code != 0) {
            qemu_plugin_register_vcpu_insn_exec_cb(insn, on_marker, QEMU_PLUGIN_CB_NO_REGS,
                                                   (void *)(uintptr_t)code);
        }
        if (P.active) {
            qemu_plugin_register_vcpu_mem_cb(insn, on_mem, QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_MEM_RW,
                                             fast_string ? (void *)&P.string_ops : NULL); /* non-NULL: a string op */
        }
    }
}

static void refresh_insns(unsigned int vcpu)
{
    if (vcpu < P.n_vslots) {
        STORE_RELAXED(&P.vslots[vcpu].insns, qemu_plugin_u64_get(P.insns, vcpu));
    }
}

static void on_vcpu_idle(qemu_plugin_id_t id, unsigned int vcpu)
{
    (void)id;
    refresh_insns(vcpu);
    poll_requests();
    if (promote_bell.fd >= 0 && P.active && P.ring != NULL && vcpu < P.n_pv) {
        look_at_mailbox(vcpu, 1);
    }
}

/* The JSON has the counters and the local clock, which follows them in a slot. */
#define N_JSON_FIELDS (CXLSSD_VCPU_COUNTERS + 1)
static const char *const vcpu_counter_names[N_JSON_FIELDS] = {
    "insns",          "mem_accesses",    "io_accesses",    "cxl_loads",       "cxl_stores",
    "llc_hits_dram",  "llc_hits_cxl",    "llc_misses_dram", "llc_misses_cxl", "writebacks_dram",
    "writebacks_cxl", "device_reads",    "device_writes",  "device_dropped",  "local_ps",
};
_Static_assert(offsetof(struct cxlssd_vcpu_slot, device_dropped) == 8 * (CXLSSD_VCPU_COUNTERS - 1), "JSON names");

static void print_counters(FILE *f, const uint64_t *v)
{
    fputc('{', f);
    for (int k = 0; k < N_JSON_FIELDS; k++) {
        fprintf(f, "%s\"%s\": %" PRIu64, k ? ", " : "", vcpu_counter_names[k], v[k]);
    }
    fputc('}', f);
}

static int write_json(const char *path)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        return -1;
    }
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        return -1;
    }
    uint64_t totals[N_JSON_FIELDS] = {0};
    fprintf(f,
            "{\n  \"layout_version\": %u,\n  \"llc_bytes\": %" PRIu64 ",\n  \"llc_ways\": %u,\n"
            "  \"activations\": %u,\n  \"roi_events\": %" PRIu64 ",\n  \"vcpus\": [",
            CXLSSD_COUNTERS_VERSION, P.llc_bytes, P.llc_ways, P.hdr->activations, P.hdr->roi_events);
    for (unsigned int i = 0; i < P.n_vslots; i++) {
        const uint64_t *v = (const uint64_t *)&P.vslots[i];
        for (int k = 0; k < N_JSON_FIELDS; k++) {
            totals[k] += v[k];
        }
        fprintf(f, "%s\n    ", i ? "," : "");
        print_counters(f, v);
    }
    fprintf(f, "\n  ],\n  \"windows\": [");
    uint32_t n = P.n_known;
    for (uint32_t i = 0; i < n; i++) {
        const struct cxlssd_window_slot *w = &P.wslots[i];
        fprintf(f,
                "%s\n    {\"base\": %" PRIu64 ", \"size\": %" PRIu64 ", \"dpa_base\": %" PRIu64
                ", \"loads\": %" PRIu64 ", \"stores\": %" PRIu64 ", \"lines_touched\": %" PRIu64
                ", \"rejected\": %s}",
                i ? "," : "", w->base, w->size, w->dpa_base, w->loads, w->stores, w->lines_touched,
                (w->flags & CXLSSD_WINDOW_REJECTED) ? "true" : "false");
    }
    fprintf(f, "\n  ],\n  \"totals\": ");
    print_counters(f, totals);
    if (P.ring != NULL) {
        fprintf(f,
                ",\n  \"ring\": {\"published\": %" PRIu64 ", \"dropped\": %" PRIu64 ", \"full_waits\": %" PRIu64
                ", \"wait_ns\": %" PRIu64 ", \"producer_state\": %u}",
                P.ring->head, P.ring->dropped, P.ring->full_waits, P.ring->wait_ns, P.ring->producer_state);
        fprintf(f,
                ",\n  \"firmware_waits\": {\"waits\": %" PRIu64 ", \"sleeps\": %" PRIu64
                ", \"host_wait_ns\": %" PRIu64 "}",
                firmware_waits.waits, firmware_waits.sleeps, firmware_waits.wait_ns);
    }
    /* host time the vCPUs were held for QEMU to take a ring: emulation cost, not a result */
    const struct doorbell *bells[] = {&switch_bell, &promote_bell};
    const char *const names[] = {"doorbell", "promote_doorbell"};
    for (size_t i = 0; i < 2; i++) {
        if (bells[i]->fd >= 0) {
            fprintf(f,
                    ",\n  \"%s\": {\"rings\": %" PRIu64 ", \"not_taken_within_100ms\": %" PRIu64
                    ", \"host_wait_ns\": %" PRIu64 ", \"host_wait_max_ns\": %" PRIu64,
                    names[i], bells[i]->rings, bells[i]->timeouts, bells[i]->wait_ns, bells[i]->max_wait_ns);
            if (bells[i] == &promote_bell) {
                fprintf(f, ", \"mailbox_looks\": %" PRIu64, promote_checks);
            }
            fputc('}', f);
        }
    }
    fprintf(f, "\n}\n");
    if (fclose(f) != 0) {
        unlink(tmp);
        return -1;
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

static void on_exit_cb(qemu_plugin_id_t id, void *userdata)
{
    (void)id;
    (void)userdata;
    /* Windows published after the last access are still reported. */
    uint32_t published = LOAD_RELAXED(&P.hdr->n_windows);
    if (published != P.n_known) {
        adopt_windows(published);
    }
    int n = qemu_plugin_num_vcpus();
    for (int i = 0; i < n; i++) {
        refresh_insns((unsigned int)i);
    }
    if (P.ring != NULL && !P.ring_given_up) {
        __atomic_store_n(&P.ring->producer_state, CXLSSD_STATE_EXITED, __ATOMIC_RELEASE);
    }
    if (P.out_path != NULL && write_json(P.out_path) != 0) {
        fprintf(stderr, "cxlssd plugin: cannot write %s: %s\n", P.out_path, strerror(errno));
    }
    __atomic_store_n(&P.hdr->state, CXLSSD_STATE_EXITED, __ATOMIC_RELEASE);
    /* The shm files stay: they live in the instance's runtime dir, which the
     * platform removes; the platform may still read the final counters. */
}

static void register_callbacks(qemu_plugin_id_t id)
{
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
    qemu_plugin_register_vcpu_idle_cb(id, on_vcpu_idle);
    qemu_plugin_register_atexit_cb(id, on_exit_cb, NULL);
}

/* ---- arguments and setup ------------------------------------------------- */

static int bad_arg(const char *arg, const char *why)
{
    fprintf(stderr, "cxlssd plugin: bad argument '%s': %s\n", arg, why);
    return -1;
}

static int parse_u64(const char *text, const char *end, uint64_t *out)
{
    if (text == end || *text == '-' || *text == '+' || *text == ' ') {
        return -1;
    }
    char buf[32];
    size_t len = (size_t)(end - text);
    if (len >= sizeof buf) {
        return -1;
    }
    memcpy(buf, text, len);
    buf[len] = '\0';
    char *stop;
    errno = 0;
    unsigned long long v = strtoull(buf, &stop, 0);
    if (errno != 0 || *stop != '\0') {
        return -1;
    }
    *out = v;
    return 0;
}

/* Create, size and map a new shared file (must not exist). NULL on failure
 * (message on stderr). */
static void *map_new_file(const char *path, size_t bytes)
{
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "cxlssd plugin: cannot create shm file %s: %s\n", path, strerror(errno));
        return NULL;
    }
    if (ftruncate(fd, (off_t)bytes) != 0) {
        fprintf(stderr, "cxlssd plugin: cannot size shm file %s: %s\n", path, strerror(errno));
        close(fd);
        unlink(path);
        return NULL;
    }
    void *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        fprintf(stderr, "cxlssd plugin: cannot map shm file %s: %s\n", path, strerror(errno));
        unlink(path);
        return NULL;
    }
    return map;
}

static int setup_area(const char *shm_path, unsigned int vcpu_slots)
{
    size_t roi_offset = CXLSSD_VCPU_OFFSET + (size_t)vcpu_slots * CXLSSD_VCPU_SLOT_BYTES;
    size_t bytes = roi_offset + (size_t)CXLSSD_ROI_SLOTS * CXLSSD_ROI_EVENT_BYTES;
    bytes = (bytes + 4095) & ~(size_t)4095;
    P.last_insns = calloc(vcpu_slots, sizeof *P.last_insns);
    P.string_ops = calloc(vcpu_slots, sizeof *P.string_ops);
    if (P.last_insns == NULL || P.string_ops == NULL) {
        return bad_arg("(counters)", "out of memory");
    }
    if (shm_path == NULL) {
        P.area = calloc(1, bytes);
        if (P.area == NULL) {
            return bad_arg("(counters)", "out of memory");
        }
    } else {
        P.area = map_new_file(shm_path, bytes);
        if (P.area == NULL) {
            return -1;
        }
    }
    P.area_bytes = bytes;
    P.hdr = (struct cxlssd_counters_header *)P.area;
    P.wslots = (struct cxlssd_window_slot *)(P.area + CXLSSD_WINDOW_OFFSET);
    P.vslots = (struct cxlssd_vcpu_slot *)(P.area + CXLSSD_VCPU_OFFSET);
    P.roi = (struct cxlssd_roi_event *)(P.area + roi_offset);
    P.n_vslots = vcpu_slots;
    P.hdr->version = CXLSSD_COUNTERS_VERSION;
    P.hdr->header_bytes = CXLSSD_COUNTERS_HEADER_BYTES;
    P.hdr->vcpu_slots = vcpu_slots;
    P.hdr->window_slots = CXLSSD_WINDOW_SLOTS;
    P.hdr->window_offset = CXLSSD_WINDOW_OFFSET;
    P.hdr->vcpu_offset = CXLSSD_VCPU_OFFSET;
    P.hdr->file_bytes = bytes;
    P.hdr->qemu_pid = (uint64_t)getpid();
    P.hdr->vcpu_slot_bytes = CXLSSD_VCPU_SLOT_BYTES;
    P.hdr->llc_ways = P.llc_ways;
    P.hdr->llc_bytes = P.llc_bytes;
    P.hdr->insn_ps = P.insn_ps;
    P.hdr->dram_ps = P.dram_ps;
    P.hdr->roi_offset = (uint32_t)roi_offset;
    P.hdr->roi_slots = CXLSSD_ROI_SLOTS;
    P.hdr->requested_mode = P.hdr->mode = P.active ? CXLSSD_MODE_ACTIVE : CXLSSD_MODE_DORMANT;
    P.hdr->activations = (uint32_t)P.active;
    P.hdr->state = CXLSSD_STATE_RUNNING;
    return 0;
}

static int setup_ring(const char *path, uint64_t records)
{
    size_t bytes = CXLSSD_RING_HEADER_BYTES + records * sizeof(struct cxlssd_request);
    bytes = (bytes + 4095) & ~(size_t)4095;
    uint8_t *map = map_new_file(path, bytes);
    if (map == NULL) {
        return -1;
    }
    P.ring = (struct cxlssd_ring_header *)map;
    P.records = (struct cxlssd_request *)(map + CXLSSD_RING_HEADER_BYTES);
    P.ring_mask = records - 1;
    P.ring->version = CXLSSD_RING_VERSION;
    P.ring->header_bytes = CXLSSD_RING_HEADER_BYTES;
    P.ring->record_bytes = sizeof(struct cxlssd_request);
    P.ring->capacity = (uint32_t)records;
    P.ring->file_bytes = bytes;
    P.ring->qemu_pid = (uint64_t)getpid();
    P.ring->insn_ps = P.insn_ps;
    P.ring->timeout_ns = P.timeout_ns;
    P.ring->producer_state = CXLSSD_STATE_RUNNING;
    __atomic_store_n(&P.ring->magic, CXLSSD_RING_MAGIC, __ATOMIC_RELEASE);
    return 0;
}

/* Map the paravirtual clock page (an existing file: QEMU maps the same file
 * into the guest as an ivshmem BAR) and write its header. */
static int setup_pv(const char *path, unsigned int vcpu_slots)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size < (off_t)CXLSSD_PV_BYTES) {
        fprintf(stderr, "cxlssd plugin: pv file %s must exist with at least %u bytes: %s\n", path, CXLSSD_PV_BYTES,
                fd < 0 ? strerror(errno) : "too small");
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    size_t bytes = (size_t)st.st_size;
    uint8_t *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        fprintf(stderr, "cxlssd plugin: cannot map pv file %s: %s\n", path, strerror(errno));
        return -1;
    }
    unsigned int fit = (unsigned int)((CXLSSD_PV_MAILBOX_OFFSET - CXLSSD_PV_HEADER_BYTES) / CXLSSD_PV_SLOT_BYTES);
    P.n_pv = vcpu_slots < fit ? vcpu_slots : fit;
    P.pv = (struct cxlssd_pv_slot *)(map + CXLSSD_PV_HEADER_BYTES);
    P.clock_seq = calloc(P.n_pv ? P.n_pv : 1, sizeof *P.clock_seq);
    P.query_seq = calloc(P.n_pv ? P.n_pv : 1, sizeof *P.query_seq);
    P.query_state = calloc(P.n_vslots > P.n_pv ? P.n_vslots : P.n_pv ? P.n_pv : 1, 1);
    P.promote_due_ps = calloc(P.n_pv ? P.n_pv : 1, sizeof *P.promote_due_ps);
    P.promote_due = calloc(P.n_pv ? P.n_pv : 1, 1);
    if (P.clock_seq == NULL || P.query_seq == NULL || P.query_state == NULL || P.promote_due_ps == NULL ||
        P.promote_due == NULL) {
        return bad_arg("pv", "out of memory");
    }
    struct cxlssd_pv_header *h = (struct cxlssd_pv_header *)map;
    pv_header = h;
    h->version = CXLSSD_PV_VERSION;
    h->slots = P.n_pv;
    h->slot_offset = CXLSSD_PV_HEADER_BYTES;
    h->slot_bytes = CXLSSD_PV_SLOT_BYTES;
    h->mailbox_offset = CXLSSD_PV_MAILBOX_OFFSET;
    h->mailbox_entries = (uint32_t)((bytes < 4096 ? bytes : 4096) - CXLSSD_PV_MAILBOX_OFFSET - CXLSSD_PV_MAILBOX_HEADER) / 8;
    __atomic_store_n(&h->magic, CXLSSD_PV_MAGIC, __ATOMIC_RELEASE);
    return 0;
}

static int setup_cache_map(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 4) {
        if (fd >= 0) {
            close(fd);
        }
        return bad_arg("cache_map", "must be a regular file the platform created (an int32 per device page)");
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        return bad_arg("cache_map", "cannot be mapped");
    }
    cache_map = map;
    cache_map_pages = (uint64_t)st.st_size / sizeof *cache_map;
    return 0;
}

static int setup_llc(void)
{
    if (P.llc_bytes == 0) {
        return 0;
    }
    uint64_t sets = P.llc_bytes / ((uint64_t)LINE_BYTES * P.llc_ways);
    P.llc = calloc(sets * P.llc_ways, sizeof(uint64_t));
    if (P.llc == NULL) {
        return bad_arg("llc", "out of memory for the LLC tags");
    }
    P.llc_set_mask = sets - 1;
    return 0;
}

static int key_is(const char *arg, size_t key_len, const char *key)
{
    return key_len == strlen(key) && strncmp(arg, key, key_len) == 0;
}

CXLSSD_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                                             char **argv)
{
    if (!info->system_emulation) {
        fputs("cxlssd plugin: needs system emulation (physical addresses)\n", stderr);
        return -1;
    }
    const char *shm_path = NULL, *ring_path = NULL, *pv_path = NULL;
    uint64_t bases[CXLSSD_WINDOW_SLOTS], sizes[CXLSSD_WINDOW_SLOTS], dpas[CXLSSD_WINDOW_SLOTS];
    unsigned int n_windows = 0;
    uint64_t llc_bytes = DEFAULT_LLC_BYTES, llc_ways = DEFAULT_LLC_WAYS, ring_records = DEFAULT_RING_RECORDS;
    uint64_t timeout_ms = DEFAULT_RING_TIMEOUT_MS, insn_ps = DEFAULT_INSN_PS, dram_ps = DEFAULT_DRAM_PS;
    uint64_t ram_top = MAX_RAM_TOP, string_bytes = DEFAULT_STRING_BYTES;
    int seen_string = 0, seen_llc = 0, seen_ways = 0, seen_records = 0, seen_timeout = 0, seen_ps = 0, seen_dram = 0;
    int seen_ram_top = 0, seen_doorbell = 0, seen_promote = 0;
    uint64_t doorbell = 0, promote = 0;
    const char *mode = NULL;
    const char *cache_map_path = NULL;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        const char *eq = strchr(arg, '=');
        if (eq == NULL || eq == arg) {
            return bad_arg(arg, "expected KEY=VALUE");
        }
        const char *value = eq + 1, *value_end = value + strlen(value);
        size_t key_len = (size_t)(eq - arg);
        if (key_is(arg, key_len, "out")) {
            if (P.out_path != NULL || *value == '\0') {
                return bad_arg(arg, "out= must be given once, with a path");
            }
            P.out_path = value;
        } else if (key_is(arg, key_len, "shm")) {
            if (shm_path != NULL || *value == '\0') {
                return bad_arg(arg, "shm= must be given once, with a path");
            }
            shm_path = value;
        } else if (key_is(arg, key_len, "ring")) {
            if (ring_path != NULL || *value == '\0') {
                return bad_arg(arg, "ring= must be given once, with a path");
            }
            ring_path = value;
        } else if (key_is(arg, key_len, "cache_map")) {
            if (cache_map_path != NULL || *value == '\0') {
                return bad_arg(arg, "cache_map= must be given once, with a path");
            }
            cache_map_path = value;
        } else if (key_is(arg, key_len, "pv")) {
            if (pv_path != NULL || *value == '\0') {
                return bad_arg(arg, "pv= must be given once, with a path");
            }
            pv_path = value;
        } else if (key_is(arg, key_len, "mode")) {
            if (mode != NULL || (strcmp(value, "active") != 0 && strcmp(value, "dormant") != 0)) {
                return bad_arg(arg, "mode= must be given once, as active or dormant");
            }
            mode = value;
        } else if (key_is(arg, key_len, "window")) {
            const char *colon = strchr(value, ':');
            const char *colon2 = colon ? strchr(colon + 1, ':') : NULL;
            uint64_t base, size, dpa = 0;
            if (colon == NULL || parse_u64(value, colon, &base) != 0 ||
                parse_u64(colon + 1, colon2 ? colon2 : value_end, &size) != 0 ||
                (colon2 != NULL && parse_u64(colon2 + 1, value_end, &dpa) != 0)) {
                return bad_arg(arg, "expected window=BASE:SIZE[:DPA] (e.g. window=0x390000000:0x40000000)");
            }
            if (n_windows == CXLSSD_WINDOW_SLOTS) {
                return bad_arg(arg, "at most 8 windows");
            }
            bases[n_windows] = base;
            sizes[n_windows] = size;
            dpas[n_windows] = dpa;
            n_windows++;
        } else {
            struct {
                const char *key;
                uint64_t *value;
                int *seen;
            } numbers[] = {
                {"llc", &llc_bytes, &seen_llc},
                {"llc_ways", &llc_ways, &seen_ways},
                {"ring_records", &ring_records, &seen_records},
                {"ring_timeout_ms", &timeout_ms, &seen_timeout},
                {"insn_ps", &insn_ps, &seen_ps},
                {"dram_ps", &dram_ps, &seen_dram},
                {"ram_top", &ram_top, &seen_ram_top},
                {"string_bytes", &string_bytes, &seen_string},
                {"doorbell_fd", &doorbell, &seen_doorbell},
                {"promote_fd", &promote, &seen_promote},
            };
            size_t k = 0;
            while (k < sizeof numbers / sizeof *numbers && !key_is(arg, key_len, numbers[k].key)) {
                k++;
            }
            if (k == sizeof numbers / sizeof *numbers) {
                return bad_arg(arg, "unknown key (expected out, shm, window, llc, llc_ways, ring, "
                                    "ring_records, ring_timeout_ms, insn_ps, dram_ps, string_bytes, ram_top, mode, pv, doorbell_fd, promote_fd or cache_map)");
            }
            if (*numbers[k].seen || parse_u64(value, value_end, numbers[k].value) != 0) {
                return bad_arg(arg, "must be given once, with a number");
            }
            *numbers[k].seen = 1;
        }
    }
    if (llc_ways == 0 || llc_ways > MAX_LLC_WAYS) {
        return bad_arg("llc_ways", "must be 1..64");
    }
    if (llc_bytes != 0) {
        uint64_t sets = llc_bytes / (LINE_BYTES * llc_ways);
        if (llc_bytes % (LINE_BYTES * llc_ways) || sets == 0 || (sets & (sets - 1)) || llc_bytes > (1ULL << 36)) {
            return bad_arg("llc", "size / (64 x ways) must be a power of 2 (size at most 64 GiB)");
        }
    }
    if (ring_records < 2 || (ring_records & (ring_records - 1)) || ring_records > (1ULL << 31)) {
        return bad_arg("ring_records", "must be a power of 2 between 2 and 2^31");
    }
    if (timeout_ms == 0 || timeout_ms > 3600000) {
        return bad_arg("ring_timeout_ms", "must be 1..3600000");
    }
    if (insn_ps == 0 || insn_ps > MAX_CLOCK_PS) {
        return bad_arg("insn_ps", "must be 1..1000000000");
    }
    if (dram_ps > MAX_CLOCK_PS) {
        return bad_arg("dram_ps", "must be 0..1000000000");
    }
    if (string_bytes == 0 || string_bytes > MAX_STRING_BYTES) {
        return bad_arg("string_bytes", "must be 1..4096");
    }
    if (ram_top == 0 || ram_top > MAX_RAM_TOP) {
        return bad_arg("ram_top", "must be 1..2^40 bytes");
    }
    if (seen_doorbell && (doorbell > INT32_MAX || fcntl((int)doorbell, F_GETFD) < 0)) {
        return bad_arg("doorbell_fd", "must be an open descriptor QEMU inherited (an eventfd)");
    }
    if (seen_doorbell && pv_path == NULL) {
        return bad_arg("doorbell_fd", "needs pv= (the answers of the queries it rings for)");
    }
    if (seen_promote && (promote > INT32_MAX || fcntl((int)promote, F_GETFD) < 0)) {
        return bad_arg("promote_fd", "must be an open descriptor QEMU inherited (an eventfd)");
    }
    if (seen_promote && (pv_path == NULL || ring_path == NULL)) {
        return bad_arg("promote_fd", "needs pv= and ring= (the mailbox, the requests it waits for)");
    }
    switch_bell.fd = seen_doorbell ? (int)doorbell : -1;
    promote_bell.fd = seen_promote ? (int)promote : -1;
    if (cache_map_path != NULL && setup_cache_map(cache_map_path) != 0) {
        return -1;
    }
    P.promoted_max_pfn = ram_top >> 12;
    P.llc_bytes = llc_bytes;
    P.llc_ways = (uint32_t)llc_ways;
    P.timeout_ns = timeout_ms * 1000000ULL;
    P.insn_ps = insn_ps;
    P.dram_ps = dram_ps;
    P.string_bytes = string_bytes;
    P.active = mode == NULL || strcmp(mode, "active") == 0;
    P.id = id;

    int max_vcpus = info->system.max_vcpus > 0 ? info->system.max_vcpus : 1;
    P.shared = max_vcpus > 1;
    if (setup_llc() != 0 || setup_area(shm_path, (unsigned int)max_vcpus) != 0) {
        return -1;
    }
    /* Windows from the arguments go through the same table the platform
     * publishes into, so there is one code path; validate them strictly now. */
    for (unsigned int i = 0; i < n_windows; i++) {
        const char *problem = window_problem(bases[i], sizes[i], i);
        if (problem != NULL) {
            char arg[96];
            snprintf(arg, sizeof arg, "window=%#" PRIx64 ":%#" PRIx64, bases[i], sizes[i]);
            if (shm_path != NULL) {
                unlink(shm_path);
            }
            return bad_arg(arg, problem);
        }
        P.wslots[i].base = bases[i];
        P.wslots[i].size = sizes[i];
        P.wslots[i].dpa_base = dpas[i];
        P.hdr->n_windows = i + 1;
    }
    int ring_ok = ring_path == NULL || setup_ring(ring_path, ring_records) == 0;
    if (!ring_ok || (pv_path != NULL && setup_pv(pv_path, (unsigned int)max_vcpus) != 0)) {
        /* Remove only the files this plugin created. */
        if (shm_path != NULL) {
            unlink(shm_path);
        }
        if (ring_ok && ring_path != NULL) {
            unlink(ring_path);
        }
        return -1;
    }
    adopt_windows(n_windows);

    P.insn_board = qemu_plugin_scoreboard_new(sizeof(uint64_t));
    P.insns = (qemu_plugin_u64){P.insn_board, 0};
    register_callbacks(id);
    /* Ready: the magic goes in last, so a reader that sees it sees the rest. */
    __atomic_store_n(&P.hdr->magic, CXLSSD_COUNTERS_MAGIC, __ATOMIC_RELEASE);
    return 0;
}

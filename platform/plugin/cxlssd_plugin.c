/*
 * cxlssd TCG plugin: sees every guest load/store with its guest-physical
 * address and counts the ones that reach a CXL device's memory window.
 *
 * This is the first piece of the platform's "hardware fast path" (DESIGN.md
 * decision 2). For now it
 *   - counts guest instructions per vCPU (inline scoreboard adds, no callback);
 *   - calls back on every load/store, takes the physical address and counts
 *     per vCPU: all accesses, MMIO accesses, CXL loads and CXL stores; per CXL
 *     window: loads, stores and distinct 64-byte lines touched;
 *   - keeps the counters in a small shared-memory file (shm=PATH) that the
 *     platform reads while the guest runs, and into which the platform
 *     publishes the CXL windows once the guest has committed its regions;
 *   - writes the counters as JSON at exit (out=PATH).
 *
 * Arguments (QEMU: -plugin libcxlssd.so,ARG=VALUE,...):
 *   out=PATH            JSON counters written at exit (atomically: PATH.tmp, rename)
 *   shm=PATH            shared counters file, created (must not exist), layout below
 *   window=BASE:SIZE    a CXL window known at start (repeatable, up to 8);
 *                       BASE and SIZE in C notation (0x.. or decimal),
 *                       64-byte aligned, non-overlapping
 * Any other argument, a malformed value or a repeated out/shm makes loading
 * fail with a message on stderr (QEMU then refuses to start).
 *
 * Shared counters layout (all little-endian, fixed offsets; docs/plugin.md):
 *   header, 64 bytes at offset 0:
 *     0  u64 magic "CXLSSDPC" (written last: the file is ready when it is there)
 *     8  u32 layout version (1)         12 u32 header bytes (64)
 *    16  u32 vCPU slots                 20 u32 window slots (8)
 *    24  u32 offset of the window table 28 u32 offset of the vCPU table
 *    32  u32 published windows (n)      36 u32 state: 1 running, 2 exited
 *    40  u64 file bytes                 48 u64 QEMU pid     56 u64 reserved
 *   window slot i, 64 bytes at window_offset + 64 i:
 *     0 base  8 size  16 loads  24 stores  32 lines touched
 *     40 flags: 0 published, 2 accepted (counting), 1 rejected (message on stderr)
 *   vCPU slot i, 64 bytes at vcpu_offset + 64 i:
 *     0 instructions  8 memory accesses  16 MMIO accesses  24 CXL loads  32 CXL stores
 * A publisher (the platform) fills slot n's base and size, THEN stores n + 1
 * into the published count; the plugin picks new windows up on the next
 * access. Every counter is monotonic and written with single aligned 64-bit
 * stores, so a reader never sees a torn value (but a snapshot of several
 * counters is not atomic). The instruction count of a vCPU is refreshed on
 * each of its memory accesses, when it goes idle and at exit.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "qemu_plugin_api.h"

CXLSSD_PLUGIN_EXPORT int qemu_plugin_version = CXLSSD_QEMU_PLUGIN_API_VERSION;

#define MAGIC 0x43504453534c5843ULL /* "CXLSSDPC" read as little-endian bytes */
#define LAYOUT_VERSION 1u
#define MAX_WINDOWS 8u
#define SLOT_BYTES 64u
#define HEADER_BYTES 64u
#define WINDOW_OFFSET HEADER_BYTES
#define VCPU_OFFSET (WINDOW_OFFSET + MAX_WINDOWS * SLOT_BYTES)
#define LINE_SHIFT 6 /* 64-byte lines */
/* A window's line bitmap costs size/512 bytes of plugin memory (2 MiB per GiB). */
#define MAX_WINDOW_BYTES (1ULL << 40)
#define STATE_RUNNING 1u
#define STATE_EXITED 2u
#define WINDOW_REJECTED 1u
#define WINDOW_ACCEPTED 2u

struct header {
    uint64_t magic;
    uint32_t version, header_bytes;
    uint32_t vcpu_slots, window_slots;
    uint32_t window_offset, vcpu_offset;
    uint32_t n_windows, state;
    uint64_t file_bytes, qemu_pid, reserved;
};

struct window_slot {
    uint64_t base, size, loads, stores, lines_touched, flags, reserved[2];
};

/* One cache line per vCPU: each is written only by its own vCPU thread, so
 * the counters need no atomic read-modify-write and vCPUs share no lines. */
struct vcpu_slot {
    uint64_t insns, mem_accesses, io_accesses, cxl_loads, cxl_stores, reserved[3];
};

_Static_assert(sizeof(struct header) == HEADER_BYTES, "header layout");
_Static_assert(sizeof(struct window_slot) == SLOT_BYTES, "window slot layout");
_Static_assert(sizeof(struct vcpu_slot) == SLOT_BYTES, "vCPU slot layout");

/* The plugin's private copy of a window, read on the hot path. */
struct window {
    uint64_t base, size;
    uint64_t *lines; /* bitmap of touched lines, NULL if the window was rejected */
    struct window_slot *slot;
};

static struct {
    uint8_t *area; /* the counters: the shm mapping, or private memory without shm= */
    size_t area_bytes;
    struct header *hdr;
    struct window_slot *wslots;
    struct vcpu_slot *vslots;
    unsigned int n_vslots;

    /* Windows taken over from the table; only grows, under `lock`. The hot
     * path reads `n_known` (acquire) and then windows[0 .. n_known). */
    struct window windows[MAX_WINDOWS];
    uint32_t n_known;
    /* Bounding range of all known windows: one compare rejects almost every
     * access (all of DRAM) before the per-window loop. */
    uint64_t lo, span;
    pthread_mutex_t lock;

    struct qemu_plugin_scoreboard *insn_board;
    qemu_plugin_u64 insns;
    const char *out_path;
} P = {.lock = PTHREAD_MUTEX_INITIALIZER};

#define LOAD_RELAXED(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define STORE_RELAXED(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)

/* ---- windows ------------------------------------------------------------- */

static const char *window_problem(uint64_t base, uint64_t size, uint32_t upto)
{
    if (size == 0) {
        return "size is 0";
    }
    if ((base | size) & ((1u << LINE_SHIFT) - 1)) {
        return "base and size must be multiples of 64";
    }
    if (size > MAX_WINDOW_BYTES || base + size < base) {
        return "window too large";
    }
    for (uint32_t i = 0; i < upto; i++) {
        const struct window_slot *w = &P.wslots[i];
        if (!(LOAD_RELAXED(&w->flags) & WINDOW_REJECTED) && base < w->base + w->size &&
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
    if (published > MAX_WINDOWS) {
        published = MAX_WINDOWS;
    }
    for (uint32_t i = known; i < published; i++) {
        struct window_slot *slot = &P.wslots[i];
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
            STORE_RELAXED(&slot->flags, WINDOW_REJECTED);
            w->base = w->size = 0;
            continue;
        }
        w->base = base;
        w->size = size;
        STORE_RELAXED(&slot->flags, WINDOW_ACCEPTED);
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

/* ---- hot path ------------------------------------------------------------ */

/* Runs after every guest load/store. Kept lean: RAM accesses (the vast
 * majority) cost the hwaddr lookup, a few counter stores and one range
 * compare. CXL accesses are MMIO in QEMU 10.0 and already cost ~0.5 us each in
 * QEMU, so their extra atomics here are noise. */
static void on_mem(unsigned int vcpu, qemu_plugin_meminfo_t info, uint64_t vaddr, void *userdata)
{
    (void)userdata;
    if (__builtin_expect(vcpu >= P.n_vslots, 0)) {
        return;
    }
    struct vcpu_slot *s = &P.vslots[vcpu];
    STORE_RELAXED(&s->mem_accesses, s->mem_accesses + 1);
    /* Keeps the live instruction count current for readers of the shm file:
     * the scoreboard (inline adds) lives in QEMU's memory, not in the file. */
    STORE_RELAXED(&s->insns, qemu_plugin_u64_get(P.insns, vcpu));

    struct qemu_plugin_hwaddr *hw = qemu_plugin_get_hwaddr(info, vaddr);
    if (__builtin_expect(hw == NULL, 0)) {
        return;
    }
    if (qemu_plugin_hwaddr_is_io(hw)) {
        STORE_RELAXED(&s->io_accesses, s->io_accesses + 1);
    }

    uint32_t published = LOAD_RELAXED(&P.hdr->n_windows);
    uint32_t known = __atomic_load_n(&P.n_known, __ATOMIC_ACQUIRE);
    if (__builtin_expect(published != known, 0)) {
        adopt_windows(published);
        known = __atomic_load_n(&P.n_known, __ATOMIC_ACQUIRE);
    }
    /* Not the CXL window(s): nothing else to do (no window known: span 0). */
    uint64_t pa = qemu_plugin_hwaddr_phys_addr(hw);
    if (pa - LOAD_RELAXED(&P.lo) >= LOAD_RELAXED(&P.span)) {
        return;
    }
    for (uint32_t i = 0; i < known; i++) {
        struct window *w = &P.windows[i];
        uint64_t offset = pa - w->base;
        if (offset < w->size) {
            if (qemu_plugin_mem_is_store(info)) {
                STORE_RELAXED(&s->cxl_stores, s->cxl_stores + 1);
                __atomic_fetch_add(&w->slot->stores, 1, __ATOMIC_RELAXED);
            } else {
                STORE_RELAXED(&s->cxl_loads, s->cxl_loads + 1);
                __atomic_fetch_add(&w->slot->loads, 1, __ATOMIC_RELAXED);
            }
            touch_lines(w, offset, 1u << qemu_plugin_mem_size_shift(info));
            return;
        }
    }
}

/* ---- translation, idle, exit --------------------------------------------- */

static void on_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    /* One inline add per block (counted on block entry; a block left early by
     * an exception over-counts its tail, as QEMU's own insn counter does). */
    qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(tb, QEMU_PLUGIN_INLINE_ADD_U64, P.insns, n);
    for (size_t i = 0; i < n; i++) {
        qemu_plugin_register_vcpu_mem_cb(qemu_plugin_tb_get_insn(tb, i), on_mem, QEMU_PLUGIN_CB_NO_REGS,
                                         QEMU_PLUGIN_MEM_RW, NULL);
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
    uint64_t totals[5] = {0};
    fprintf(f, "{\n  \"layout_version\": %u,\n  \"vcpus\": [", LAYOUT_VERSION);
    for (unsigned int i = 0; i < P.n_vslots; i++) {
        const struct vcpu_slot *s = &P.vslots[i];
        const uint64_t v[5] = {s->insns, s->mem_accesses, s->io_accesses, s->cxl_loads, s->cxl_stores};
        for (int k = 0; k < 5; k++) {
            totals[k] += v[k];
        }
        fprintf(f,
                "%s\n    {\"insns\": %" PRIu64 ", \"mem_accesses\": %" PRIu64 ", \"io_accesses\": %" PRIu64
                ", \"cxl_loads\": %" PRIu64 ", \"cxl_stores\": %" PRIu64 "}",
                i ? "," : "", v[0], v[1], v[2], v[3], v[4]);
    }
    fprintf(f, "\n  ],\n  \"windows\": [");
    uint32_t n = P.n_known;
    for (uint32_t i = 0; i < n; i++) {
        const struct window_slot *w = &P.wslots[i];
        fprintf(f,
                "%s\n    {\"base\": %" PRIu64 ", \"size\": %" PRIu64 ", \"loads\": %" PRIu64
                ", \"stores\": %" PRIu64 ", \"lines_touched\": %" PRIu64 ", \"rejected\": %s}",
                i ? "," : "", w->base, w->size, w->loads, w->stores, w->lines_touched,
                (w->flags & WINDOW_REJECTED) ? "true" : "false");
    }
    fprintf(f,
            "\n  ],\n  \"totals\": {\"insns\": %" PRIu64 ", \"mem_accesses\": %" PRIu64
            ", \"io_accesses\": %" PRIu64 ", \"cxl_loads\": %" PRIu64 ", \"cxl_stores\": %" PRIu64 "}\n}\n",
            totals[0], totals[1], totals[2], totals[3], totals[4]);
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
    if (P.out_path != NULL && write_json(P.out_path) != 0) {
        fprintf(stderr, "cxlssd plugin: cannot write %s: %s\n", P.out_path, strerror(errno));
    }
    __atomic_store_n(&P.hdr->state, STATE_EXITED, __ATOMIC_RELEASE);
    /* The shm file stays: it lives in the instance's runtime dir, which the
     * platform removes; the platform may still read the final counters. */
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

static int setup_area(const char *shm_path, unsigned int vcpu_slots)
{
    size_t bytes = VCPU_OFFSET + (size_t)vcpu_slots * SLOT_BYTES;
    bytes = (bytes + 4095) & ~(size_t)4095;
    if (shm_path == NULL) {
        P.area = calloc(1, bytes);
        if (P.area == NULL) {
            return bad_arg("(counters)", "out of memory");
        }
    } else {
        int fd = open(shm_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) {
            fprintf(stderr, "cxlssd plugin: cannot create shm file %s: %s\n", shm_path, strerror(errno));
            return -1;
        }
        if (ftruncate(fd, (off_t)bytes) != 0) {
            fprintf(stderr, "cxlssd plugin: cannot size shm file %s: %s\n", shm_path, strerror(errno));
            close(fd);
            unlink(shm_path);
            return -1;
        }
        void *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (map == MAP_FAILED) {
            fprintf(stderr, "cxlssd plugin: cannot map shm file %s: %s\n", shm_path, strerror(errno));
            unlink(shm_path);
            return -1;
        }
        P.area = map;
    }
    P.area_bytes = bytes;
    P.hdr = (struct header *)P.area;
    P.wslots = (struct window_slot *)(P.area + WINDOW_OFFSET);
    P.vslots = (struct vcpu_slot *)(P.area + VCPU_OFFSET);
    P.n_vslots = vcpu_slots;
    P.hdr->version = LAYOUT_VERSION;
    P.hdr->header_bytes = HEADER_BYTES;
    P.hdr->vcpu_slots = vcpu_slots;
    P.hdr->window_slots = MAX_WINDOWS;
    P.hdr->window_offset = WINDOW_OFFSET;
    P.hdr->vcpu_offset = VCPU_OFFSET;
    P.hdr->file_bytes = bytes;
    P.hdr->qemu_pid = (uint64_t)getpid();
    P.hdr->state = STATE_RUNNING;
    return 0;
}

CXLSSD_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                                             char **argv)
{
    if (!info->system_emulation) {
        fputs("cxlssd plugin: needs system emulation (physical addresses)\n", stderr);
        return -1;
    }
    const char *shm_path = NULL;
    uint64_t bases[MAX_WINDOWS], sizes[MAX_WINDOWS];
    unsigned int n_windows = 0;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        const char *eq = strchr(arg, '=');
        if (eq == NULL || eq == arg) {
            return bad_arg(arg, "expected KEY=VALUE with KEY one of out, shm, window");
        }
        const char *value = eq + 1;
        size_t key_len = (size_t)(eq - arg);
        if (key_len == 3 && strncmp(arg, "out", 3) == 0) {
            if (P.out_path != NULL || *value == '\0') {
                return bad_arg(arg, "out= must be given once, with a path");
            }
            P.out_path = value;
        } else if (key_len == 3 && strncmp(arg, "shm", 3) == 0) {
            if (shm_path != NULL || *value == '\0') {
                return bad_arg(arg, "shm= must be given once, with a path");
            }
            shm_path = value;
        } else if (key_len == 6 && strncmp(arg, "window", 6) == 0) {
            const char *colon = strchr(value, ':');
            uint64_t base, size;
            if (colon == NULL || parse_u64(value, colon, &base) != 0 ||
                parse_u64(colon + 1, colon + 1 + strlen(colon + 1), &size) != 0) {
                return bad_arg(arg, "expected window=BASE:SIZE (e.g. window=0x390000000:0x40000000)");
            }
            if (n_windows == MAX_WINDOWS) {
                return bad_arg(arg, "at most 8 windows");
            }
            bases[n_windows] = base;
            sizes[n_windows] = size;
            n_windows++;
        } else {
            return bad_arg(arg, "unknown key (expected out, shm or window)");
        }
    }

    int max_vcpus = info->system.max_vcpus > 0 ? info->system.max_vcpus : 1;
    if (setup_area(shm_path, (unsigned int)max_vcpus) != 0) {
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
        P.hdr->n_windows = i + 1;
    }
    adopt_windows(n_windows);

    P.insn_board = qemu_plugin_scoreboard_new(sizeof(uint64_t));
    P.insns = (qemu_plugin_u64){P.insn_board, 0};
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_tb_trans);
    qemu_plugin_register_vcpu_idle_cb(id, on_vcpu_idle);
    qemu_plugin_register_atexit_cb(id, on_exit_cb, NULL);
    /* Ready: the magic goes in last, so a reader that sees it sees the rest. */
    __atomic_store_n(&P.hdr->magic, MAGIC, __ATOMIC_RELEASE);
    return 0;
}

/*
 * cxlssd-promote - the guest OS's side of adaptive page promotion (docs/host-os.md).
 *
 *     cxlssd-promote [--interval-us N] -- COMMAND [ARG...]
 *
 * Runs COMMAND as a child and, while it runs, carries out the attached firmware's
 * promotion decisions on the child's pages: the firmware posts "promote device page P"
 * and "demote device page P" into the mailbox of the paravirtual page; this daemon finds
 * the child's virtual page that P backs (the kernel helper answers where the child maps a
 * physical page, checked against /proc/PID/pagemap; without the helper, a scan of the
 * child's page map), moves it with move_pages(2) to host DRAM (promotion: the platform's
 * movable DRAM node, whose placement is reset before each run, else node 0;
 * cxlssd_dram_node()) or back to the CXL node (demotion), and reports each move to the
 * firmware with a marker (PROMOTED: P and the page's new physical address in RAM, so the
 * plugin can count the LLC misses the promoted page serves; DEMOTED; PROMOTE_FAILED when
 * the page is gone). Each look at the mailbox is bracketed for the firmware's transfer
 * engine as the device's work (look()): SkyByte's promotion thread runs in the device, so
 * the kernel's copy is the engine's transfer and the time this daemon spends on the
 * program's vCPU is taken back from its clock (the profile's migration.move_host_ns_*
 * charged instead, 0 as evaluated). It runs SCHED_FIFO, so it carries out decisions as
 * soon as they come; the program runs inside a look only while move_pages(2) blocks (an
 * RCU grace period), and the kernel helper tells the firmware when (DAEMON markers).
 *
 * When it looks is fixed by the guest's execution, not by the host's speed: with the
 * kernel helper (host_os/kmod/), it blocks in read(2) of /dev/cxlssd_promote, which
 * returns when the plugin rang the doorbell because the mailbox got decisions (the plugin
 * looks every 100 us of the vCPU's modelled time, after the firmware has served every
 * access before). Without the helper it polls every --interval-us (default 100) of guest
 * time, backing off to 16x that while nothing comes (the guest's clock follows its
 * instructions, -icount, 1 ns each: 100 us is 100 k instructions of the busy vCPU, a few
 * hundred of them the poll's own). Either way each look first waits until the firmware
 * has served the guest's accesses so far (a clock read), so what it finds does not depend
 * on how far the firmware lagged.
 *
 * Without an attached design that promotes, it just runs COMMAND. Exit status: the
 * child's (128 + signal if it was killed), 2 for a usage error, 1 if it cannot start.
 * A summary line goes to stderr at the end.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cxlssd.h"
#include "kmod/cxlssd_promote.h"

#define PAGE_SHIFT 12
#define MPOL_MF_MOVE (1 << 1)
#define PFN_MASK ((1ull << 55) - 1)
#define PAGE_PRESENT (1ull << 63)
#define MAX_BACKOFF 16u
#define MAX_BATCH 256u
/* Rescans of the child's page table at most this often (guest clock). The guest's
 * clock follows its instructions (-icount: 1 ms = 1 M instructions), so this is a
 * bound in work, not host time: 200 ms was longer than a whole small run, and pages
 * mapped after the first scan were never found. */
#define SCAN_INTERVAL_MS 5

static const char USAGE[] = "usage: cxlssd-promote [--interval-us N] -- COMMAND [ARG...]\n";

static pid_t child;

static void forward_signal(int signum)
{
    if (child > 0)
        kill(child, signum);
}

/* ---- the child's pages: physical page -> virtual address ---------------------------- */

static struct {
    pid_t pid;
    int pagemap;
    int helper;     /* /dev/cxlssd_promote: its wake-ups and where pages are mapped, or -1 */
    int kpagecount; /* /proc/kpagecount: how many mappings each physical page has, or -1 */
    uint64_t first_pfn, last_pfn; /* the CXL region's pages */
    uint64_t *va_of;        /* CXL page (pfn - first_pfn) -> the child's virtual page, 0 if none
                             * seen; may be stale: checked against the pagemap before use */
    struct timespec last_scan;
    uint64_t faults_at_scan; /* the child's page faults when the map was last rebuilt */
    int cxl_node;  /* where demoted pages go */
    int dram_node; /* where promoted pages go */
    int looked;   /* the map was rebuilt, or found current, during this batch of decisions */
    int reopened; /* the pagemap was opened again during this batch */
    uint64_t promoted, demoted, failed, scans, wakeups, asked, looks;
    int realtime; /* runs SCHED_FIFO: the child cannot run inside a look */
    uint64_t unmapped; /* of the failed: the page was not (or no longer) the child's */
    uint64_t shared, busy; /* of the failed: move_pages' EACCES (mapped by other processes too), EBUSY */
    int other_status;      /* the last other status a failed move had (-errno; a node: it stayed there) */
    uint64_t *promoted_page, *promoted_va; /* device page -> its virtual page, while promoted */
    uint64_t n_promoted, cap_promoted;
} D;

static uint64_t pagemap_entry(uint64_t va)
{
    uint64_t entry = 0;
    if (pread(D.pagemap, &entry, sizeof entry, (off_t)(va >> PAGE_SHIFT) * 8) != sizeof entry)
        return 0;
    return entry;
}

/* An open pagemap keeps reading the address space the child had when it was opened,
 * and the child execs (numactl, then the program): opened again before each scan, and
 * when a page the kernel helper names is not found. */
static void open_pagemap(void)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/pagemap", (int)D.pid);
    if (D.pagemap >= 0)
        close(D.pagemap);
    D.pagemap = open(path, O_RDONLY | O_CLOEXEC);
}

/* Rebuild the map of the child's present pages that lie in the CXL region. */
static void scan(void)
{
    char path[64];
    open_pagemap();
    snprintf(path, sizeof path, "/proc/%d/maps", (int)D.pid);
    FILE *maps = fopen(path, "r");
    if (maps == NULL || D.pagemap < 0) {
        if (maps != NULL)
            fclose(maps);
        return;
    }
    D.scans++;
    uint64_t entries[512];
    unsigned long long lo, hi;
    char line[512];
    while (fgets(line, sizeof line, maps) != NULL) {
        if (sscanf(line, "%llx-%llx", &lo, &hi) != 2)
            continue;
        for (uint64_t va = lo; va < hi;) {
            uint64_t n = (hi - va) >> PAGE_SHIFT;
            if (n > 512)
                n = 512;
            ssize_t got = pread(D.pagemap, entries, n * 8, (off_t)(va >> PAGE_SHIFT) * 8);
            if (got <= 0)
                break;
            for (uint64_t k = 0; k < (uint64_t)got / 8; k++) {
                uint64_t pfn = entries[k] & PFN_MASK;
                if ((entries[k] & PAGE_PRESENT) && pfn >= D.first_pfn && pfn <= D.last_pfn)
                    D.va_of[pfn - D.first_pfn] = va + (k << PAGE_SHIFT);
            }
            va += (uint64_t)got / 8 << PAGE_SHIFT;
        }
    }
    fclose(maps);
}

/* ---- the decisions ------------------------------------------------------------------ */

static void failed(uint64_t page)
{
    D.failed++;
    cxlssd_report(CXLSSD_CMD_PROMOTE_FAILED, page, 0);
}

/* The child's page faults so far (minor + major; /proc/PID/stat fields 10 and 12), or
 * UINT64_MAX if unknown. A page it maps for the first time is a fault: no new faults, no
 * new pages to find. */
static uint64_t child_faults(void)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)D.pid);
    FILE *stat = fopen(path, "r");
    if (stat == NULL)
        return UINT64_MAX;
    const size_t n = fread(buf, 1, sizeof buf - 1, stat);
    fclose(stat);
    buf[n] = '\0';
    const char *after_comm = strrchr(buf, ')'); /* (the command's name may hold anything) */
    unsigned long long minflt, majflt;
    if (after_comm == NULL ||
        sscanf(after_comm + 1, " %*c %*d %*d %*d %*d %*d %*u %llu %*u %llu", &minflt, &majflt) != 2)
        return UINT64_MAX;
    return minflt + majflt;
}

/* Of the kernel helper's answer, the address that maps `pfn` in the child now, or 0. */
static uint64_t checked(const struct cxlssd_where *where, uint64_t pfn)
{
    for (uint32_t i = 0; i < where->found && i < CXLSSD_WHERE_MAX; i++)
        if ((pagemap_entry(where->va[i]) & PFN_MASK) == pfn)
            return where->va[i];
    return 0;
}

/* The child's virtual page that physical page `pfn` backs, asked of the kernel helper:
 * the page's address, 0 if the child does not map it, UINT64_MAX if the helper cannot
 * tell (absent, or a kind of page it does not place) and the page map must be read. */
static uint64_t ask_helper(uint64_t pfn)
{
    struct cxlssd_where where = {.pid = D.pid, .pfn = pfn};
    if (D.helper < 0 || ioctl(D.helper, CXLSSD_PROMOTE_WHERE, &where) != 0)
        return UINT64_MAX;
    D.asked++;
    uint64_t va = checked(&where, pfn);
    if (va == 0 && where.found > 0 && !D.reopened) { /* the child exec'd since the pagemap was opened */
        D.reopened = 1;
        open_pagemap();
        va = checked(&where, pfn);
    }
    return va;
}

/* The child's virtual page that device page `page` backs, or 0. */
static uint64_t virtual_page(uint64_t page)
{
    const uint64_t pfn = D.first_pfn + page;
    if (pfn > D.last_pfn)
        return 0;
    uint64_t va = D.va_of[pfn - D.first_pfn];
    if (va != 0 && (pagemap_entry(va) & PFN_MASK) == pfn)
        return va;
    va = ask_helper(pfn);
    if (va != UINT64_MAX) {
        if (va != 0)
            D.va_of[pfn - D.first_pfn] = va;
        return va;
    }
    /* Mapped by no one (most often a page a promotion freed): no scan can find it. */
    uint64_t mappings = 1;
    if (D.kpagecount >= 0 && pread(D.kpagecount, &mappings, sizeof mappings, (off_t)pfn * 8) == sizeof mappings &&
        mappings == 0)
        return 0;
    /* The child mapped new memory since the last look, or the page is not the child's
     * (the kernel's, one freed by a promotion): look again, once a batch, at most every
     * SCAN_INTERVAL_MS, and only if the child faulted since: a scan is work on the
     * guest's vCPU too (a 32 MiB child: ~1.7 M instructions; one inside an ROI made the
     * hot-set read under skybyte-p 3.2 ms instead of 2.0, docs/host-os.md), and a child
     * that does not fault rarely has pages moved under it (compaction). */
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const long since_ms = (now.tv_sec - D.last_scan.tv_sec) * 1000 + (now.tv_nsec - D.last_scan.tv_nsec) / 1000000;
    if (D.looked || (D.scans > 0 && since_ms < SCAN_INTERVAL_MS))
        return 0;
    D.looked = 1; /* (reading the child's faults is work too: once a batch) */
    const uint64_t faults = child_faults();
    if (D.scans > 0 && faults != UINT64_MAX && faults == D.faults_at_scan)
        return 0;
    scan();
    D.last_scan = now;
    D.faults_at_scan = faults;
    va = D.va_of[pfn - D.first_pfn];
    return va != 0 && (pagemap_entry(va) & PFN_MASK) == pfn ? va : 0;
}

static void remember(uint64_t page, uint64_t va)
{
    if (D.n_promoted == D.cap_promoted) {
        D.cap_promoted = D.cap_promoted ? 2 * D.cap_promoted : 1024;
        D.promoted_page = realloc(D.promoted_page, D.cap_promoted * sizeof *D.promoted_page);
        D.promoted_va = realloc(D.promoted_va, D.cap_promoted * sizeof *D.promoted_va);
        if (D.promoted_page == NULL || D.promoted_va == NULL) {
            perror("cxlssd-promote");
            exit(1);
        }
    }
    D.promoted_page[D.n_promoted] = page;
    D.promoted_va[D.n_promoted++] = va;
}

/* Where a promoted device page is in the child now: its index in D.promoted_page, or
 * D.n_promoted if it is not there. */
static uint64_t promoted_index(uint64_t page)
{
    uint64_t i = 0;
    while (i < D.n_promoted && D.promoted_page[i] != page)
        i++;
    return i;
}

/* One batch of decisions carried out with one move_pages(2) call: demotions first (they
 * make room; the kernel moves a call's pages in order), then promotions. The kernel's
 * per-call work (lru_cache_disable: an expedited RCU grace period and an LRU drain on
 * every CPU, kworkers included, during which the daemon leaves its CPU) is paid once a
 * look: with a call per demotion, a look with a full budget blocked ~17 times (tpcc,
 * skybyte-p, 3 threads), and the kernel threads it waited for ran on the program's clock. */
static void move(const uint64_t *decisions, unsigned n)
{
    void *at[MAX_BATCH];
    uint64_t which[MAX_BATCH], ram_pa[MAX_BATCH], unmapped[MAX_BATCH];
    int nodes[MAX_BATCH], status[MAX_BATCH];
    unsigned k = 0, n_unmapped = 0;
    for (unsigned i = 0; i < n; i++) { /* demotions first: they make room */
        if (!(decisions[i] & CXLSSD_PV_DEMOTE))
            continue;
        const uint64_t page = decisions[i] & ~CXLSSD_PV_DEMOTE;
        const uint64_t j = promoted_index(page);
        const uint64_t va = j < D.n_promoted ? D.promoted_va[j] : 0;
        const uint64_t entry = va ? pagemap_entry(va) : 0;
        if (j < D.n_promoted) { /* forgotten whether it moves or not: the firmware does */
            D.promoted_page[j] = D.promoted_page[--D.n_promoted];
            D.promoted_va[j] = D.promoted_va[D.n_promoted];
        }
        D.demoted++;
        if (!(entry & PAGE_PRESENT)) { /* gone (the child freed it): reported, not moved */
            cxlssd_report(CXLSSD_CMD_DEMOTED, page, 0);
            continue;
        }
        at[k] = (void *)va;
        ram_pa[k] = (entry & PFN_MASK) << PAGE_SHIFT;
        nodes[k] = D.cxl_node;
        which[k++] = page;
    }
    const unsigned demotions = k;
    for (unsigned i = 0; i < n; i++) {
        if (decisions[i] & CXLSSD_PV_DEMOTE)
            continue;
        const uint64_t va = virtual_page(decisions[i]);
        if (va == 0) { /* reported after the demotions, as it failed after them */
            unmapped[n_unmapped++] = decisions[i];
            continue;
        }
        at[k] = (void *)va;
        nodes[k] = D.dram_node;
        which[k++] = decisions[i];
    }
    long moved = 0;
    if (k > 0 && (moved = syscall(SYS_move_pages, D.pid, (unsigned long)k, at, nodes, status, MPOL_MF_MOVE)) < 0)
        D.other_status = -errno; /* the call failed as a whole: nothing moved */
    for (unsigned i = 0; i < demotions; i++) {
        const uint64_t now = pagemap_entry((uint64_t)at[i]);
        /* its new device page, known without a scan (a move is not the child's fault) */
        const uint64_t pfn = now & PFN_MASK;
        if ((now & PAGE_PRESENT) && pfn >= D.first_pfn && pfn <= D.last_pfn)
            D.va_of[pfn - D.first_pfn] = (uint64_t)at[i];
        /* reported whatever became of it: the firmware forgets it */
        cxlssd_report(CXLSSD_CMD_DEMOTED, which[i], ram_pa[i]);
    }
    for (unsigned i = 0; i < n_unmapped; i++) {
        D.unmapped++;
        failed(unmapped[i]);
    }
    for (unsigned i = demotions; i < k; i++) {
        const uint64_t now = pagemap_entry((uint64_t)at[i]);
        if (moved < 0 || status[i] != D.dram_node || !(now & PAGE_PRESENT)) { /* the status is the page's node */
            if (moved >= 0) {
                D.shared += status[i] == -EACCES;
                D.busy += status[i] == -EBUSY;
                if (status[i] != -EACCES && status[i] != -EBUSY)
                    D.other_status = status[i];
            }
            failed(which[i]);
            continue;
        }
        remember(which[i], (uint64_t)at[i]);
        D.promoted++;
        cxlssd_report(CXLSSD_CMD_PROMOTED, which[i], (now & PFN_MASK) << PAGE_SHIFT);
    }
}

/* Carry out the decisions the mailbox holds now (not those posted meanwhile: the
 * child's exit is looked at between batches); returns how many there were. The clock
 * read first is a barrier: the firmware answers it after serving every access published
 * before it, so the mailbox holds all the decisions those accesses made. Without it,
 * what a poll found depended on how far the firmware lagged the guest in host time.
 * The entries are copied out and `taken` written before any device access of the moves:
 * the firmware reads it at this batch's first report, and counts the room from it. */
static unsigned drain(volatile unsigned long long *pv)
{
    cxlssd_clock_ns();
    const volatile struct cxlssd_pv_header *header = (const volatile struct cxlssd_pv_header *)pv;
    const uint32_t entries = header->mailbox_entries;
    volatile struct cxlssd_pv_mailbox *box =
        (volatile struct cxlssd_pv_mailbox *)((volatile char *)pv + header->mailbox_offset);
    const uint64_t head = box->head, tail = box->tail;
    uint64_t batch[MAX_BATCH];
    unsigned done = 0;
    for (uint64_t at = tail; at != head && done < MAX_BATCH; at++)
        batch[done++] = box->entries[at % entries];
    box->taken = tail + done;
    D.looked = D.reopened = 0;
    move(batch, done);
    box->tail = tail + done;
    return done;
}

/* One look at the mailbox, bracketed for the firmware's transfer engine as the device's
 * work (XFER_BY_OS, firmware/hints.py): SkyByte's promotion thread is the device's, and
 * the program's CPU pays nothing for its moves. The daemon runs SCHED_FIFO: the child
 * runs inside the bracket only while move_pages(2) blocks, and the kernel helper marks
 * those spans (DAEMON): what the look itself does is taken back from the vCPU's clock.
 * A look preempts the child anywhere, also between its writing its vCPU's pv slot and its
 * marker, or its clock-read marker and reading the answer: the slot is restored after. */
static unsigned look(volatile unsigned long long *pv)
{
    const volatile struct cxlssd_pv_header *header = (const volatile struct cxlssd_pv_header *)pv;
    const unsigned cpu = (unsigned)sched_getcpu();
    volatile struct cxlssd_pv_slot *slot =
        cpu < header->slots ? (volatile struct cxlssd_pv_slot *)((volatile char *)pv + header->slot_offset +
                                                                  cpu * header->slot_bytes)
                            : NULL;
    uint64_t kept[4] = {0};
    if (slot != NULL) {
        kept[0] = slot->clock_ns;
        kept[1] = slot->seq;
        kept[2] = slot->arg0;
        kept[3] = slot->arg1;
    }
    const unsigned long long ticket = ++D.looks;
    cxlssd_report(CXLSSD_CMD_XFER_BEGIN, CXLSSD_XFER_BY_OS | ticket << 1, 0);
    const unsigned done = drain(pv);
    cxlssd_report(CXLSSD_CMD_XFER_END, ticket, 0);
    if (slot != NULL && (unsigned)sched_getcpu() == cpu) { /* (moved: another thread may own it now) */
        slot->clock_ns = kept[0];
        slot->seq = kept[1];
        slot->arg0 = kept[2];
        slot->arg1 = kept[3];
    }
    return done;
}

static int exit_status(int status)
{
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int main(int argc, char **argv)
{
    unsigned long interval_us = 100;
    int first = 1;
    while (first < argc && strcmp(argv[first], "--") != 0) {
        char *end;
        if (strcmp(argv[first], "--interval-us") == 0 && first + 1 < argc) {
            interval_us = strtoul(argv[first + 1], &end, 10);
            if (*end != '\0' || interval_us == 0 || interval_us > 1000000) {
                fprintf(stderr, "cxlssd-promote: --interval-us must be 1..1000000\n%s", USAGE);
                return 2;
            }
            first += 2;
        } else {
            fprintf(stderr, "cxlssd-promote: unknown argument '%s'\n%s", argv[first], USAGE);
            return 2;
        }
    }
    if (first + 1 >= argc) {
        fprintf(stderr, "cxlssd-promote: no COMMAND after --\n%s", USAGE);
        return 2;
    }
    char **command = argv + first + 1;
    volatile unsigned long long *pv = cxlssd_pv_page();
    unsigned long long base = 0, size = 0;
    D.cxl_node = cxlssd_cxl_node();
    D.dram_node = cxlssd_dram_node();
    if (pv == NULL || !(cxlssd_features() & CXLSSD_FEATURE_PROMOTION) || cxlssd_cxl_range(&base, &size) != 0 ||
        D.cxl_node < 0) {
        execvp(command[0], command); /* nothing to promote: just the command */
        fprintf(stderr, "cxlssd-promote: cannot run %s: %s\n", command[0], strerror(errno));
        return 127;
    }
    D.first_pfn = base >> PAGE_SHIFT;
    D.last_pfn = (base + size - 1) >> PAGE_SHIFT;
    D.va_of = calloc(D.last_pfn - D.first_pfn + 1, sizeof *D.va_of);
    if (D.va_of == NULL) {
        perror("cxlssd-promote");
        return 1;
    }
    const pid_t parent = getpid();
    child = fork();
    if (child < 0) {
        perror("cxlssd-promote: fork");
        return 1;
    }
    if (child == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the daemon */
        if (getppid() != parent)
            _exit(1);
        execvp(command[0], command);
        fprintf(stderr, "cxlssd-promote: cannot run %s: %s\n", command[0], strerror(errno));
        _exit(127);
    }
    /* Real-time, as SkyByte's promotion thread runs beside the program: a look never
     * waits for the child's share of the CPU, and the child runs in it only where the
     * look blocks (marked by the kernel helper: its time there stays the child's). The
     * child was forked before: it keeps the normal policy. */
    const struct sched_param fifo = {.sched_priority = 1};
    D.realtime = sched_setscheduler(0, SCHED_FIFO, &fifo) == 0;
    signal(SIGINT, forward_signal);
    signal(SIGTERM, forward_signal);
    signal(SIGHUP, forward_signal);
    D.pid = child;
    D.pagemap = -1;
    D.kpagecount = open("/proc/kpagecount", O_RDONLY | O_CLOEXEC);
    /* The kernel helper's wake-ups, and the child's exit as a descriptor to wait on beside
     * them; without either, the timed polls and the page-map scans. */
    D.helper = open("/dev/cxlssd_promote", O_RDONLY | O_CLOEXEC);
    const int child_exit = D.helper >= 0 ? (int)syscall(SYS_pidfd_open, child, 0) : -1;
    if (D.helper >= 0 && child_exit < 0) {
        close(D.helper);
        D.helper = -1;
    }
    int status = 0;
    unsigned backoff = 1;
    for (;;) {
        pid_t done = waitpid(child, &status, WNOHANG);
        if (done == child || (done < 0 && errno != EINTR))
            break;
        if (look(pv) > 0) {
            /* The batch's reports may have made room for decisions that waited in the
             * firmware: it posts them as it serves the reports, and the next drain's
             * clock read waits for that. Look again at once rather than wait for a ring:
             * none came for them while the guest idled in a benchmark's cxlssd_settle,
             * and the mailbox stayed full for the whole 60 s (measured). */
            backoff = 1;
            continue;
        }
        if (backoff < MAX_BACKOFF)
            backoff *= 2;
        if (D.helper >= 0) {
            struct pollfd wait_for[2] = {{.fd = D.helper, .events = POLLIN}, {.fd = child_exit, .events = POLLIN}};
            uint64_t rings;
            if (poll(wait_for, 2, -1) > 0 && (wait_for[0].revents & POLLIN)) {
                const ssize_t got = read(D.helper, &rings, sizeof rings);
                if (got == (ssize_t)sizeof rings) {
                    D.wakeups++;
                } else if (got == 0) { /* the helper is going: poll and scan from here on */
                    close(D.helper);
                    D.helper = -1;
                }
            }
            continue;
        }
        const unsigned long pause_us = interval_us * backoff;
        const struct timespec pause = {.tv_sec = (time_t)(pause_us / 1000000),
                                       .tv_nsec = (long)(pause_us % 1000000) * 1000};
        nanosleep(&pause, NULL);
    }
    fprintf(stderr, "cxlssd-promote: %" PRIu64 " promoted, %" PRIu64 " demoted, %" PRIu64 " failed (%" PRIu64
                    " not mapped, %" PRIu64 " shared, %" PRIu64 " busy, last other status %d), %" PRIu64 " scans, woken %" PRIu64 " times by the kernel helper%s, %" PRIu64
                    " pages located by it, %" PRIu64 " looks%s\n",
            D.promoted, D.demoted, D.failed, D.unmapped, D.shared, D.busy, D.other_status, D.scans, D.wakeups,
            D.helper >= 0 ? "" : " (polled the mailbox: no /dev/cxlssd_promote)", D.asked, D.looks,
            D.realtime ? "" : " (not real-time: the child may run inside them)");
    return exit_status(status);
}

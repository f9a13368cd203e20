/*
 * skidprobe - measure the skid of the guest kernel helper (host_os/kmod/cxlssd_helper.c):
 * how many guest instructions run between a long access and the kernel's reaction to
 * the firmware's "long delay" answer.
 *
 *     skidprobe skid BYTES SAMPLES SPIN SEED [straight]   (bound to the CXL node: numactl --membind)
 *     skidprobe spin ITERATIONS
 *
 * skid: touches BYTES of memory, then SAMPLES times reads one random line of it with a
 * plain one-byte load (under a design that switches, every device read is a query: the
 * plugin holds the vCPU until the firmware has answered in the pv slot, and rings the
 * helper's doorbell if the answer is "long"), between two
 * reads of the guest TSC (t0 before the load, t1 after it; t1 - t0 is
 * query_ticks) and, if the answer is "long", spins SPIN iterations of a two-instruction
 * loop while the kernel reacts. The kernel's events (its TSC at the reaction and the
 * ticket) come from /dev/cxlssd_helper; skid = event TSC - t0: from just before the
 * access (the kernel may react before t1 is read), so it includes the few instructions
 * of the access and the TSC read (query_ticks without an interrupt). Under -icount
 * shift=0 the TSC counts guest instructions. Prints one JSON object. With "straight", 200
 * additions follow the load in the same basic block (one translation block), so a
 * reaction taken at the block's end instead of right after the access shows as +200.
 *
 * spin: the TSC ticks a loop of ITERATIONS x 2 instructions takes (the instruction clock's
 * check, and with the helper polling, its cost: ticks / (2 x ITERATIONS) - 1).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <x86intrin.h>

#include "cxlssd.h" /* cxlssd_pv_page(); includes cxlssd_abi.h */

struct helper_event { /* struct cxlssd_helper_event of the module */
    uint64_t tsc, ticket, ready_ns;
    uint32_t source, cpu;
};

#define SOURCE_TIMER 1u
#define SOURCE_DOORBELL 2u
#define SOURCE_PARK 3u
#define SOURCE_RESUMED 4u
#define GAP_TICKS 400 /* the other thread's loop takes ~10: a longer gap is another thread running */
#define MAX_GAPS 65536
#define DRAIN_TIMEOUT_MS 2000
#define STRAIGHT_INSNS_TEXT "200"

static uint64_t tsc(void)
{
    unsigned aux;
    return __rdtscp(&aux);
}

static void spin(uint64_t iterations)
{
    if (iterations == 0) {
        return;
    }
    __asm__ volatile("1: dec %0\n\tjnz 1b" : "+r"(iterations) : : "cc");
}


static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static void print_list(const char *name, uint64_t *values, size_t n)
{
    qsort(values, n, sizeof values[0], cmp_u64);
    printf("\"%s\": [", name);
    for (size_t i = 0; i < n; i++) {
        printf("%s%" PRIu64, i ? ", " : "", values[i]);
    }
    printf("]");
}

static uint64_t next_random(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

static int run_skid(uint64_t bytes, size_t samples, uint64_t spin_iterations, uint64_t seed, int straight)
{
    volatile uint64_t *page = (volatile uint64_t *)cxlssd_pv_page();
    if (page == NULL) {
        fprintf(stderr, "skidprobe: no paravirtual page (boot with the platform's plugin)\n");
        return 1;
    }
    const volatile struct cxlssd_pv_header *header = (const volatile void *)page;
    unsigned cpu = (unsigned)sched_getcpu();
    if (cpu >= header->slots) {
        fprintf(stderr, "skidprobe: CPU %u has no pv slot\n", cpu);
        return 1;
    }
    const volatile struct cxlssd_pv_slot *slot =
        (const volatile void *)((const volatile char *)page + header->slot_offset + cpu * header->slot_bytes);
    unsigned char *data = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint64_t *tickets = calloc(samples, sizeof *tickets), *t0s = calloc(samples, sizeof *t0s);
    uint64_t *timer = calloc(samples * 2, sizeof *timer), *doorbell = calloc(samples * 2, sizeof *doorbell);
    uint64_t *query = calloc(samples, sizeof *query);
    /* per long sample: the skid of its first reaction per source (0: none) */
    uint64_t *first_timer = calloc(samples, sizeof *first_timer);
    uint64_t *first_doorbell = calloc(samples, sizeof *first_doorbell);
    if (data == MAP_FAILED || !tickets || !t0s || !timer || !doorbell || !query || !first_timer || !first_doorbell) {
        fprintf(stderr, "skidprobe: out of memory\n");
        return 1;
    }
    for (uint64_t i = 0; i < bytes; i += 4096) {
        data[i] = (unsigned char)i;
    }
    /* Opened after the set-up: the helper queues events only for an open reader, and the
     * set-up's own long reads (they ring with context_switch.outside_roi) are no samples. */
    int fd = open("/dev/cxlssd_helper", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "skidprobe: /dev/cxlssd_helper: %s (is cxlssd_helper loaded?)\n", strerror(errno));
        return 1;
    }
    size_t longs = 0, shorts = 0, n_timer = 0, n_doorbell = 0, unmatched = 0, late = 0;
    struct helper_event events[64];
    uint64_t state = seed | 1;
    CXLSSD_ROI_BEGIN(1); /* the plugin asks about reads only inside an ROI (by default) */
    for (size_t s = 0; s < samples + 1; s++) {
        /* Drain what came meanwhile (also after the last sample, with a deadline). */
        for (;;) {
            if (s == samples) {
                struct pollfd waiter = {.fd = fd, .events = POLLIN};
                if (poll(&waiter, 1, DRAIN_TIMEOUT_MS) <= 0) {
                    break;
                }
            }
            ssize_t got = read(fd, events, sizeof events);
            if (got <= 0) {
                break;
            }
            for (size_t e = 0; e < (size_t)got / sizeof events[0]; e++) {
                size_t k = longs;
                while (k > 0 && tickets[k - 1] != events[e].ticket) {
                    k--;
                }
                if (k == 0 || events[e].tsc < t0s[k - 1]) {
                    unmatched++;
                    continue;
                }
                if (k != longs) {
                    late++; /* after the sample's spin ended */
                }
                uint64_t skid = events[e].tsc - t0s[k - 1];
                uint64_t *first = events[e].source == SOURCE_TIMER ? first_timer : first_doorbell;
                if (first[k - 1] == 0) {
                    first[k - 1] = skid;
                }
                if (events[e].source == SOURCE_TIMER) {
                    timer[n_timer++] = skid;
                } else {
                    doorbell[n_doorbell++] = skid;
                }
            }
        }
        if (s == samples) {
            break;
        }
        const volatile unsigned char *p = data + (next_random(&state) % (bytes / 64)) * 64;
        unsigned value;
        const uint64_t ticket_before = slot->query_ticket; /* an LLC hit asks nothing */
        uint64_t t0 = tsc();
        if (straight) {
            /* The access, then STRAIGHT_INSNS instructions in the same basic block: a
             * reaction that comes one translation block late shows as + STRAIGHT_INSNS. */
            __asm__ volatile("movzbl (%1), %0\n\t"
                             ".rept " STRAIGHT_INSNS_TEXT "\n\tadd $1, %0\n\t.endr"
                             : "=&r"(value)
                             : "r"(p)
                             : "memory", "cc");
        } else {
            __asm__ volatile("movzbl (%1), %0"
                             : "=r"(value)
                             : "r"(p)
                             : "memory");
        }
        uint64_t t1 = tsc();
        (void)value;
        if (slot->query_ticket == ticket_before || !slot->query_long) {
            shorts++;
            continue;
        }
        query[longs] = t1 - t0;
        tickets[longs] = slot->query_ticket;
        t0s[longs++] = t0;
        spin(spin_iterations);
    }
    CXLSSD_ROI_END(1);
    printf("{\"mode\": \"skid\", \"samples\": %zu, \"long\": %zu, \"short\": %zu, \"spin_iterations\": %" PRIu64
           ", \"unmatched\": %zu, \"late\": %zu, ",
           samples, longs, shorts, spin_iterations, unmatched, late);
    /* Per long sample, in order (before the lists below sort them): its query ticks and
     * the skid of its first timer and doorbell reaction (0: none). */
    printf("\"per_sample\": [");
    for (size_t i = 0; i < longs; i++) {
        printf("%s[%" PRIu64 ", %" PRIu64 ", %" PRIu64 "]", i ? ", " : "", query[i], first_timer[i],
               first_doorbell[i]);
    }
    printf("], ");
    print_list("query_ticks", query, longs);
    printf(", ");
    print_list("timer_skid", timer, n_timer);
    printf(", ");
    print_list("doorbell_skid", doorbell, n_doorbell);
    printf("}\n");
    close(fd);
    return 0;
}

/* ---- switch: what the helper's switch costs (a second thread spins meanwhile) ------------ */

struct gap {
    uint64_t from, to;
};

static struct {
    volatile int stop;
    struct gap gaps[MAX_GAPS];
    size_t n;
} other;

/* The other thread: runs whenever the prober sleeps; a gap in its TSC readings is the time
 * the CPU was elsewhere. */
static void *other_thread(void *unused)
{
    (void)unused;
    uint64_t last = tsc();
    while (!other.stop) {
        uint64_t now = tsc();
        if (now - last > GAP_TICKS && other.n < MAX_GAPS) {
            other.gaps[other.n].from = last;
            other.gaps[other.n++].to = now;
        }
        last = now;
    }
    return NULL;
}

/* The end of the first gap of the other thread that ends after `tsc`, or 0. */
static uint64_t other_runs_after(uint64_t when)
{
    for (size_t i = 0; i < other.n; i++) {
        if (other.gaps[i].to > when && other.gaps[i].from < when) {
            return other.gaps[i].to;
        }
    }
    return 0;
}

static int run_switch(uint64_t bytes, size_t samples, uint64_t seed)
{
    volatile uint64_t *page = (volatile uint64_t *)cxlssd_pv_page();
    if (page == NULL) {
        fprintf(stderr, "skidprobe: needs the pv page\n");
        return 1;
    }
    const volatile struct cxlssd_pv_header *header = (const volatile void *)page;
    const volatile struct cxlssd_pv_slot *slot =
        (const volatile void *)((const volatile char *)page + header->slot_offset);
    unsigned char *data = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint64_t *t0s = calloc(samples, sizeof *t0s), *tickets = calloc(samples, sizeof *tickets);
    struct helper_event *events = calloc(samples * 4 + 64, sizeof *events);
    if (data == MAP_FAILED || !t0s || !tickets || !events) {
        fprintf(stderr, "skidprobe: out of memory\n");
        return 1;
    }
    for (uint64_t i = 0; i < bytes; i += 4096) {
        data[i] = (unsigned char)i;
    }
    /* Opened after the set-up, as in run_skid: its own long reads filled the helper's
     * event buffer (4096) before any sample when it was opened first. */
    int fd = open("/dev/cxlssd_helper", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "skidprobe: /dev/cxlssd_helper: %s (is cxlssd_helper loaded?)\n", strerror(errno));
        return 1;
    }
    pthread_t thread;
    if (pthread_create(&thread, NULL, other_thread, NULL) != 0) {
        fprintf(stderr, "skidprobe: cannot start the other thread\n");
        return 1;
    }
    size_t longs = 0, n_events = 0;
    uint64_t state = seed | 1;
    CXLSSD_ROI_BEGIN(1);
    for (size_t s = 0; s < samples; s++) {
        const volatile unsigned char *p = data + (next_random(&state) % (bytes / 64)) * 64;
        unsigned value;
        const uint64_t ticket_before = slot->query_ticket; /* an LLC hit asks nothing */
        uint64_t t0 = tsc();
        __asm__ volatile("movzbl (%1), %0"
                         : "=r"(value)
                         : "r"(p)
                         : "memory");
        (void)value;
        if (slot->query_ticket != ticket_before && slot->query_long) {
            t0s[longs] = t0;
            tickets[longs++] = slot->query_ticket;
        }
        ssize_t got;
        while (n_events < samples * 4 &&
               (got = read(fd, events + n_events, 64 * sizeof *events)) > 0) {
            n_events += (size_t)got / sizeof *events;
        }
    }
    CXLSSD_ROI_END(1);
    other.stop = 1;
    pthread_join(thread, NULL);
    /* Per parked long access: access -> interrupt handler -> park -> the other thread runs
     * -> the parked thread runs again. */
    printf("{\"mode\": \"switch\", \"samples\": %zu, \"long\": %zu, \"gaps\": %zu, \"parks\": [",
           samples, longs, other.n);
    size_t printed = 0;
    for (size_t e = 0; e < n_events; e++) {
        if (events[e].source != SOURCE_PARK) {
            continue;
        }
        uint64_t irq = 0, resumed = 0, t0 = 0;
        for (size_t f = 0; f < n_events; f++) {
            if (events[f].ticket == events[e].ticket && events[f].source == SOURCE_DOORBELL) {
                irq = events[f].tsc;
            }
            if (events[f].ticket == events[e].ticket && events[f].source == SOURCE_RESUMED) {
                resumed = events[f].tsc;
            }
        }
        for (size_t k = 0; k < longs; k++) {
            if (tickets[k] == events[e].ticket) {
                t0 = t0s[k];
            }
        }
        uint64_t other_ran = other_runs_after(events[e].tsc);
        /* [access->irq, irq->park, park->other thread, park->resumed] in TSC ticks (0: unknown) */
        printf("%s[%" PRIu64 ", %" PRIu64 ", %" PRIu64 ", %" PRIu64 "]", printed++ ? ", " : "",
               t0 && irq ? irq - t0 : 0, irq ? events[e].tsc - irq : 0,
               other_ran ? other_ran - events[e].tsc : 0, resumed ? resumed - events[e].tsc : 0);
    }
    printf("]}\n");
    close(fd);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "switch") == 0) {
        uint64_t bytes = strtoull(argv[2], NULL, 0);
        size_t samples = strtoull(argv[3], NULL, 0);
        if (bytes < 4096 || samples == 0) {
            fprintf(stderr, "skidprobe: BYTES >= 4096 and SAMPLES > 0\n");
            return 2;
        }
        return run_switch(bytes, samples, strtoull(argv[4], NULL, 0));
    }
    if (argc == 3 && strcmp(argv[1], "spin") == 0) {
        uint64_t iterations = strtoull(argv[2], NULL, 0);
        uint64_t t0 = tsc();
        spin(iterations);
        uint64_t t1 = tsc();
        printf("{\"mode\": \"spin\", \"iterations\": %" PRIu64 ", \"ticks\": %" PRIu64 "}\n", iterations, t1 - t0);
        return 0;
    }
    if ((argc == 6 || argc == 7) && strcmp(argv[1], "skid") == 0) {
        uint64_t bytes = strtoull(argv[2], NULL, 0);
        size_t samples = strtoull(argv[3], NULL, 0);
        if (bytes < 4096 || samples == 0) {
            fprintf(stderr, "skidprobe: BYTES >= 4096 and SAMPLES > 0\n");
            return 2;
        }
        int straight = argc == 7 && strcmp(argv[6], "straight") == 0;
        return run_skid(bytes, samples, strtoull(argv[4], NULL, 0), strtoull(argv[5], NULL, 0), straight);
    }
    fprintf(stderr, "usage: skidprobe skid BYTES SAMPLES SPIN SEED [straight] | skidprobe spin ITERATIONS\n");
    return 2;
}

/*
 * chase - pointer-chase calibration program for the cxlssd platform.
 *
 * Lays one slot (a 64-byte-aligned line holding the next pointer) every
 * --stride bytes of an anonymous buffer, links all slots into a single random
 * cycle (Sattolo's algorithm, deterministic from --seed; --sequential: in
 * address order, so a pass streams through each page), chases it for --warm
 * full passes, waits for the page moves they decided (cxlssd_settle), then chases
 * --steps steps inside ROI --roi (`s = s->next`: each
 * step is one dependent load, a few instructions). With --write each measured
 * step also increments a counter in the slot's line (a store to every visited
 * line). Outside the ROI it checks the cycle and the measured phase, and prints
 * one JSON line. Exit status: 0 ok, 1 self-check or system failure, 2 usage.
 *
 * Memory placement is the caller's: run it under `numactl --membind=N`.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cxlssd.h"

#define LINE_BYTES 64u

struct slot {
    struct slot *next;
    uint64_t visits; /* measured --write/--stores steps that stored to this slot */
};

struct options {
    uint64_t size_bytes;
    uint64_t stride_bytes;
    uint64_t warm_passes;
    uint64_t steps;
    bool steps_given;
    unsigned roi;
    uint64_t seed;
    bool write;
    bool sequential;
    bool stores;
};

static const char USAGE[] =
    "usage: chase --bytes N[K|M|G] [--stride BYTES] [--warm PASSES] [--steps N]\n"
    "             [--roi ID] [--seed S] [--write | --stores] [--sequential]\n"
    "  --bytes   buffer size (K/M/G = KiB/MiB/GiB), at least one stride\n"
    "  --stride  bytes between chased slots, a multiple of 64 (default 64)\n"
    "  --warm    full warm-up passes before the ROI (default 1)\n"
    "  --steps   measured steps inside the ROI (default: one full pass)\n"
    "  --roi     ROI id 0..255 (default 1)\n"
    "  --seed    seed of the random cycle (default 1)\n"
    "  --write   each measured step also stores to the visited line\n"
    "  --stores  the measured steps only store, slot after slot in address order\n"
    "            (no load: a store miss is a write, with or without a fetch)\n"
    "  --sequential  link the slots in address order instead of a random cycle\n";

__attribute__((format(printf, 1, 2), noreturn)) static void usage_error(const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fputs("chase: ", stderr);
    vfprintf(stderr, fmt, args);
    va_end(args);
    fprintf(stderr, "\n%s", USAGE);
    exit(2);
}

/* A decimal count with an optional K/M/G (binary) suffix; false if malformed or overflowing. */
static bool parse_count(const char *text, bool allow_suffix, uint64_t *value)
{
    if (text[0] < '0' || text[0] > '9')
        return false; /* strtoull would accept a sign or blanks */
    errno = 0;
    char *end;
    unsigned long long number = strtoull(text, &end, 10);
    if (errno != 0)
        return false;
    unsigned shift = 0;
    if (allow_suffix && *end != '\0' && end[1] == '\0') {
        switch (*end) {
        case 'K': case 'k': shift = 10; end++; break;
        case 'M': case 'm': shift = 20; end++; break;
        case 'G': case 'g': shift = 30; end++; break;
        default: return false;
        }
    }
    if (*end != '\0' || (shift != 0 && number > (UINT64_MAX >> shift)))
        return false;
    *value = (uint64_t)number << shift;
    return true;
}

static uint64_t count_arg(const char *name, const char *text, bool allow_suffix)
{
    uint64_t value;
    if (!parse_count(text, allow_suffix, &value))
        usage_error("--%s: '%s' is not a valid %s", name, text, allow_suffix ? "size" : "count");
    return value;
}

static struct options parse_options(int argc, char **argv)
{
    static const struct option long_options[] = {
        {"bytes", required_argument, NULL, 'b'}, {"stride", required_argument, NULL, 's'},
        {"warm", required_argument, NULL, 'w'},  {"steps", required_argument, NULL, 'n'},
        {"roi", required_argument, NULL, 'r'},   {"seed", required_argument, NULL, 'S'},
        {"write", no_argument, NULL, 'W'},       {"help", no_argument, NULL, 'h'},
        {"stores", no_argument, NULL, 'T'},      {"sequential", no_argument, NULL, 'Q'},
        {NULL, 0, NULL, 0},
    };
    struct options opt = {.stride_bytes = LINE_BYTES, .warm_passes = 1, .roi = 1, .seed = 1};
    bool size_given = false;
    uint64_t roi;
    int c;
    opterr = 0; /* our own messages, with the usage (and ':' below for a missing value) */
    while ((c = getopt_long(argc, argv, ":", long_options, NULL)) != -1) {
        switch (c) {
        case 'b': opt.size_bytes = count_arg("bytes", optarg, true); size_given = true; break;
        case 's': opt.stride_bytes = count_arg("stride", optarg, true); break;
        case 'w': opt.warm_passes = count_arg("warm", optarg, false); break;
        case 'n': opt.steps = count_arg("steps", optarg, false); opt.steps_given = true; break;
        case 'r':
            roi = count_arg("roi", optarg, false);
            if (roi >= CXLSSD_RUNTIME_IDS)
                usage_error("--roi %s: the id must be 0..255", optarg);
            opt.roi = (unsigned)roi;
            break;
        case 'S': opt.seed = count_arg("seed", optarg, false); break;
        case 'W': opt.write = true; break;
        case 'T': opt.stores = true; break;
        case 'Q': opt.sequential = true; break;
        case 'h': fputs(USAGE, stdout); exit(0);
        case ':': usage_error("%s needs a value", argv[optind - 1]);
        default: usage_error("unknown option %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        usage_error("unexpected argument '%s'", argv[optind]);
    if (!size_given)
        usage_error("%s", "--bytes is required");
    if (opt.stride_bytes == 0 || opt.stride_bytes % LINE_BYTES != 0)
        usage_error("%s", "--stride must be a positive multiple of 64");
    if (opt.size_bytes < opt.stride_bytes)
        usage_error("%s", "--bytes must be at least one --stride");
    if (opt.write && opt.stores)
        usage_error("%s", "--write and --stores exclude each other");
    return opt;
}

/* splitmix64: a small deterministic generator, so a seed always gives the same cycle. */
static uint64_t next_random(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static struct slot *slot_at(char *base, uint64_t stride_bytes, uint64_t index)
{
    return (struct slot *)(base + index * stride_bytes);
}

/*
 * Sattolo's algorithm applied to the next pointers themselves (no side array,
 * so no memory off the bound node): start from the identity, then for
 * i = n-1 .. 1 swap next[i] with next[j], j uniform in [0, i). The result is a
 * single cycle through all n slots. (The modulo bias is below 2^-30.)
 */
static void link_cycle(char *base, uint64_t stride_bytes, uint64_t slots, uint64_t seed, bool sequential)
{
    for (uint64_t i = 0; i < slots; i++)
        *slot_at(base, stride_bytes, i) = (struct slot){.next = slot_at(base, stride_bytes, i)};
    if (sequential) { /* each slot to the next, the last back to the first */
        for (uint64_t i = 0; i < slots; i++)
            slot_at(base, stride_bytes, i)->next = slot_at(base, stride_bytes, (i + 1) % slots);
        return;
    }
    uint64_t state = seed;
    for (uint64_t i = slots - 1; i > 0; i--) {
        struct slot *a = slot_at(base, stride_bytes, i);
        struct slot *b = slot_at(base, stride_bytes, next_random(&state) % i);
        struct slot *swap = a->next;
        a->next = b->next;
        b->next = swap;
    }
}

/*
 * The measured loops. `sum` (the visited addresses) makes the result depend
 * on every load and proves the steps ran; the empty asm makes `s` opaque to
 * the optimiser at no instruction cost. noinline keeps them easy to inspect
 * with objdump.
 */
__attribute__((noinline)) static struct slot *chase_read(struct slot *s, uint64_t steps, uint64_t *sum)
{
    uint64_t total = 0;
    for (uint64_t i = 0; i < steps; i++) {
        total += (uintptr_t)s;
        s = s->next;
        __asm__ volatile("" : "+r"(s));
    }
    *sum = total;
    return s;
}

__attribute__((noinline)) static struct slot *chase_write(struct slot *s, uint64_t steps, uint64_t *sum)
{
    uint64_t total = 0;
    for (uint64_t i = 0; i < steps; i++) {
        total += (uintptr_t)s;
        s->visits++;
        s = s->next;
        __asm__ volatile("" : "+r"(s));
    }
    *sum = total;
    return s;
}

/* --stores: one store per step, slot after slot; the same slots and visit counts
 * as a chase of the sequential cycle from slot 0, with no load in the loop. */
__attribute__((noinline)) static struct slot *store_stream(char *base, uint64_t stride_bytes, uint64_t slots,
                                                          uint64_t steps, uint64_t *sum)
{
    uint64_t total = 0, index = 0, round = 1;
    for (uint64_t i = 0; i < steps; i++) {
        struct slot *s = slot_at(base, stride_bytes, index);
        total += (uintptr_t)s;
        s->visits = round; /* a plain store (visits++ would load the line first) */
        if (++index == slots) {
            index = 0;
            round++;
        }
    }
    *sum = total;
    return slot_at(base, stride_bytes, index);
}

struct expected {
    bool cycle_ok;       /* one cycle through every slot */
    bool chase_ok;       /* the measured phase ended where, and stored what, the cycle says */
    uint64_t offset_sum; /* sum of the byte offsets of the slots the measured phase visits */
};

/*
 * Walk the cycle from slot 0 once. Returning to slot 0 first after exactly n
 * valid steps means n distinct slots, i.e. every slot exactly once. The
 * measured phase (steps from slot 0) visits the slot at cycle position t
 * steps/n times, plus once more if t < steps % n.
 */
static struct expected check(char *base, const struct options *opt, uint64_t slots,
                             const struct slot *end)
{
    struct expected result = {.chase_ok = true};
    const uint64_t rounds = opt->steps / slots, rest = opt->steps % slots;
    const struct slot *s = slot_at(base, opt->stride_bytes, 0);
    uint64_t position = 0;
    do {
        uint64_t offset = (uint64_t)((uintptr_t)s - (uintptr_t)base);
        if (offset % opt->stride_bytes != 0 || offset / opt->stride_bytes >= slots)
            return (struct expected){0}; /* a pointer off the slots: the buffer is corrupt */
        uint64_t visits = rounds + (position < rest);
        result.offset_sum += visits * offset;
        if (position == rest && s != end)
            result.chase_ok = false;
        if (s->visits != (opt->write || opt->stores ? visits : 0))
            result.chase_ok = false;
        s = s->next;
        position++;
    } while (s != slot_at(base, opt->stride_bytes, 0) && position <= slots);
    result.cycle_ok = position == slots;
    return result;
}

int main(int argc, char **argv)
{
    struct options opt = parse_options(argc, argv);
    const uint64_t slots = opt.size_bytes / opt.stride_bytes;
    const uint64_t size_bytes = slots * opt.stride_bytes; /* whole strides only */
    if (!opt.steps_given)
        opt.steps = slots;
    char *base = mmap(NULL, size_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        fprintf(stderr, "chase: mmap of %" PRIu64 " bytes failed: %s\n", size_bytes, strerror(errno));
        return 1;
    }
    if (opt.stores)
        opt.sequential = true; /* the stream's order, for the check */
    link_cycle(base, opt.stride_bytes, slots, opt.seed, opt.sequential);

    struct slot *const start = slot_at(base, opt.stride_bytes, 0);
    uint64_t sum;
    for (uint64_t pass = 0; pass < opt.warm_passes; pass++)
        chase_read(start, slots, &sum);
    /* Under a design that promotes, the page moves decided in the set-up and the warm-up
     * belong to them: without this, whether the daemon (which shares the vCPU) was still
     * moving when the ROI began decided 13 or 15.4 ms of skybyte-full's chase (measured).
     * Returns at once otherwise. */
    cxlssd_settle(60000);

    if (cxlssd_roi_begin(opt.roi) != 0) {
        fprintf(stderr, "chase: cannot mark ROI %u\n", opt.roi);
        return 1;
    }
    struct slot *end = opt.stores  ? store_stream(base, opt.stride_bytes, slots, opt.steps, &sum)
                       : opt.write ? chase_write(start, opt.steps, &sum)
                                   : chase_read(start, opt.steps, &sum);
    cxlssd_roi_end(opt.roi);

    /* The checksum is the sum of the visited slots' offsets: independent of where mmap put the buffer. */
    const uint64_t checksum = sum - opt.steps * (uint64_t)(uintptr_t)base;
    struct expected expected = check(base, &opt, slots, end);
    const bool chase_ok = expected.cycle_ok && expected.chase_ok && checksum == expected.offset_sum;
    printf("{\"slots\": %" PRIu64 ", \"steps\": %" PRIu64 ", \"stride_bytes\": %" PRIu64
           ", \"bytes\": %" PRIu64 ", \"warm_passes\": %" PRIu64 ", \"roi\": %u, \"seed\": %" PRIu64
           ", \"write\": %s, \"checksum\": %" PRIu64 ", \"cycle_ok\": %s, \"chase_ok\": %s}\n",
           slots, opt.steps, opt.stride_bytes, size_bytes, opt.warm_passes, opt.roi, opt.seed,
           opt.write ? "true" : "false", checksum, expected.cycle_ok ? "true" : "false",
           chase_ok ? "true" : "false");
    munmap(base, size_bytes);
    return expected.cycle_ok && chase_ok ? 0 : 1;
}

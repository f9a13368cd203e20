/*
 * radix - LSD radix sort of 64-bit keys (cxlssd guest workload).
 *
 * --keys N uniform random 64-bit keys (splitmix64 from --seed) are sorted by 64 / B passes
 * of B-bit digits (--digit-bits B: 1, 2, 4 or 8, default 8), least significant first,
 * between the key array and a buffer of the same size: ROI --roi (1) is the whole sort, one
 * read pass that counts every pass's digit histogram and 64 / B scatter passes (a
 * sequential read, 2^B sequential write streams each). Fewer digit bits mean fewer write
 * streams, i.e. fewer pages being written at once, and more passes. With
 * --threads T, T POSIX threads sort a contiguous share of the array each, as a parallel LSD
 * sort does: they count their share's first digits, meet at a barrier, scatter their share
 * to offsets that keep the sort stable, and meet again; the result is the same. Each
 * thread counts the next pass's digits of the keys it scatters, per thread whose share
 * they land in, so the array is read once per pass, as with one thread (counted again
 * in a read pass of its own each pass, until 2026-12-07, three threads read the device
 * 45 % more than one thread: 18.9 M reads against 13.0 M at 48 MiB).
 * --warm-passes N sorts the same keys N times before the ROI, unmeasured, the keys written
 * again before each sort (SkyByte's artifact measures a pass of its trace after a warm-up
 * pass of it).
 * Self-check: the result is in order and holds the same multiset of keys (its sum, and the
 * sum of a hash of each key, equal the input's). One JSON line on stdout; exit 0, 1 if the
 * check failed, 2 for a usage error.
 */
#include "common.h"

#define MAX_RADIX 256u  /* 8-bit digits */
#define MAX_COUNTS 2048u /* passes x radix: 8 x 256 at most (1-bit digits: 64 x 2) */
#define DEFAULT_KEYS (1u << 20)
#define BYTES_PER_KEY (2 * sizeof(uint64_t)) /* the keys and the buffer */
#define MAX_KEYS (UINT64_MAX / BYTES_PER_KEY)

static const char USAGE[] =
    "usage: radix [--keys N | --footprint BYTES] [--digit-bits B] [--threads T] [--warm-passes N]\n"
    "             [--seed S] [--roi ID]\n"
    "  --keys        64-bit keys to sort (default 1M)\n"
    "  --digit-bits  bits a pass sorts by: 1, 2, 4 or 8 (default 8: 8 passes, 256 write streams)\n"
    "  --footprint   pick the keys so that keys and buffer (16 bytes a key) fit BYTES\n"
    "  --threads     POSIX threads sorting a share of the keys each (default 1)\n"
    "  --warm-passes unmeasured sorts of the same keys before the ROI (default 0)\n" WL_COMMON_USAGE;

/* 64 / B passes, an even number: the sorted keys end in the key array */
static const char *const DIGIT_BITS[] = {"1", "2", "4", "8", NULL};

struct options {
    uint64_t keys, threads, warm_passes;
    unsigned digit_bits;
    struct wl_common common;
};

static struct options parse_options(int argc, char **argv)
{
    struct options opt = {.keys = DEFAULT_KEYS, .threads = 1, .common = WL_COMMON_DEFAULTS};
    unsigned digit_choice = 3; /* "8" */
    struct wl_option options[] = {WL_SIZED("keys", &opt.keys, 1, MAX_KEYS),
                                  WL_CHOICE("digit-bits", &digit_choice, DIGIT_BITS),
                                  WL_COUNT("threads", &opt.threads, 1, WL_MAX_THREADS),
                                  WL_WARM_PASSES(&opt.warm_passes), WL_END};
    wl_parse(argc, argv, options, &opt.common);
    opt.digit_bits = 1u << digit_choice;
    if (opt.common.footprint != 0)
        opt.keys = wl_footprint_items(&opt.common, "keys", BYTES_PER_KEY, 0, 1, MAX_KEYS);
    return opt;
}

/* Sum of the keys, and sum of a hash of each: equal for the same multiset, in any order. */
struct multiset {
    uint64_t sum, hashes;
};

static void add_key(struct multiset *m, uint64_t key)
{
    m->sum += key;
    m->hashes += wl_mix64(key);
}

/* Sort keys[0 .. n) using buffer[0 .. n) by `bits`-bit digits; an even number of passes
 * leaves the result in keys. */
__attribute__((noinline)) static void radix_sort(uint64_t *keys, uint64_t *buffer, uint64_t n, unsigned bits)
{
    const unsigned passes = 64 / bits;
    const uint64_t mask = (1u << bits) - 1;
    uint64_t counts[MAX_COUNTS]; /* counts[pass << bits | digit] */
    memset(counts, 0, ((size_t)passes << bits) * sizeof counts[0]);
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t key = keys[i];
        for (unsigned pass = 0; pass < passes; pass++)
            counts[pass << bits | ((key >> (pass * bits)) & mask)]++;
    }
    uint64_t *from = keys, *to = buffer;
    for (unsigned pass = 0; pass < passes; pass++) {
        uint64_t next[MAX_RADIX], start = 0; /* where the next key with each digit goes */
        for (unsigned digit = 0; digit <= mask; digit++) {
            next[digit] = start;
            start += counts[pass << bits | digit];
        }
        const unsigned shift = pass * bits;
        for (uint64_t i = 0; i < n; i++) {
            const uint64_t key = from[i];
            to[next[(key >> shift) & mask]++] = key;
        }
        uint64_t *swap = from;
        from = to;
        to = swap;
    }
}

struct sort_run {
    uint64_t *keys, *buffer, n, threads;
    unsigned bits;
    uint64_t (*counts)[MAX_RADIX]; /* counts[k]: digits of the keys thread k scatters this pass */
    /* landed[parity][(w * T + k) * radix + digit]: keys writer w scattered in a pass of that
     * parity into thread k's share, by their next digit (two, so writers of a pass never
     * overwrite what owners of the last one still add up) */
    uint64_t *landed[2];
    pthread_barrier_t barrier;
};

/* The first position of thread k's share of a pass's input. */
static inline uint64_t share_begin(const struct sort_run *r, uint64_t k)
{
    return k * r->n / r->threads;
}

/* The thread whose share holds position q: the last k with share_begin(k) <= q. */
static inline uint64_t share_of(const struct sort_run *r, uint64_t q)
{
    const uint64_t k = ((q + 1) * r->threads - 1) / r->n;
    return k < r->threads ? k : r->threads - 1;
}

/* Thread k's share of radix_sort: keys [k n / T, (k + 1) n / T) of each pass's input go
 * after every smaller digit's and after the same digit's keys of threads j < k. */
static void sort_share(uint64_t k, void *shared)
{
    struct sort_run *r = shared;
    const uint64_t threads = r->threads, first = share_begin(r, k), end = share_begin(r, k + 1);
    const unsigned bits = r->bits, passes = 64 / bits;
    const uint64_t mask = (1u << bits) - 1, radix = mask + 1;
    uint64_t *from = r->keys, *to = r->buffer, *mine = r->counts[k];
    memset(mine, 0, radix * sizeof *mine);
    for (uint64_t i = first; i < end; i++)
        mine[from[i] & mask]++;
    for (unsigned pass = 0; pass < passes; pass++) {
        const unsigned shift = pass * bits;
        const bool counting = pass + 1 < passes;
        uint64_t *landed = r->landed[pass & 1], *row = landed + k * threads * radix;
        pthread_barrier_wait(&r->barrier); /* every thread's counts of this pass are in */
        uint64_t next[MAX_RADIX], owner[MAX_RADIX], owner_end[MAX_RADIX], start = 0;
        for (unsigned digit = 0; digit <= mask; digit++) {
            for (uint64_t j = 0; j < threads; j++) {
                if (j == k)
                    next[digit] = start;
                start += r->counts[j][digit];
            }
            owner[digit] = share_of(r, next[digit]); /* where the digit's next key lands */
            owner_end[digit] = share_begin(r, owner[digit] + 1);
        }
        if (counting)
            memset(row, 0, threads * radix * sizeof *row);
        for (uint64_t i = first; i < end; i++) {
            const uint64_t key = from[i], digit = (key >> shift) & mask, at = next[digit]++;
            while (at >= owner_end[digit])
                owner_end[digit] = share_begin(r, ++owner[digit] + 1);
            if (counting)
                row[owner[digit] * radix + ((key >> (shift + bits)) & mask)]++;
            to[at] = key;
        }
        pthread_barrier_wait(&r->barrier); /* the pass is whole, the counts read */
        if (counting) {
            memset(mine, 0, radix * sizeof *mine);
            for (uint64_t w = 0; w < threads; w++)
                for (uint64_t digit = 0; digit < radix; digit++)
                    mine[digit] += landed[(w * threads + k) * radix + digit];
        }
        uint64_t *swap = from;
        from = to;
        to = swap;
    }
}

/* The input: n keys from the seed's generator; their multiset into *input unless NULL. */
static void fill_keys(uint64_t *keys, uint64_t n, uint64_t seed, struct multiset *input)
{
    uint64_t state = wl_stream(seed, 1);
    for (uint64_t i = 0; i < n; i++) {
        keys[i] = wl_next(&state);
        if (input != NULL)
            add_key(input, keys[i]);
    }
}

/* With `roi`, its ROI begins once the threads have started (wl_run_threads). */
static void sort(struct sort_run *run, const struct wl_common *roi)
{
    if (run->threads > 1) {
        wl_run_threads(run->threads, sort_share, run, &run->barrier, roi);
    } else {
        wl_roi_begin(roi);
        radix_sort(run->keys, run->buffer, run->n, run->bits);
    }
}

int main(int argc, char **argv)
{
    wl_start("radix", USAGE);
    const struct options opt = parse_options(argc, argv);
    const uint64_t n = opt.keys;
    uint64_t *keys = wl_alloc(n * sizeof(uint64_t)), *buffer = wl_alloc(n * sizeof(uint64_t));
    struct multiset input = {0}, output = {0};
    fill_keys(keys, n, opt.common.seed, &input);

    const size_t landed = opt.threads > 1 ? opt.threads * opt.threads << opt.digit_bits : 0;
    struct sort_run run = {.keys = keys, .buffer = buffer, .n = n, .threads = opt.threads,
                           .bits = opt.digit_bits,
                           .counts = calloc(opt.threads, sizeof *run.counts),
                           .landed = {calloc(landed, sizeof(uint64_t)), calloc(landed, sizeof(uint64_t))}};
    if (run.counts == NULL || (landed > 0 && (run.landed[0] == NULL || run.landed[1] == NULL))) {
        fputs("radix: out of memory for the threads' counts\n", stderr);
        return 1;
    }

    for (uint64_t pass = 0; pass <= opt.warm_passes; pass++) {
        const bool roi = pass == opt.warm_passes;
        if (pass > 0) /* the same keys, unsorted again */
            fill_keys(keys, n, opt.common.seed, NULL);
        sort(&run, roi ? &opt.common : NULL);
    }
    wl_roi_end(&opt.common, &keys[n / 2], sizeof keys[0]);

    bool sorted = true;
    for (uint64_t i = 0; i < n; i++) {
        sorted &= i == 0 || keys[i - 1] <= keys[i];
        add_key(&output, keys[i]);
    }
    const bool ok = sorted && output.sum == input.sum && output.hashes == input.hashes;

    struct wl_json j = wl_report_begin();
    wl_json_u64(&j, "keys", n);
    wl_json_u64(&j, "threads", opt.threads);
    wl_json_u64(&j, "digit_bits", opt.digit_bits);
    wl_json_u64(&j, "warm_passes", opt.warm_passes);
    wl_report_data(&j, &opt.common);
    wl_json_u64(&j, "passes", 64 / opt.digit_bits);
    wl_json_bool(&j, "sorted", sorted);
    wl_json_u64(&j, "min_key", keys[0]);
    wl_json_u64(&j, "max_key", keys[n - 1]);
    return wl_report_end(&j, ok, output.hashes);
}

/*
 * common.h - what every cxlssd guest workload shares (header only, all static inline; each
 * workload is one C file, built with libcxlssd.c into bin/<name>, see docs/workloads.md):
 *
 *   - the command line: sizes with K/M/G/T suffixes, counts, reals, choices, and the options
 *     every workload has (--footprint, --seed, --roi, --help); usage errors exit 2;
 *   - deterministic generators: splitmix64, a bijective scramble of [0, n), a YCSB zipfian;
 *   - the data allocation (anonymous mmap: placement is the caller's, `numactl --membind=N`),
 *     counted for the report's footprint_bytes (before the ROI ends) and check_bytes (after);
 *   - the ROI markers (run-time id --roi through libcxlssd) and the one-line JSON report.
 */
#ifndef CXLSSD_WORKLOADS_COMMON_H
#define CXLSSD_WORKLOADS_COMMON_H

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cxlssd.h"

/* ---- the program ------------------------------------------------------------------ */

static struct {
    const char *name;    /* in messages and the report's "workload" */
    const char *usage;   /* the full usage text */
    uint64_t allocated;  /* bytes allocated by wl_alloc so far */
    uint64_t data_bytes; /* ... when the ROI ended: the workload's data */
} wl_program = {.name = "workload", .usage = ""};

/* The options every workload has, after its own. */
struct wl_common {
    uint64_t footprint; /* --footprint BYTES, 0 if not given: the workload derives its size from it */
    uint64_t seed;      /* --seed */
    unsigned roi;       /* --roi */
};

#define WL_COMMON_DEFAULTS {.footprint = 0, .seed = 1, .roi = 1}

#define WL_COMMON_USAGE                                                                      \
    "  --seed S          seed of every generator (default 1)\n"                                \
    "  --roi ID          ROI id 0..255 of the measured phase (default 1)\n"                    \
    "  sizes take K, M, G, T suffixes (binary multiples)\n"

static inline void wl_start(const char *name, const char *usage)
{
    wl_program.name = name;
    wl_program.usage = usage;
}

__attribute__((format(printf, 1, 2), noreturn)) static inline void wl_usage_error(const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "%s: ", wl_program.name);
    vfprintf(stderr, fmt, args);
    va_end(args);
    fprintf(stderr, "\n%s", wl_program.usage);
    exit(2);
}

/* A failure of the system (not of the arguments): message, exit 1. */
__attribute__((noreturn)) static inline void wl_fail(const char *what, uint64_t bytes)
{
    fprintf(stderr, "%s: %s of %" PRIu64 " bytes failed: %s\n", wl_program.name, what, bytes, strerror(errno));
    exit(1);
}

/* ---- argument values ---------------------------------------------------------------- */

/* A decimal number with, if `suffixed`, one of K M G T (binary multiples, either case) after it. */
static inline bool wl_parse_u64(const char *text, bool suffixed, uint64_t *value)
{
    static const char units[] = "KMGT";
    if (!isdigit((unsigned char)text[0]))
        return false; /* strtoull would take a sign or blanks */
    char *end;
    errno = 0;
    const unsigned long long number = strtoull(text, &end, 10);
    if (errno != 0)
        return false;
    unsigned shift = 0;
    const char *unit = suffixed && *end != '\0' ? strchr(units, toupper((unsigned char)*end)) : NULL;
    if (unit != NULL && *unit != '\0' && end[1] == '\0') {
        shift = 10 * (unsigned)(unit - units + 1);
        end++;
    }
    if (*end != '\0' || number > (UINT64_MAX >> shift))
        return false;
    *value = (uint64_t)number << shift;
    return true;
}

/* The value of --`name`: a size (suffix allowed) or a plain count, within [low, high]. */
static inline uint64_t wl_number_arg(const char *name, const char *text, bool size, uint64_t low,
                                     uint64_t high)
{
    uint64_t value;
    if (!wl_parse_u64(text, size, &value))
        wl_usage_error("--%s: '%s' is not a valid %s", name, text, size ? "size" : "count");
    if (value < low || value > high)
        wl_usage_error("--%s %s: must be %" PRIu64 "..%" PRIu64, name, text, low, high);
    return value;
}

/* A real number strictly between low and high. */
static inline double wl_real_arg(const char *name, const char *text, double low, double high)
{
    char *end;
    errno = 0;
    const double value = strtod(text, &end);
    if (end == text || *end != '\0' || errno != 0 || !isfinite(value))
        wl_usage_error("--%s: '%s' is not a number", name, text);
    if (!(value > low && value < high))
        wl_usage_error("--%s %s: must be strictly between %g and %g", name, text, low, high);
    return value;
}

/* The index of `text` in the NULL-terminated `choices`. */
static inline unsigned wl_choice_arg(const char *name, const char *text, const char *const choices[])
{
    for (unsigned i = 0; choices[i] != NULL; i++)
        if (strcmp(text, choices[i]) == 0)
            return i;
    char known[256] = "";
    for (unsigned i = 0; choices[i] != NULL; i++)
        snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "", choices[i]);
    wl_usage_error("--%s: '%s' is not one of %s", name, text, known);
}

/* ---- the command line ----------------------------------------------------------------
 *
 * A workload declares its options in a table, WL_END-terminated, and calls wl_parse:
 *
 *     struct wl_option options[] = {WL_SIZED("keys", &opt.keys, 1, MAX), WL_COUNT(...), WL_END};
 *     wl_parse(argc, argv, options, &opt.common);
 *     if (opt.common.footprint != 0)
 *         opt.keys = wl_footprint_items(&opt.common, "keys", BYTES_PER_KEY, 0, 1, MAX);
 */

enum wl_kind { WL_KIND_SIZE, WL_KIND_COUNT, WL_KIND_REAL, WL_KIND_CHOICE };

struct wl_option {
    const char *name;
    enum wl_kind kind;
    void *value;                /* uint64_t (sizes, counts), double (reals), unsigned (choices) */
    uint64_t low, high;         /* sizes and counts: the range, inclusive */
    double real_low, real_high; /* reals: the range, exclusive */
    const char *const *choices; /* choices: the names, NULL-terminated; the value is the index */
    bool sized;                 /* --footprint picks this option's value: the two are exclusive */
    bool given;                 /* set by wl_parse */
};

#define WL_OPTION_(name, kind, value, low, high, real_low, real_high, choices, sized)                 \
    {(name), (kind), (value), (low), (high), (real_low), (real_high), (choices), (sized), false}
#define WL_SIZE(name, value, low, high) WL_OPTION_(name, WL_KIND_SIZE, value, low, high, 0, 0, NULL, false)
#define WL_SIZED(name, value, low, high) WL_OPTION_(name, WL_KIND_SIZE, value, low, high, 0, 0, NULL, true)
#define WL_COUNT(name, value, low, high) WL_OPTION_(name, WL_KIND_COUNT, value, low, high, 0, 0, NULL, false)
#define WL_REAL(name, value, low, high) WL_OPTION_(name, WL_KIND_REAL, value, 0, 0, low, high, NULL, false)
#define WL_CHOICE(name, value, choices) WL_OPTION_(name, WL_KIND_CHOICE, value, 0, 0, 0, 0, choices, false)
#define WL_END WL_OPTION_(NULL, WL_KIND_SIZE, NULL, 0, 0, 0, 0, NULL, false)
/* --warm-passes N: the ROI's work N times before it, unmeasured (SkyByte's artifact measures a
 * pass of its trace after a warm-up pass); the same option and bound in every workload that has it. */
#define WL_WARM_PASSES(value) WL_COUNT("warm-passes", value, 0, 16)

#define WL_MAX_OPTIONS 16
enum { WL_OPT_FOOTPRINT = 256, WL_OPT_SEED, WL_OPT_ROI, WL_OPT_HELP, WL_OPT_OWN = 512 };

static inline void wl_option_value(struct wl_option *o, const char *text)
{
    switch (o->kind) {
    case WL_KIND_SIZE:
    case WL_KIND_COUNT:
        *(uint64_t *)o->value = wl_number_arg(o->name, text, o->kind == WL_KIND_SIZE, o->low, o->high);
        break;
    case WL_KIND_REAL: *(double *)o->value = wl_real_arg(o->name, text, o->real_low, o->real_high); break;
    case WL_KIND_CHOICE: *(unsigned *)o->value = wl_choice_arg(o->name, text, o->choices); break;
    }
    o->given = true;
}

/* Parse the command line: the workload's `options`, then --footprint, --seed, --roi, --help. */
static inline void wl_parse(int argc, char **argv, struct wl_option *options, struct wl_common *common)
{
    struct option longs[WL_MAX_OPTIONS + 5] = {
        {"footprint", required_argument, NULL, WL_OPT_FOOTPRINT},
        {"seed", required_argument, NULL, WL_OPT_SEED},
        {"roi", required_argument, NULL, WL_OPT_ROI},
        {"help", no_argument, NULL, WL_OPT_HELP},
    };
    unsigned count = 0;
    for (; options[count].name != NULL; count++) {
        if (count == WL_MAX_OPTIONS)
            abort(); /* a workload with more options needs a larger WL_MAX_OPTIONS */
        longs[4 + count] = (struct option){options[count].name, required_argument, NULL, WL_OPT_OWN + (int)count};
    }
    int code;
    opterr = 0; /* our own messages, with the usage (and ':' for a missing value) */
    while ((code = getopt_long(argc, argv, ":", longs, NULL)) != -1) {
        switch (code) {
        case WL_OPT_FOOTPRINT: common->footprint = wl_number_arg("footprint", optarg, true, 1, UINT64_MAX); break;
        case WL_OPT_SEED: common->seed = wl_number_arg("seed", optarg, false, 0, UINT64_MAX); break;
        case WL_OPT_ROI:
            common->roi = (unsigned)wl_number_arg("roi", optarg, false, 0, CXLSSD_RUNTIME_IDS - 1);
            break;
        case WL_OPT_HELP: fputs(wl_program.usage, stdout); exit(0);
        case ':': wl_usage_error("%s needs a value", argv[optind - 1]);
        default:
            if (code < WL_OPT_OWN || code >= WL_OPT_OWN + (int)count)
                wl_usage_error("unknown option %s", argv[optind - 1]);
            wl_option_value(&options[code - WL_OPT_OWN], optarg);
        }
    }
    if (optind < argc)
        wl_usage_error("unexpected argument '%s'", argv[optind]);
    for (unsigned i = 0; i < count; i++)
        if (options[i].sized && options[i].given && common->footprint != 0)
            wl_usage_error("--footprint and --%s are exclusive (the footprint picks the %s)", options[i].name,
                           options[i].name);
}

/* How many items of `per_item` bytes, besides `fixed` bytes, --footprint holds, at most
 * `high`; a usage error if fewer than `low`. `what`: the items, plural. */
static inline uint64_t wl_footprint_items(const struct wl_common *common, const char *what, uint64_t per_item,
                                          uint64_t fixed, uint64_t low, uint64_t high)
{
    const uint64_t items = common->footprint > fixed ? (common->footprint - fixed) / per_item : 0;
    if (items < low)
        wl_usage_error("--footprint %" PRIu64 " is too small: %" PRIu64 " %s take %" PRIu64 " bytes",
                       common->footprint, low, what, fixed + low * per_item);
    return items < high ? items : high;
}

/* ---- deterministic generators -------------------------------------------------------- */

/* Inlined into the hot loops: their state then stays in registers, no loads of it per call
 * (under the platform every memory access, stack included, costs emulation time). */
#define WL_HOT static inline __attribute__((always_inline))

#define WL_GOLDEN 0x9e3779b97f4a7c15ull

/* The splitmix64 finaliser: a bijection of 64-bit words that mixes every bit into every bit. */
static inline uint64_t wl_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The state of generator `stream` (0, 1, ...) of a run with `seed`: independent sequences. */
static inline uint64_t wl_stream(uint64_t seed, uint64_t stream)
{
    return wl_mix64(seed) ^ wl_mix64(~stream * WL_GOLDEN);
}

/* splitmix64: the next 64 random bits. */
static inline uint64_t wl_next(uint64_t *state)
{
    return wl_mix64(*state += WL_GOLDEN);
}

/* Uniform in [0, 1), 53 bits. */
static inline double wl_unit(uint64_t *state)
{
    return (double)(wl_next(state) >> 11) * 0x1p-53;
}

/* Uniform in [0, n) (Lemire's multiply-shift; the bias is below n / 2^64). */
static inline uint64_t wl_below(uint64_t *state, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)wl_next(state) * n) >> 64);
}

/* Combine `value` into an order-dependent hash. */
static inline uint64_t wl_hash(uint64_t hash, uint64_t value)
{
    return wl_mix64(hash ^ wl_mix64(value + WL_GOLDEN));
}

static inline uint64_t wl_float_bits(float value)
{
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

static inline uint64_t wl_double_bits(double value)
{
    uint64_t bits;
    memcpy(&bits, &value, sizeof bits);
    return bits;
}

/*
 * A bijection of [0, n) that looks random: a 4-round Feistel network on the smallest
 * even number of bits that holds n - 1, cycle-walked back into [0, n) (fewer than 4
 * rounds of walking on average). Compute only (a few dozen instructions, the round
 * constants immediates and the key in a register), no table, so using it costs no memory
 * traffic. Scrambles ranks (popular items, hub vertices) over the whole data set, as
 * YCSB's scrambled zipfian and Graph500's relabelling do.
 */
struct wl_scramble {
    uint64_t n, key;
    unsigned half_bits; /* 0 when n <= 1 */
    uint64_t half_mask;
};

static inline struct wl_scramble wl_scramble_make(uint64_t n, uint64_t state)
{
    struct wl_scramble s = {.n = n, .key = wl_next(&state)};
    unsigned bits = 0;
    while (bits < 64 && n > 1 && ((n - 1) >> bits) != 0)
        bits++;
    s.half_bits = (bits + 1) / 2;
    s.half_mask = s.half_bits == 0 ? 0 : (UINT64_MAX >> (64 - s.half_bits));
    return s;
}

/* One Feistel round: (left, right) -> (right, left ^ F(right)), F the top bits of a product. */
WL_HOT void wl_feistel_round(uint64_t *left, uint64_t *right, uint64_t key, uint64_t multiplier, unsigned half)
{
    const uint64_t mixed = *left ^ (((*right ^ key) * multiplier) >> (64 - half));
    *left = *right;
    *right = mixed;
}

WL_HOT uint64_t wl_scramble(const struct wl_scramble *s, uint64_t x)
{
    const unsigned half = s->half_bits;
    if (half == 0)
        return x;
    do {
        uint64_t left = x >> half, right = x & s->half_mask;
        wl_feistel_round(&left, &right, s->key, 0x9e3779b97f4a7c15ull, half);
        wl_feistel_round(&left, &right, s->key, 0xbf58476d1ce4e5b9ull, half);
        wl_feistel_round(&left, &right, s->key, 0x94d049bb133111ebull, half);
        wl_feistel_round(&left, &right, s->key, 0xd6e8feb86659fd93ull, half);
        x = left << half | right;
    } while (x >= s->n);
    return x;
}

/*
 * Zipfian ranks in [0, n), rank 0 the most popular: P(r) proportional to 1/(r+1)^theta,
 * 0 < theta < 1, by Gray et al.'s method as YCSB's ZipfianGenerator does. zeta(n, theta)
 * is summed exactly over the first 4096 terms and by Euler-Maclaurin beyond (relative
 * error below 1e-12), so making one costs the same for any n.
 */
struct wl_zipf {
    uint64_t n;
    double theta, alpha, zetan, eta, zeta2;
};

static inline double wl_zeta(uint64_t n, double theta)
{
    const uint64_t exact = n < 4096 ? n : 4096;
    double sum = 0;
    for (uint64_t i = exact; i >= 1; i--) /* smallest terms first */
        sum += pow((double)i, -theta);
    if (n > exact) { /* terms a..b: integral + (f(a) + f(b))/2 + (f'(b) - f'(a))/12 */
        const double a = (double)exact + 1, b = (double)n, e = 1 - theta;
        sum += (pow(b, e) - pow(a, e)) / e + (pow(a, -theta) + pow(b, -theta)) / 2 +
               theta * (pow(a, -theta - 1) - pow(b, -theta - 1)) / 12;
    }
    return sum;
}

static inline struct wl_zipf wl_zipf_make(uint64_t n, double theta)
{
    struct wl_zipf z = {.n = n, .theta = theta, .alpha = 1 / (1 - theta), .zetan = wl_zeta(n, theta)};
    z.zeta2 = 1 + pow(0.5, theta);
    z.eta = n > 2 ? (1 - pow(2.0 / (double)n, 1 - theta)) / (1 - z.zeta2 / z.zetan) : 0;
    return z;
}

WL_HOT uint64_t wl_zipf_next(const struct wl_zipf *z, uint64_t *state)
{
    const double u = wl_unit(state), uz = u * z->zetan;
    if (uz < 1)
        return 0;
    if (uz < z->zeta2 || z->n <= 2)
        return z->n > 1;
    const uint64_t rank = (uint64_t)((double)z->n * pow(z->eta * u - z->eta + 1, z->alpha));
    return rank < z->n ? rank : z->n - 1;
}

/* ---- data and the ROI ---------------------------------------------------------------- */

/* `bytes` of zeroed anonymous memory (exit 1 if the system has none). */
static inline void *wl_alloc(uint64_t bytes)
{
    void *data = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED)
        wl_fail("mmap", bytes);
    wl_program.allocated += bytes;
    return data;
}

/* Count `bytes` that a library allocated for the workload outside wl_alloc (SQLite's heap) as
 * wl_alloc counts its own: as data before the ROI has ended, as the check's after. */
static inline void wl_count_alloc(uint64_t bytes)
{
    wl_program.allocated += bytes;
}

/* Begin the ROI of `common`; NULL (a warm pass, outside the ROI) begins none. */
static inline void wl_roi_begin(const struct wl_common *common)
{
    if (common != NULL)
        cxlssd_roi_begin(common->roi); /* the id was checked: 0..255 */
}

/*
 * End the ROI; what was allocated so far is the workload's data, anything later the check's.
 * `victim` (`size` bytes: a 4- or 8-byte element the self-check covers) is where a test
 * injects a fault: with CXLSSD_WORKLOAD_FAULT set in the environment its most significant
 * byte is flipped (xor 0x40), so the check must fail and the program exit 1.
 */
static inline void wl_roi_end(const struct wl_common *common, void *victim, size_t size)
{
    cxlssd_roi_end(common->roi);
    wl_program.data_bytes = wl_program.allocated;
    if (getenv("CXLSSD_WORKLOAD_FAULT") != NULL)
        ((unsigned char *)victim)[size - 1] ^= 0x40;
}

/* ---- threads (--threads N) ------------------------------------------------------------- */

#define WL_MAX_THREADS 256u /* --threads' bound in every workload */

struct wl_thread {
    void (*fn)(uint64_t k, void *shared);
    void *shared;
    uint64_t k;
    pthread_barrier_t *start; /* every thread's, with a ROI to begin (n > 1) */
    const struct wl_common *roi;
};

static inline void *wl_thread_main(void *arg)
{
    const struct wl_thread *t = arg;
    if (t->start != NULL) {
        pthread_barrier_wait(t->start); /* every thread has started */
        if (t->k == 0)
            wl_roi_begin(t->roi);
        pthread_barrier_wait(t->start); /* the ROI has begun: no thread's work before it */
    }
    t->fn(t->k, t->shared);
    return NULL;
}

/* fn(k, shared) in n POSIX threads, k = 0 .. n-1 (thread 0 is the caller); returns when every
 * one has. With `barrier`, a barrier for the n threads is set up there first (n > 1) and
 * destroyed after. With `roi` (not NULL), its ROI begins once every thread has started, so
 * making the threads (clone, their stacks faulted on the program's memory node) is not in
 * it: SkyByte's traces hold the threads' own accesses only. Exits with a message if the
 * threads cannot be made. */
static inline void wl_run_threads(uint64_t n, void (*fn)(uint64_t k, void *shared), void *shared,
                                  pthread_barrier_t *barrier, const struct wl_common *roi)
{
    pthread_t *ids = calloc(n, sizeof *ids);
    struct wl_thread *threads = calloc(n, sizeof *threads);
    pthread_barrier_t start;
    const bool gated = roi != NULL && n > 1;
    if (ids == NULL || threads == NULL ||
        (barrier != NULL && n > 1 && pthread_barrier_init(barrier, NULL, (unsigned)n) != 0) ||
        (gated && pthread_barrier_init(&start, NULL, (unsigned)n) != 0)) {
        fprintf(stderr, "%s: cannot set up %" PRIu64 " threads\n", wl_program.name, n);
        exit(1);
    }
    for (uint64_t k = 0; k < n; k++)
        threads[k] = (struct wl_thread){.fn = fn, .shared = shared, .k = k, .start = gated ? &start : NULL,
                                        .roi = roi};
    for (uint64_t k = 1; k < n; k++) {
        const int err = pthread_create(&ids[k], NULL, wl_thread_main, &threads[k]);
        if (err != 0) {
            fprintf(stderr, "%s: pthread_create failed: %s\n", wl_program.name, strerror(err));
            exit(1);
        }
    }
    if (!gated)
        wl_roi_begin(roi);
    wl_thread_main(&threads[0]);
    for (uint64_t k = 1; k < n; k++)
        pthread_join(ids[k], NULL);
    if (barrier != NULL && n > 1)
        pthread_barrier_destroy(barrier);
    if (gated)
        pthread_barrier_destroy(&start);
    free(threads);
    free(ids);
}

/* ---- the report: one JSON line on stdout ---------------------------------------------
 *
 *     struct wl_json j = wl_report_begin();   -> {"workload": NAME, "params": {
 *     wl_json_u64(&j, "vertices", n); ...       the workload's parameters
 *     wl_report_data(&j, &common);            -> seed, roi}, footprint_bytes, check_bytes
 *     wl_json_u64(&j, "reached", r); ...        its results
 *     return wl_report_end(&j, ok, checksum); -> check_ok, checksum}\n; the exit status
 */

struct wl_json {
    bool comma;
};

static inline void wl_json_key(struct wl_json *j, const char *key)
{
    printf("%s\"%s\": ", j->comma ? ", " : "", key);
    j->comma = true;
}

static inline void wl_json_u64(struct wl_json *j, const char *key, uint64_t value)
{
    wl_json_key(j, key);
    printf("%" PRIu64, value);
}

static inline void wl_json_real(struct wl_json *j, const char *key, double value)
{
    wl_json_key(j, key);
    if (!isfinite(value)) {
        fputs("null", stdout);
        return;
    }
    char text[32];
    snprintf(text, sizeof text, "%.15g", value); /* the shortest of these two that reads back */
    if (strtod(text, NULL) != value)
        snprintf(text, sizeof text, "%.17g", value);
    fputs(text, stdout);
}

static inline void wl_json_bool(struct wl_json *j, const char *key, bool value)
{
    wl_json_key(j, key);
    fputs(value ? "true" : "false", stdout);
}

/* `value` is one of the program's own identifiers: nothing to escape. */
static inline void wl_json_str(struct wl_json *j, const char *key, const char *value)
{
    wl_json_key(j, key);
    printf("\"%s\"", value);
}

static inline struct wl_json wl_report_begin(void)
{
    struct wl_json j = {false};
    fputc('{', stdout);
    wl_json_str(&j, "workload", wl_program.name);
    wl_json_key(&j, "params");
    fputc('{', stdout);
    j.comma = false;
    return j;
}

static inline void wl_report_data(struct wl_json *j, const struct wl_common *common)
{
    if (common->footprint != 0)
        wl_json_u64(j, "footprint", common->footprint);
    wl_json_u64(j, "seed", common->seed);
    wl_json_u64(j, "roi", common->roi);
    fputc('}', stdout);
    wl_json_u64(j, "footprint_bytes", wl_program.data_bytes);
    wl_json_u64(j, "check_bytes", wl_program.allocated - wl_program.data_bytes);
}

static inline int wl_report_end(struct wl_json *j, bool check_ok, uint64_t checksum)
{
    wl_json_bool(j, "check_ok", check_ok);
    wl_json_u64(j, "checksum", checksum);
    fputs("}\n", stdout);
    return check_ok ? 0 : 1;
}

#endif /* CXLSSD_WORKLOADS_COMMON_H */

/*
 * kvstore - an in-memory key-value store under a YCSB mix (cxlssd guest workload).
 *
 * --records N records of a 64-bit key and a 100-byte value live in a record array (128
 * bytes, two cache lines, a record), indexed by an open-addressing hash table (linear
 * probing, 16-byte slots of key and record number, twice as many slots as records). The
 * load phase inserts them in order; then --ops M operations of the YCSB mix (--mix a:
 * 50% reads / 50% updates, b: 95/5, c: 100/0), each on a key chosen by a zipfian over
 * the records (--theta, default 0.99) whose ranks are scrambled over the key space, as
 * YCSB's scrambled zipfian does. A read looks the key up and reads the whole record,
 * verifying it; an update looks it up and overwrites the value with a new version. ROI
 * --roi (1) is the operations (not the load). With --threads T, T POSIX threads share the
 * operations, each with an operation sequence of its own (thread 0's is the one-thread
 * sequence), a record read or written under its stripe's mutex (4096 stripes), as clients
 * of a store do. --warm-passes N runs the same operations N times before the ROI,
 * unmeasured: SkyByte's artifact measures a pass of its trace after a warm-up pass of it.
 *
 * Each value carries its version and a hash of key, version and value bytes. Self-check:
 * every read found its key with an intact value (checked as it is read), and the
 * versions the ROI's reads returned, hashed in order, equal those of a replay of the operation
 * sequence (every pass) against a shadow array of versions, i.e. every read returned the value last
 * written for its key; after the run every record holds its last version, intact, and is
 * found through the index. With threads, which version a read returns depends on how the
 * threads interleave: every read must still find an intact value, and every record must
 * end at the version all the threads' updates give it (the checksum hashes those). One
 * JSON line on stdout; exit 0, 1 if the check failed, 2 for a usage error.
 */
#include "common.h"

#define VALUE_BYTES 100u
#define DEFAULT_RECORDS 100000u
#define DEFAULT_OPS 200000u
#define DEFAULT_THETA 0.99
#define SLOTS_PER_RECORD 2u
#define MAX_RECORDS (1ull << 32)
#define LOCK_STRIPES 4096u

enum mix { MIX_A, MIX_B, MIX_C };
static const char *const MIXES[] = {"a", "b", "c", NULL};
static const unsigned READ_PERCENT[] = {50, 95, 100};

struct record {
    _Alignas(64) uint64_t key;
    uint32_t version; /* updates so far */
    uint32_t check;   /* a hash of key, version and value (write_record) */
    uint8_t value[VALUE_BYTES];
};

struct slot {
    uint64_t key;
    uint64_t ref; /* record number + 1; 0: empty */
};

_Static_assert(sizeof(struct record) == 128, "a record is two cache lines");

#define BYTES_PER_RECORD (sizeof(struct record) + SLOTS_PER_RECORD * sizeof(struct slot))

static const char USAGE[] =
    "usage: kvstore [--records N | --footprint BYTES] [--ops M] [--mix a|b|c] [--theta T]\n"
    "               [--threads T] [--warm-passes N] [--seed S] [--roi ID]\n"
    "  --records     records of a 64-bit key and a 100-byte value (default 100000)\n"
    "  --footprint   pick the records so that records and index (160 bytes a record) fit BYTES\n"
    "  --ops         operations in the measured phase (default 200000)\n"
    "  --mix         YCSB mix: a = 50% reads / 50% updates, b = 95/5, c = 100/0 (default a)\n"
    "  --theta       zipfian constant, 0 < T < 1 (default 0.99)\n"
    "  --threads     POSIX threads sharing the operations, each its own sequence (default 1)\n"
    "  --warm-passes unmeasured runs of the same operations before the ROI (default 0)\n" WL_COMMON_USAGE;

struct options {
    uint64_t records, ops, threads, warm_passes;
    unsigned mix; /* enum mix */
    double theta;
    struct wl_common common;
};

static struct options parse_options(int argc, char **argv)
{
    struct options opt = {.records = DEFAULT_RECORDS, .ops = DEFAULT_OPS, .threads = 1, .theta = DEFAULT_THETA,
                          .common = WL_COMMON_DEFAULTS};
    struct wl_option options[] = {
        WL_SIZED("records", &opt.records, 1, MAX_RECORDS),
        WL_SIZE("ops", &opt.ops, 0, UINT64_MAX),
        WL_CHOICE("mix", &opt.mix, MIXES),
        WL_REAL("theta", &opt.theta, 0, 1),
        WL_COUNT("threads", &opt.threads, 1, WL_MAX_THREADS),
        WL_WARM_PASSES(&opt.warm_passes),
        WL_END,
    };
    wl_parse(argc, argv, options, &opt.common);
    if (opt.common.footprint != 0)
        opt.records = wl_footprint_items(&opt.common, "records", BYTES_PER_RECORD, 0, 1, MAX_RECORDS);
    return opt;
}

/* ---- the store -------------------------------------------------------------------------- */

struct store {
    struct record *records;
    struct slot *slots;
    uint64_t capacity; /* slots */
    bool locked;       /* more than one thread: a record under its stripe's mutex */
};

static pthread_mutex_t stripes[LOCK_STRIPES];

static uint64_t home_slot(const struct store *s, uint64_t key)
{
    return (uint64_t)(((unsigned __int128)(key * WL_GOLDEN)) * s->capacity >> 64); /* Fibonacci hashing */
}

static inline struct record *lookup(const struct store *s, uint64_t key)
{
    for (uint64_t i = home_slot(s, key);; i = i + 1 == s->capacity ? 0 : i + 1) {
        const struct slot *slot = &s->slots[i];
        if (slot->ref == 0)
            return NULL;
        if (slot->key == key)
            return &s->records[slot->ref - 1];
    }
}

static void insert(struct store *s, uint64_t key, uint64_t record)
{
    uint64_t i = home_slot(s, key);
    while (s->slots[i].ref != 0)
        i = i + 1 == s->capacity ? 0 : i + 1;
    s->slots[i] = (struct slot){.key = key, .ref = record + 1};
}

/* The key of item i (0..N-1): a bijection, so the keys are distinct. */
static uint64_t key_of(uint64_t item, uint64_t salt)
{
    return wl_mix64(item ^ salt);
}

/*
 * A record's value: 12 8-byte words and a 4-byte tail (100 bytes), a function of the key
 * and the version; its check is a hash of key, version and the value's words, computed as
 * they are written (in registers) and, to verify a record, as they are read.
 */
#define VALUE_WORDS (VALUE_BYTES / 8)
#define VALUE_TAIL (VALUE_BYTES % 8)

static inline uint64_t check_start(uint64_t key, uint32_t version)
{
    return wl_mix64(key ^ version);
}

static inline uint64_t check_step(uint64_t hash, uint64_t word)
{
    return (hash ^ word) * 0x100000001b3ull;
}

static inline uint32_t check_end(uint64_t hash)
{
    return (uint32_t)(hash ^ hash >> 32);
}

static void write_record(struct record *r, uint64_t key, uint32_t version)
{
    uint64_t state = key ^ (uint64_t)version << 32, hash = check_start(key, version);
    for (unsigned w = 0; w < VALUE_WORDS; w++) {
        const uint64_t word = wl_next(&state);
        memcpy(r->value + 8 * w, &word, 8);
        hash = check_step(hash, word);
    }
    const uint32_t tail = (uint32_t)wl_next(&state);
    memcpy(r->value + 8 * VALUE_WORDS, &tail, VALUE_TAIL);
    r->key = key;
    r->version = version;
    r->check = check_end(check_step(hash, tail));
}

/* The record holds `key` and its value is intact (reads the whole record). */
static inline bool record_ok(const struct record *r, uint64_t key)
{
    uint64_t hash = check_start(r->key, r->version);
    for (unsigned w = 0; w < VALUE_WORDS; w++) {
        uint64_t word;
        memcpy(&word, r->value + 8 * w, 8);
        hash = check_step(hash, word);
    }
    uint32_t tail;
    memcpy(&tail, r->value + 8 * VALUE_WORDS, VALUE_TAIL);
    return r->key == key && r->check == check_end(check_step(hash, tail));
}

_Static_assert(VALUE_TAIL == sizeof(uint32_t), "the value ends in a 4-byte word");

static void load(struct store *s, uint64_t n, uint64_t salt)
{
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t key = key_of(i, salt);
        write_record(&s->records[i], key, 0);
        insert(s, key, i);
    }
}

/* ---- the operations --------------------------------------------------------------------- */

/* The operation sequence: the same for the run and its replay. */
struct ops {
    uint64_t state, salt;
    unsigned read_percent;
    struct wl_zipf zipf;
    struct wl_scramble items; /* rank -> item */
};

/* Thread k's sequence (streams 2, 4, 6, ...: 1 and 3 are the salt and the scramble). */
static struct ops ops_start(const struct options *opt, uint64_t salt, uint64_t k)
{
    return (struct ops){.state = wl_stream(opt->common.seed, 2 + 2 * k),
                        .salt = salt,
                        .read_percent = READ_PERCENT[opt->mix],
                        .zipf = wl_zipf_make(opt->records, opt->theta),
                        .items = wl_scramble_make(opt->records, wl_stream(opt->common.seed, 3))};
}

static inline uint64_t next_op(struct ops *o, bool *read)
{
    *read = wl_below(&o->state, 100) < o->read_percent;
    return wl_scramble(&o->items, wl_zipf_next(&o->zipf, &o->state));
}

/* Thread k's share of the operations. */
static uint64_t ops_of(const struct options *opt, uint64_t k)
{
    return opt->ops / opt->threads + (k < opt->ops % opt->threads);
}

/* What the reads returned, in order. */
static inline uint64_t read_hash(uint64_t hash, uint64_t item, uint32_t version)
{
    return wl_hash(hash, item << 32 | version);
}

struct run {
    uint64_t reads, updates, failures, hash;
};

__attribute__((noinline)) static struct run run_ops(struct store *s, struct ops o, uint64_t count)
{
    struct run run = {0};
    for (uint64_t op = 0; op < count; op++) {
        bool read;
        const uint64_t item = next_op(&o, &read), key = key_of(item, o.salt);
        struct record *r = lookup(s, key);
        if (r == NULL) {
            run.failures++;
            continue;
        }
        pthread_mutex_t *stripe = &stripes[item % LOCK_STRIPES];
        if (s->locked)
            pthread_mutex_lock(stripe);
        if (read) { /* the whole record is read: its check covers every byte */
            run.failures += !record_ok(r, key);
            run.hash = read_hash(run.hash, item, r->version);
            run.reads++;
        } else { /* the whole value is written */
            write_record(r, key, r->version + 1);
            run.updates++;
        }
        if (s->locked)
            pthread_mutex_unlock(stripe);
    }
    return run;
}

struct threads_run {
    struct store *store;
    const struct ops *ops; /* one sequence a thread */
    const struct options *opt;
    struct run *runs;
};

static void run_thread(uint64_t k, void *shared)
{
    struct threads_run *t = shared;
    t->runs[k] = run_ops(t->store, t->ops[k], ops_of(t->opt, k));
}

/* Replay every thread's operations, every pass, against a shadow array of versions; then every
 * record must hold its last version, intact, and be found through the index. With one thread
 * the ROI's reads must have returned, in order, the versions the replay gives them. Sets
 * *checksum: the ROI's reads' hash with one thread, the final versions' with more. */
static bool check_run(const struct store *s, const struct options *opt, const struct ops *ops, uint64_t n,
                      const struct run *run, uint64_t *checksum)
{
    uint32_t *versions = wl_alloc(n * sizeof(uint32_t));
    uint64_t hash = 0, reads = 0;
    for (uint64_t pass = 0; pass <= opt->warm_passes; pass++) {
        hash = reads = 0; /* the ROI's (the last pass's) */
        for (uint64_t k = 0; k < opt->threads; k++) {
            struct ops o = ops[k];
            for (uint64_t op = 0; op < ops_of(opt, k); op++) {
                bool read;
                const uint64_t item = next_op(&o, &read);
                if (read) {
                    hash = read_hash(hash, item, versions[item]);
                    reads++;
                } else {
                    versions[item]++;
                }
            }
        }
    }
    *checksum = run->hash;
    if (run->failures != 0 || reads != run->reads || (opt->threads == 1 && hash != run->hash))
        return false;
    uint64_t final = 0;
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t key = key_of(i, ops[0].salt);
        const struct record *r = lookup(s, key);
        if (r != &s->records[i] || !record_ok(r, key) || r->version != versions[i])
            return false;
        final = read_hash(final, i, versions[i]);
    }
    if (opt->threads > 1)
        *checksum = final;
    return true;
}

int main(int argc, char **argv)
{
    wl_start("kvstore", USAGE);
    const struct options opt = parse_options(argc, argv);
    const uint64_t n = opt.records, salt = wl_stream(opt.common.seed, 1);
    struct store s = {.records = wl_alloc(n * sizeof(struct record)), .capacity = n * SLOTS_PER_RECORD,
                      .locked = opt.threads > 1};
    s.slots = wl_alloc(s.capacity * sizeof(struct slot));
    load(&s, n, salt);
    static struct ops ops[WL_MAX_THREADS];
    static struct run runs[WL_MAX_THREADS];
    for (uint64_t k = 0; k < opt.threads; k++)
        ops[k] = ops_start(&opt, salt, k);
    for (unsigned i = 0; opt.threads > 1 && i < LOCK_STRIPES; i++)
        pthread_mutex_init(&stripes[i], NULL);
    struct threads_run threads = {.store = &s, .ops = ops, .opt = &opt, .runs = runs};
    uint64_t warm_failures = 0; /* a warm pass's reads are checked as the ROI's are */
    for (uint64_t pass = 0; pass <= opt.warm_passes; pass++) {
        const bool roi = pass == opt.warm_passes;
        const struct wl_common *roi_common = roi ? &opt.common : NULL;
        if (opt.threads > 1) {
            wl_run_threads(opt.threads, run_thread, &threads, NULL, roi_common);
        } else {
            wl_roi_begin(roi_common);
            runs[0] = run_ops(&s, ops[0], opt.ops);
        }
        if (roi)
            wl_roi_end(&opt.common, &s.records[n / 2].check, sizeof s.records[0].check);
        for (uint64_t k = 0; !roi && k < opt.threads; k++)
            warm_failures += runs[k].failures;
    }

    struct run run = {.failures = warm_failures};
    for (uint64_t k = 0; k < opt.threads; k++) {
        run.reads += runs[k].reads;
        run.updates += runs[k].updates;
        run.failures += runs[k].failures;
        run.hash = runs[k].hash; /* with one thread, its reads' hash */
    }
    uint64_t checksum;
    const bool ok = check_run(&s, &opt, ops, n, &run, &checksum);

    struct wl_json j = wl_report_begin();
    wl_json_u64(&j, "records", n);
    wl_json_u64(&j, "ops", opt.ops);
    wl_json_str(&j, "mix", MIXES[opt.mix]);
    wl_json_real(&j, "theta", opt.theta);
    wl_json_u64(&j, "threads", opt.threads);
    wl_json_u64(&j, "warm_passes", opt.warm_passes);
    wl_json_u64(&j, "value_bytes", VALUE_BYTES);
    wl_report_data(&j, &opt.common);
    wl_json_u64(&j, "reads", run.reads);
    wl_json_u64(&j, "updates", run.updates);
    wl_json_u64(&j, "failures", run.failures);
    return wl_report_end(&j, ok, checksum);
}

/*
 * dlrm - the embedding lookups of a DLRM-style recommendation model (cxlssd guest workload).
 *
 * --tables T embedding tables of --rows R rows of --dim D floats (values from a hash of
 * --seed, table, row and column, uniform in [-1, 1)). --batches B batches of --batch-size
 * S samples; per sample and table, --pooling L row indices, drawn (--dist) zipfian over the
 * rows (--theta, default 0.99; ranks scrambled over the table, a different scramble per
 * table) or uniform. The indices of all batches are generated before the ROI (the model's
 * sparse input, [batch][table][sample][pooling] uint32); ROI --roi (1) is, per batch and
 * table (as an EmbeddingBag runs), the sum-pooling of each sample's L rows into the batch's
 * output [table][sample][dim], followed by a digest of the output (one pass over it).
 * --warm-passes N runs the same lookups N times before the ROI, unmeasured (the tables are
 * only read; SkyByte's artifact measures a pass of its trace after a warm-up pass of it).
 * With --threads N, N POSIX threads share each batch's samples (a contiguous share each, all
 * tables) and meet at a barrier before the digest: every element adds its rows in the same
 * order, so the output is the same bit for bit.
 *
 * Self-check after the ROI: the first, the last and two more batches are recomputed naively,
 * from regenerated indices and regenerated table values (not the memory the kernel read),
 * output element by element in the kernel's order of additions, and their digests must be
 * equal bit for bit; every output of those is finite. One JSON line on stdout; exit 0, 1 if
 * the check failed, 2 for a usage error.
 */
#include "common.h"

#define DEFAULT_TABLES 8u
#define DEFAULT_ROWS 16384u
#define DEFAULT_DIM 64u
#define DEFAULT_BATCHES 16u
#define DEFAULT_BATCH_SIZE 128u
#define DEFAULT_POOLING 32u
#define DEFAULT_THETA 0.99
#define MAX_ROWS (1ull << 32)
#define CHECKED_BATCHES 4u /* the first, the last and two drawn */

/* Generators (wl_stream): the weights, the checked batches, table t's scramble, batch b's indices. */
#define STREAM_WEIGHTS 1ull
#define STREAM_CHECK 2ull
#define STREAM_TABLE (1ull << 32)
#define STREAM_BATCH (2ull << 32)

enum dist { DIST_ZIPF, DIST_UNIFORM };
static const char *const DISTS[] = {"zipf", "uniform", NULL};

static const char USAGE[] =
    "usage: dlrm [--rows R | --footprint BYTES] [--tables T] [--dim D] [--batches B]\n"
    "            [--batch-size S] [--pooling L] [--dist zipf|uniform] [--theta X]\n"
    "            [--threads N] [--warm-passes N] [--seed S] [--roi ID]\n"
    "  --rows        rows of each embedding table (default 16384)\n"
    "  --footprint   pick the rows so that tables, indices and output fit BYTES\n"
    "  --tables      embedding tables (default 8)\n"
    "  --dim         floats per row (default 64)\n"
    "  --batches     batches in the measured phase (default 16)\n"
    "  --batch-size  samples per batch (default 128)\n"
    "  --pooling     rows summed per sample and table (default 32)\n"
    "  --dist        row popularity: zipf or uniform (default zipf)\n"
    "  --theta       zipfian constant, 0 < X < 1 (default 0.99)\n"
    "  --threads     POSIX threads sharing each batch's samples (default 1)\n"
    "  --warm-passes unmeasured runs of the same lookups before the ROI (default 0)\n" WL_COMMON_USAGE;

struct options {
    uint64_t tables, rows, dim, batches, batch_size, pooling, threads, warm_passes;
    unsigned dist; /* enum dist */
    double theta;
    struct wl_common common;
};

/* The arrays besides the tables: indices, one batch's output, the per-batch digests, the scrambles. */
static uint64_t other_bytes(const struct options *opt)
{
    const uint64_t bags = opt->tables * opt->batch_size;
    return opt->batches * bags * opt->pooling * sizeof(uint32_t) + bags * opt->dim * sizeof(float) +
           opt->batches * sizeof(uint64_t) + opt->tables * sizeof(struct wl_scramble);
}

static struct options parse_options(int argc, char **argv)
{
    struct options opt = {.tables = DEFAULT_TABLES, .rows = DEFAULT_ROWS, .dim = DEFAULT_DIM,
                          .batches = DEFAULT_BATCHES, .batch_size = DEFAULT_BATCH_SIZE,
                          .pooling = DEFAULT_POOLING, .threads = 1, .theta = DEFAULT_THETA, .common = WL_COMMON_DEFAULTS};
    struct wl_option options[] = {
        WL_SIZED("rows", &opt.rows, 1, MAX_ROWS),
        WL_COUNT("tables", &opt.tables, 1, 1024),
        WL_COUNT("dim", &opt.dim, 1, 4096),
        WL_SIZE("batches", &opt.batches, 1, 1u << 24),
        WL_SIZE("batch-size", &opt.batch_size, 1, 1u << 20),
        WL_COUNT("pooling", &opt.pooling, 1, 1u << 16),
        WL_CHOICE("dist", &opt.dist, DISTS),
        WL_REAL("theta", &opt.theta, 0, 1),
        WL_COUNT("threads", &opt.threads, 1, WL_MAX_THREADS),
        WL_WARM_PASSES(&opt.warm_passes),
        WL_END,
    };
    wl_parse(argc, argv, options, &opt.common);
    if (opt.common.footprint != 0)
        opt.rows = wl_footprint_items(&opt.common, "rows of every table", opt.tables * opt.dim * sizeof(float),
                                      other_bytes(&opt), 1, MAX_ROWS);
    return opt;
}

struct model {
    uint64_t tables, rows, dim, batch_size, pooling;
    float *weights; /* table t, row r: weights[(t * rows + r) * dim ..] */
};

/* The weight at flat index e = (table * rows + row) * dim + column: uniform in [-1, 1), 24 bits
 * (exact in a float). */
static inline float weight(uint64_t key, uint64_t e)
{
    return (float)(wl_mix64(key ^ e) >> 40) * 0x1p-23f - 1;
}

/* Four floats, loaded and stored as one SSE vector (a quarter of a cache line). */
typedef float f4 __attribute__((vector_size(16)));
#define LINE_FLOATS 16u

static inline f4 load4(const float *p)
{
    f4 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store4(float *p, f4 v)
{
    memcpy(p, &v, sizeof v);
}

/* The indices of one batch, [table][sample][pooling], from the batch's own generator. */
static void batch_indices(const struct options *opt, const struct wl_zipf *zipf, const struct wl_scramble *rows,
                          uint64_t batch, uint32_t *indices)
{
    uint64_t state = wl_stream(opt->common.seed, STREAM_BATCH + batch);
    for (uint64_t t = 0; t < opt->tables; t++)
        for (uint64_t i = 0; i < opt->batch_size * opt->pooling; i++)
            *indices++ = (uint32_t)(opt->dist == DIST_ZIPF ? wl_scramble(&rows[t], wl_zipf_next(zipf, &state))
                                                           : wl_below(&state, opt->rows));
}

/* A digest of one batch's output: position-dependent, exact (the bits of the floats). */
static inline uint64_t digest(const float *out, uint64_t count)
{
    uint64_t sum = 0;
    for (uint64_t e = 0; e < count; e++)
        sum += wl_float_bits(out[e]) * (2 * e + 1);
    return sum;
}

/*
 * bag[0 .. dim) = the sum of the table's rows rows[0 .. pooling): a cache line of columns at a
 * time over all the rows (four vector accumulators in registers, as FBGEMM's kernels hold a
 * row's worth), the columns left one at a time. Each element adds its rows in order, l = 0, 1, ...
 */
static inline void pool(const float *table, uint64_t dim, const uint32_t *rows, uint64_t pooling, float *bag)
{
    uint64_t d = 0;
    for (; d + LINE_FLOATS <= dim; d += LINE_FLOATS) {
        f4 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (uint64_t l = 0; l < pooling; l++) {
            const float *row = table + rows[l] * dim + d;
            a0 += load4(row);
            a1 += load4(row + 4);
            a2 += load4(row + 8);
            a3 += load4(row + 12);
        }
        store4(bag + d, a0);
        store4(bag + d + 4, a1);
        store4(bag + d + 8, a2);
        store4(bag + d + 12, a3);
    }
    for (; d < dim; d++) {
        float sum = 0;
        for (uint64_t l = 0; l < pooling; l++)
            sum += table[rows[l] * dim + d];
        bag[d] = sum;
    }
}

struct lookup_run {
    const struct model *m;
    uint64_t batches, threads;
    const uint32_t *indices;
    float *out;
    uint64_t *digests;
    pthread_barrier_t barrier; /* with threads > 1 */
};

/* Per batch, per table, thread k's samples [k * S / N, (k + 1) * S / N): out[t][s][..] =
 * sum of the sample's rows of table t; thread 0 digests the batch's output once every thread has written its share. */
__attribute__((noinline)) static void lookups(uint64_t k, void *shared)
{
    struct lookup_run *run = shared;
    const struct model *m = run->m;
    const uint64_t dim = m->dim, bags = m->tables * m->batch_size, per_batch = bags * m->pooling;
    const uint64_t first = k * m->batch_size / run->threads, end = (k + 1) * m->batch_size / run->threads;
    for (uint64_t b = 0; b < run->batches; b++) {
        for (uint64_t t = 0; t < m->tables; t++) {
            const float *table = m->weights + t * m->rows * dim;
            const uint32_t *indices = run->indices + b * per_batch + (t * m->batch_size + first) * m->pooling;
            for (uint64_t s = first; s < end; s++) {
                pool(table, dim, indices, m->pooling, run->out + (t * m->batch_size + s) * dim);
                indices += m->pooling;
            }
        }
        if (run->threads > 1)
            pthread_barrier_wait(&run->barrier);
        if (k == 0)
            run->digests[b] = digest(run->out, bags * dim);
        if (run->threads > 1) /* the next batch overwrites the output */
            pthread_barrier_wait(&run->barrier);
    }
}

/* Batch b recomputed from scratch, element by element, with the kernel's order of additions. */
static bool check_batch(const struct options *opt, const struct model *m, const struct wl_zipf *zipf,
                        const struct wl_scramble *rows, uint64_t b, uint32_t *indices, float *out,
                        uint64_t expected)
{
    const uint64_t key = wl_stream(opt->common.seed, STREAM_WEIGHTS);
    batch_indices(opt, zipf, rows, b, indices);
    bool finite = true;
    for (uint64_t t = 0; t < m->tables; t++)
        for (uint64_t s = 0; s < m->batch_size; s++) {
            const uint32_t *bag_rows = indices + (t * m->batch_size + s) * m->pooling;
            float *bag = out + (t * m->batch_size + s) * m->dim;
            for (uint64_t d = 0; d < m->dim; d++) {
                float sum = 0;
                for (uint64_t l = 0; l < m->pooling; l++)
                    sum += weight(key, (t * m->rows + bag_rows[l]) * m->dim + d);
                bag[d] = sum;
                finite &= isfinite(sum);
            }
        }
    return finite && digest(out, m->tables * m->batch_size * m->dim) == expected;
}

int main(int argc, char **argv)
{
    wl_start("dlrm", USAGE);
    const struct options opt = parse_options(argc, argv);
    const struct model m = {.tables = opt.tables, .rows = opt.rows, .dim = opt.dim,
                            .batch_size = opt.batch_size, .pooling = opt.pooling,
                            .weights = wl_alloc(opt.tables * opt.rows * opt.dim * sizeof(float))};
    const uint64_t bags = m.tables * m.batch_size, per_batch = bags * m.pooling;
    const uint64_t key = wl_stream(opt.common.seed, STREAM_WEIGHTS);
    uint32_t *indices = wl_alloc(opt.batches * per_batch * sizeof(uint32_t));
    float *out = wl_alloc(bags * m.dim * sizeof(float));
    uint64_t *digests = wl_alloc(opt.batches * sizeof(uint64_t));
    const uint64_t weights = m.tables * m.rows * m.dim;
    uint64_t e = 0;
    for (; e + 4 <= weights; e += 4) /* one store a vector */
        store4(m.weights + e, (f4){weight(key, e), weight(key, e + 1), weight(key, e + 2), weight(key, e + 3)});
    for (; e < weights; e++)
        m.weights[e] = weight(key, e);
    const struct wl_zipf zipf = wl_zipf_make(m.rows, opt.theta);
    struct wl_scramble *rows = wl_alloc(m.tables * sizeof(struct wl_scramble));
    for (uint64_t t = 0; t < m.tables; t++)
        rows[t] = wl_scramble_make(m.rows, wl_stream(opt.common.seed, STREAM_TABLE + t));
    for (uint64_t b = 0; b < opt.batches; b++)
        batch_indices(&opt, &zipf, rows, b, indices + b * per_batch);

    struct lookup_run run = {.m = &m, .batches = opt.batches, .threads = opt.threads, .indices = indices,
                             .out = out, .digests = digests};
    for (uint64_t pass = 0; pass <= opt.warm_passes; pass++) {
        wl_run_threads(run.threads, lookups, &run, &run.barrier, pass == opt.warm_passes ? &opt.common : NULL);
    }
    wl_roi_end(&opt.common, &digests[0], sizeof digests[0]);

    uint32_t *check_indices = wl_alloc(per_batch * sizeof(uint32_t));
    float *check_out = wl_alloc(bags * m.dim * sizeof(float));
    uint64_t state = wl_stream(opt.common.seed, STREAM_CHECK), checksum = 0;
    bool ok = true;
    for (unsigned i = 0; i < CHECKED_BATCHES; i++) {
        const uint64_t b = i == 0 ? 0 : i == 1 ? opt.batches - 1 : wl_below(&state, opt.batches);
        ok &= check_batch(&opt, &m, &zipf, rows, b, check_indices, check_out, digests[b]);
    }
    for (uint64_t b = 0; b < opt.batches; b++)
        checksum = wl_hash(checksum, digests[b]);

    struct wl_json j = wl_report_begin();
    wl_json_u64(&j, "tables", m.tables);
    wl_json_u64(&j, "rows", m.rows);
    wl_json_u64(&j, "dim", m.dim);
    wl_json_u64(&j, "batches", opt.batches);
    wl_json_u64(&j, "batch_size", m.batch_size);
    wl_json_u64(&j, "pooling", m.pooling);
    wl_json_u64(&j, "threads", opt.threads);
    wl_json_u64(&j, "warm_passes", opt.warm_passes);
    wl_json_str(&j, "dist", DISTS[opt.dist]);
    if (opt.dist == DIST_ZIPF)
        wl_json_real(&j, "theta", opt.theta);
    wl_report_data(&j, &opt.common);
    wl_json_u64(&j, "lookups", opt.batches * per_batch);
    wl_json_u64(&j, "bytes_gathered", opt.batches * per_batch * m.dim * sizeof(float));
    return wl_report_end(&j, ok, checksum);
}

/*
 * srad - speckle reducing anisotropic diffusion, a stencil on a float image (cxlssd guest
 * workload), as Rodinia's srad (v2) computes it.
 *
 * The image is --height H rows of --width W floats, J = exp(u) with u uniform in [0, 1)
 * per pixel (a hash of --seed and the pixel's position), with five more arrays of the same
 * size: the diffusion coefficient and the four directional differences. Each of the
 * --iterations K iterations: the statistic q0^2 (variance over squared mean) of the
 * top-left 128x128 pixels; pass 1, per pixel, the differences to its four neighbours
 * (clamped at the border) and the coefficient; pass 2, per pixel, J += lambda/4 times the
 * divergence, with the coefficients of the pixel and of its south and east neighbours.
 * ROI --roi (1) is the K iterations. --warm-passes N runs the K iterations N times before
 * the ROI, unmeasured, the image written again from the input before each run (SkyByte's
 * artifact measures a pass of its trace after a warm-up pass of it). With --threads N, N
 * POSIX threads share the rows (a contiguous band each) and meet at a barrier after the
 * statistic and after each pass: every pixel is computed as with one thread, bit for bit.
 *
 * Self-check after the ROI: two windows of the image, the top-left one holding the
 * statistic region and the bottom-right corner, are recomputed from the input by a naive
 * per-pixel evaluation (each pixel's coefficients recomputed from its neighbourhood, no
 * stored arrays), the statistic recomputed in the top-left one, and compared bit for bit
 * with the kernel's pixels that the windows' own borders cannot reach (2 pixels an
 * iteration); and every pixel is finite. One JSON line on stdout; exit 0, 1 if the check
 * failed, 2 for a usage error.
 */
#include "common.h"

#define DEFAULT_SIDE 512u
#define DEFAULT_ITERATIONS 10u
#define DEFAULT_LAMBDA 0.5
#define MIN_SIDE 4u
#define MAX_SIDE (1u << 30)
#define STATS_SIDE 128u  /* the q0 statistic's region: rows and columns 0..127 */
#define CORNER_SIDE 16u  /* the bottom-right window's checked pixels */
#define REACH 2u         /* how far one iteration's result depends on its input: 2 pixels */
#define ARRAYS 6u        /* J, c, dN, dS, dW, dE */
#define BYTES_PER_PIXEL (ARRAYS * sizeof(float))

static const char USAGE[] =
    "usage: srad [--width W --height H | --footprint BYTES] [--iterations K] [--lambda L]\n"
    "            [--threads N] [--warm-passes N] [--seed S] [--roi ID]\n"
    "  --width, --height  image size in pixels (default 512 x 512)\n"
    "  --footprint        a square image whose six float arrays (24 bytes a pixel) fit BYTES\n"
    "  --iterations       diffusion iterations (default 10)\n"
    "  --lambda           step size, 0 < L < 1 (default 0.5)\n"
    "  --threads          POSIX threads sharing the rows (default 1)\n"
    "  --warm-passes      unmeasured runs of the iterations on the same input before the ROI (default 0)\n"
    WL_COMMON_USAGE;

struct options {
    uint64_t width, height, iterations, threads, warm_passes;
    double lambda;
    struct wl_common common;
};

static struct options parse_options(int argc, char **argv)
{
    struct options opt = {.width = DEFAULT_SIDE, .height = DEFAULT_SIDE, .iterations = DEFAULT_ITERATIONS, .threads = 1,
                          .lambda = DEFAULT_LAMBDA, .common = WL_COMMON_DEFAULTS};
    struct wl_option options[] = {
        WL_SIZED("width", &opt.width, MIN_SIDE, MAX_SIDE),
        WL_SIZED("height", &opt.height, MIN_SIDE, MAX_SIDE),
        WL_COUNT("iterations", &opt.iterations, 1, 1u << 20),
        WL_REAL("lambda", &opt.lambda, 0, 1),
        WL_COUNT("threads", &opt.threads, 1, WL_MAX_THREADS),
        WL_WARM_PASSES(&opt.warm_passes),
        WL_END,
    };
    wl_parse(argc, argv, options, &opt.common);
    if (opt.common.footprint != 0) { /* a square image */
        const uint64_t pixels = wl_footprint_items(&opt.common, "pixels", BYTES_PER_PIXEL, 0, MIN_SIDE * MIN_SIDE,
                                                   (uint64_t)MAX_SIDE * MAX_SIDE);
        opt.width = opt.height = (uint64_t)sqrt((double)pixels);
    }
    return opt;
}

/* ---- the per-pixel model (shared by the kernel and the check) --------------------------- */

enum { NORTH, SOUTH, WEST, EAST };

/* The neighbour before and after i in 0..n-1, clamped at the border. */
static inline uint64_t before(uint64_t i)
{
    return i > 0 ? i - 1 : 0;
}

static inline uint64_t after(uint64_t i, uint64_t n)
{
    return i + 1 < n ? i + 1 : i;
}

/* The input: exp(u), u uniform in [0, 1) from the pixel's position. */
static float input_pixel(uint64_t key, uint64_t row, uint64_t col)
{
    return expf((float)(wl_mix64(key ^ (row << 32 | col)) >> 40) * 0x1p-24f);
}

/* q0^2 = variance / mean^2 over the top-left STATS_SIDE square of a rows x cols image. */
static float statistic(const float *J, uint64_t rows, uint64_t cols)
{
    const uint64_t height = rows < STATS_SIDE ? rows : STATS_SIDE, width = cols < STATS_SIDE ? cols : STATS_SIDE;
    double sum = 0, squares = 0;
    for (uint64_t i = 0; i < height; i++)
        for (uint64_t j = 0; j < width; j++) {
            const double x = J[i * cols + j];
            sum += x;
            squares += x * x;
        }
    const double size = (double)(height * width), mean = sum / size;
    return (float)((squares / size - mean * mean) / (mean * mean));
}

/* The diffusion coefficient of a pixel from its value and its neighbours'; d gets the differences. */
static inline float coefficient(float jc, float jn, float js, float jw, float je, float q0sqr, float d[4])
{
    d[NORTH] = jn - jc;
    d[SOUTH] = js - jc;
    d[WEST] = jw - jc;
    d[EAST] = je - jc;
    const float g2 = (d[NORTH] * d[NORTH] + d[SOUTH] * d[SOUTH] + d[WEST] * d[WEST] + d[EAST] * d[EAST]) / (jc * jc);
    const float l = (d[NORTH] + d[SOUTH] + d[WEST] + d[EAST]) / jc;
    const float num = 0.5f * g2 - (1.0f / 16.0f) * (l * l);
    const float den = 1 + 0.25f * l;
    const float qsqr = num / (den * den);
    const float c = 1 / (1 + (qsqr - q0sqr) / (q0sqr * (1 + q0sqr)));
    return c < 0 ? 0 : c > 1 ? 1 : c;
}

/* The pixel after an iteration: the divergence weighted by its own, south and east coefficients. */
static inline float diffuse(float j, float c, float c_south, float c_east, const float d[4], float lambda)
{
    return j + 0.25f * lambda * (c * d[NORTH] + c_south * d[SOUTH] + c * d[WEST] + c_east * d[EAST]);
}

/* ---- the kernel ------------------------------------------------------------------------ */

struct image {
    uint64_t rows, cols;
    float *J, *c, *d[4]; /* d[NORTH..EAST]: the differences */
};

struct srad_run {
    struct image *im;
    uint64_t iterations, threads;
    float lambda;
    float *q0sqr_log;
    pthread_barrier_t barrier; /* with threads > 1 */
};

static inline void srad_barrier(struct srad_run *run)
{
    if (run->threads > 1)
        pthread_barrier_wait(&run->barrier);
}

/* Thread k's rows [k * H / N, (k + 1) * H / N) of every iteration; thread 0 also takes the
 * statistic. The barriers order the passes as one thread would: pass 1 reads J's
 * neighbouring rows, pass 2 the south neighbour's coefficient. */
__attribute__((noinline)) static void srad(uint64_t k, void *shared)
{
    struct srad_run *run = shared;
    const struct image *im = run->im;
    const uint64_t rows = im->rows, cols = im->cols;
    const uint64_t first = k * rows / run->threads, end = (k + 1) * rows / run->threads;
    float *const J = im->J, *const coeff = im->c;
    float *const dn = im->d[NORTH], *const ds = im->d[SOUTH], *const dw = im->d[WEST], *const de = im->d[EAST];
    for (uint64_t it = 0; it < run->iterations; it++) {
        if (k == 0)
            run->q0sqr_log[it] = statistic(J, rows, cols);
        srad_barrier(run);
        const float q0sqr = run->q0sqr_log[it];
        for (uint64_t i = first; i < end; i++) {
            const float *row = J + i * cols, *north = J + before(i) * cols, *south = J + after(i, rows) * cols;
            const uint64_t k = i * cols;
            for (uint64_t j = 0; j < cols; j++) {
                float d[4];
                coeff[k + j] = coefficient(row[j], north[j], south[j], row[before(j)], row[after(j, cols)], q0sqr, d);
                dn[k + j] = d[NORTH];
                ds[k + j] = d[SOUTH];
                dw[k + j] = d[WEST];
                de[k + j] = d[EAST];
            }
        }
        srad_barrier(run);
        for (uint64_t i = first; i < end; i++) {
            const uint64_t k = i * cols;
            const float *c = coeff + k, *c_south = coeff + after(i, rows) * cols;
            for (uint64_t j = 0; j < cols; j++) {
                const float d[4] = {dn[k + j], ds[k + j], dw[k + j], de[k + j]};
                J[k + j] = diffuse(J[k + j], c[j], c_south[j], c[after(j, cols)], d, run->lambda);
            }
        }
        srad_barrier(run); /* the next statistic and pass 1 read J */
    }
}

/* ---- the check ------------------------------------------------------------------------- */

/* The coefficient at (i, j) of a rows x cols image, from its neighbourhood. */
static float coefficient_at(const float *J, uint64_t rows, uint64_t cols, uint64_t i, uint64_t j, float q0sqr,
                            float d[4])
{
    const float *row = J + i * cols;
    return coefficient(row[j], J[before(i) * cols + j], J[after(i, rows) * cols + j], row[before(j)],
                       row[after(j, cols)], q0sqr, d);
}

struct window {
    uint64_t row0, col0, rows, cols; /* its place in the image */
};

/*
 * Recompute the window from the input, one pixel at a time, with the logged statistics
 * (recomputed and compared too if the window holds their region), and compare it with the
 * image wherever the window's borders inside the image cannot have reached.
 */
static bool check_window(const struct image *im, struct window w, const struct options *opt,
                         const float *q0sqr_log, uint64_t *compared)
{
    const uint64_t pixels = w.rows * w.cols, key = wl_stream(opt->common.seed, 1);
    float *J = wl_alloc(pixels * sizeof(float)), *next = wl_alloc(pixels * sizeof(float));
    for (uint64_t i = 0; i < w.rows; i++)
        for (uint64_t j = 0; j < w.cols; j++)
            J[i * w.cols + j] = input_pixel(key, w.row0 + i, w.col0 + j);
    const bool statistics_inside = w.row0 == 0 && w.col0 == 0;
    for (uint64_t it = 0; it < opt->iterations; it++) {
        if (statistics_inside && statistic(J, w.rows, w.cols) != q0sqr_log[it])
            return false;
        for (uint64_t i = 0; i < w.rows; i++)
            for (uint64_t j = 0; j < w.cols; j++) {
                float d[4], unused[4];
                const float c = coefficient_at(J, w.rows, w.cols, i, j, q0sqr_log[it], d);
                const float c_south = coefficient_at(J, w.rows, w.cols, after(i, w.rows), j, q0sqr_log[it], unused);
                const float c_east = coefficient_at(J, w.rows, w.cols, i, after(j, w.cols), q0sqr_log[it], unused);
                next[i * w.cols + j] = diffuse(J[i * w.cols + j], c, c_south, c_east, d, (float)opt->lambda);
            }
        float *swap = J;
        J = next;
        next = swap;
    }
    const uint64_t margin = REACH * opt->iterations;
    for (uint64_t i = 0; i < w.rows; i++) {
        if ((w.row0 > 0 && i < margin) || (w.row0 + w.rows < im->rows && i + margin >= w.rows))
            continue;
        for (uint64_t j = 0; j < w.cols; j++) {
            if ((w.col0 > 0 && j < margin) || (w.col0 + w.cols < im->cols && j + margin >= w.cols))
                continue;
            if (J[i * w.cols + j] != im->J[(w.row0 + i) * im->cols + w.col0 + j])
                return false;
            ++*compared;
        }
    }
    return true;
}

/* A window of `side` checked pixels (whole image if smaller) at the top-left or bottom-right. */
static struct window window_at(const struct image *im, uint64_t side, uint64_t iterations, bool bottom_right)
{
    const uint64_t extent = side + REACH * iterations;
    struct window w = {0, 0, extent < im->rows ? extent : im->rows, extent < im->cols ? extent : im->cols};
    if (bottom_right) {
        w.row0 = im->rows - w.rows;
        w.col0 = im->cols - w.cols;
    }
    return w;
}

int main(int argc, char **argv)
{
    wl_start("srad", USAGE);
    const struct options opt = parse_options(argc, argv);
    struct image im = {.rows = opt.height, .cols = opt.width};
    const uint64_t pixels = im.rows * im.cols, key = wl_stream(opt.common.seed, 1);
    im.J = wl_alloc(pixels * sizeof(float));
    im.c = wl_alloc(pixels * sizeof(float));
    for (unsigned dir = NORTH; dir <= EAST; dir++)
        im.d[dir] = wl_alloc(pixels * sizeof(float));
    float *q0sqr_log = wl_alloc(opt.iterations * sizeof(float));
    struct srad_run run = {.im = &im, .iterations = opt.iterations, .threads = opt.threads,
                           .lambda = (float)opt.lambda, .q0sqr_log = q0sqr_log};
    for (uint64_t pass = 0; pass <= opt.warm_passes; pass++) {
        for (uint64_t i = 0; i < im.rows; i++)
            for (uint64_t j = 0; j < im.cols; j++)
                im.J[i * im.cols + j] = input_pixel(key, i, j);
        wl_run_threads(run.threads, srad, &run, &run.barrier, pass == opt.warm_passes ? &opt.common : NULL);
    }
    wl_roi_end(&opt.common, &im.J[0], sizeof im.J[0]);

    bool finite = true;
    double sum = 0;
    uint64_t checksum = 0, compared = 0;
    for (uint64_t k = 0; k < pixels; k++) {
        finite &= isfinite(im.J[k]);
        sum += im.J[k];
        checksum += wl_mix64(wl_float_bits(im.J[k]) ^ k * WL_GOLDEN);
    }
    const bool ok = finite && check_window(&im, window_at(&im, STATS_SIDE, opt.iterations, false), &opt, q0sqr_log, &compared) &&
                    check_window(&im, window_at(&im, CORNER_SIDE, opt.iterations, true), &opt, q0sqr_log, &compared);

    struct wl_json j = wl_report_begin();
    wl_json_u64(&j, "width", im.cols);
    wl_json_u64(&j, "height", im.rows);
    wl_json_u64(&j, "iterations", opt.iterations);
    wl_json_real(&j, "lambda", opt.lambda);
    wl_json_u64(&j, "threads", opt.threads);
    wl_json_u64(&j, "warm_passes", opt.warm_passes);
    wl_report_data(&j, &opt.common);
    wl_json_real(&j, "mean", sum / (double)pixels);
    wl_json_real(&j, "q0sqr_last", q0sqr_log[opt.iterations - 1]);
    wl_json_u64(&j, "pixels_compared", compared);
    wl_json_bool(&j, "finite", finite);
    return wl_report_end(&j, ok, checksum);
}

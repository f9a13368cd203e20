/*
 * graph - graph kernels on a synthetic power-law graph (cxlssd guest workload).
 *
 * The graph is Chung-Lu, deterministic from --seed: --vertices N, N*D/2 edges (--degree D,
 * the mean degree), each endpoint drawn with probability proportional to the weight of its
 * vertex, (rank+1)^(-2/3), so degrees follow a power law with exponent 2.5; self-loops are
 * dropped, parallel edges kept. The ranks are scrambled into vertex ids (as Graph500
 * relabels its graph), so hubs are spread over the arrays. Stored undirected in CSR
 * (64-bit offsets, 32-bit neighbours), built without an edge list: the edges are generated
 * twice, once to count degrees and once to fill the lists.
 *
 * ROI --roi (1) is the kernel:
 *   --kernel bfs: level-synchronous top-down BFS from the biggest hub, a level per vertex;
 *                 with --threads T, T POSIX threads share each level's frontier, claim a
 *                 vertex by compare-and-swap of its level and meet at a barrier per level
 *                 (the same levels);
 *   --kernel bc:  Brandes' betweenness centrality from --sources K sources (a scrambled
 *                 pick), forward BFS counting shortest paths, backward accumulation of
 *                 dependencies (pull from successors), scores summed over the sources;
 *                 path counts are exact 64-bit integers; with --threads T (as GAP's bc),
 *                 the sources one after another and T threads sharing each one's levels:
 *                 a level's frontier expanded as in bfs, each thread pushing its vertices'
 *                 path counts to the next level by atomic adds as it scans (GAP's pushes
 *                 too), so the graph is read as often as by one thread; backwards each
 *                 vertex pulls its dependency from the level below, summed in adjacency
 *                 order by the one thread that owns it: one state, the same bits as one
 *                 thread's with any thread count.
 * bfs --warm-passes N runs the kernel N times before the ROI, unmeasured (the levels reset
 * after each): SkyByte's artifact measures a pass of its trace after a warm-up pass of it
 * (main.cc), so its SSD DRAM holds what the kernel itself reads, not what the set-up left.
 * Self-check after the ROI (see check_levels and check_brandes). One JSON line on stdout;
 * exit 0, 1 if the check failed, 2 for a usage error.
 */
#include "common.h"

enum kernel { KERNEL_BFS, KERNEL_BC };
static const char *const KERNELS[] = {"bfs", "bc", NULL};

#define DEFAULT_VERTICES 65536u
#define DEFAULT_DEGREE 16u
#define DEFAULT_SOURCES 4u
#define MAX_VERTICES (1ull << 31)
#define MIN_VERTICES 2u
#define REL_TOLERANCE 1e-9

static const char USAGE[] =
    "usage: graph [--kernel bfs|bc] [--vertices N | --footprint BYTES] [--degree D]\n"
    "             [--sources K] [--threads T] [--warm-passes N] [--seed S] [--roi ID]\n"
    "  --kernel      bfs (level-synchronous BFS) or bc (Brandes betweenness), default bfs\n"
    "  --vertices    vertices of the graph (default 65536)\n"
    "  --footprint   pick the vertices so that the data (graph and kernel state) fits BYTES\n"
    "  --degree      mean degree: N*D/2 edges are generated (default 16)\n"
    "  --sources     bc: source vertices (default 4)\n"
    "  --threads     POSIX threads sharing each level (default 1)\n"
    "  --warm-passes bfs: unmeasured runs of the kernel before the ROI (default 0)\n" WL_COMMON_USAGE;

struct options {
    unsigned kernel; /* enum kernel */
    uint64_t vertices, degree, sources, threads, warm_passes;
    struct wl_common common;
};

struct graph {
    uint64_t n;
    uint64_t *offsets; /* n + 1: the neighbours of v are adj[offsets[v] .. offsets[v + 1]) */
    uint32_t *adj;
};

/* Bytes of the data per vertex (beyond the one extra offset and the bc sources). */
static uint64_t bytes_per_vertex(const struct options *opt)
{
    const uint64_t csr = sizeof(uint64_t) + opt->degree * sizeof(uint32_t);
    if (opt->kernel == KERNEL_BFS) /* level, queue */
        return csr + sizeof(int32_t) + sizeof(uint32_t);
    /* dist, sigma, delta, score, queue */
    return csr + sizeof(int32_t) + sizeof(uint64_t) + 2 * sizeof(double) + sizeof(uint32_t);
}

static uint64_t fixed_bytes(const struct options *opt)
{
    return sizeof(uint64_t) + (opt->kernel == KERNEL_BC ? opt->sources * sizeof(uint32_t) : 0);
}

static struct options parse_options(int argc, char **argv)
{
    struct options opt = {.vertices = DEFAULT_VERTICES, .degree = DEFAULT_DEGREE, .sources = DEFAULT_SOURCES,
                          .threads = 1, .common = WL_COMMON_DEFAULTS};
    struct wl_option options[] = {
        WL_CHOICE("kernel", &opt.kernel, KERNELS),
        WL_SIZED("vertices", &opt.vertices, MIN_VERTICES, MAX_VERTICES),
        WL_COUNT("degree", &opt.degree, 1, 1u << 16),
        WL_COUNT("sources", &opt.sources, 1, MAX_VERTICES),
        WL_COUNT("threads", &opt.threads, 1, WL_MAX_THREADS),
        WL_WARM_PASSES(&opt.warm_passes),
        WL_END,
    };
    wl_parse(argc, argv, options, &opt.common);
    if (opt.common.footprint != 0)
        opt.vertices = wl_footprint_items(&opt.common, "vertices", bytes_per_vertex(&opt), fixed_bytes(&opt),
                                          MIN_VERTICES, MAX_VERTICES);
    if (opt.kernel == KERNEL_BC && opt.warm_passes > 0)
        wl_usage_error("--warm-passes is for --kernel bfs (bc's passes are its --sources)");
    if (opt.kernel == KERNEL_BC && opt.sources > opt.vertices)
        wl_usage_error("--sources %" PRIu64 " is more than the %" PRIu64 " vertices", opt.sources, opt.vertices);
    return opt;
}

/* ---- the graph ------------------------------------------------------------------------ */

/* Vertex ids: rank r (0 the heaviest) is vertex vertex_ids(...)(r). */
static struct wl_scramble vertex_ids(uint64_t n, uint64_t seed)
{
    return wl_scramble_make(n, wl_stream(seed, 2));
}

/* The edge generator: rank = floor(t^3) - 1, t uniform in [1, cbrt(n + 1)), has density
 * proportional to (rank + 1)^(-2/3); the rank is scrambled into a vertex id. */
struct endpoints {
    uint64_t state;
    double span; /* cbrt(n + 1) - 1 */
    struct wl_scramble ids;
};

static struct endpoints endpoints_start(uint64_t n, uint64_t seed)
{
    return (struct endpoints){
        .state = wl_stream(seed, 1), .span = cbrt((double)n + 1) - 1, .ids = vertex_ids(n, seed)};
}

static inline uint32_t next_endpoint(struct endpoints *e)
{
    const double t = 1 + wl_unit(&e->state) * e->span;
    uint64_t rank = (uint64_t)(t * t * t) - 1;
    if (rank >= e->ids.n) /* rounding at the top */
        rank = e->ids.n - 1;
    return (uint32_t)wl_scramble(&e->ids, rank);
}

static struct graph build_graph(const struct options *opt)
{
    const uint64_t n = opt->vertices, edges = n * opt->degree / 2;
    struct graph g = {.n = n, .offsets = wl_alloc((n + 1) * sizeof(uint64_t))};
    struct endpoints e = endpoints_start(n, opt->common.seed);
    for (uint64_t i = 0; i < edges; i++) { /* degrees */
        const uint32_t u = next_endpoint(&e), v = next_endpoint(&e);
        if (u != v) {
            g.offsets[u]++;
            g.offsets[v]++;
        }
    }
    uint64_t total = 0; /* inclusive prefix sums: offsets[v] = the end of v's list */
    for (uint64_t v = 0; v < n; v++)
        g.offsets[v] = total += g.offsets[v];
    g.offsets[n] = total;
    g.adj = wl_alloc(total * sizeof(uint32_t));
    e = endpoints_start(n, opt->common.seed);
    for (uint64_t i = 0; i < edges; i++) { /* the same edges: fill each list from its end */
        const uint32_t u = next_endpoint(&e), v = next_endpoint(&e);
        if (u != v) {
            g.adj[--g.offsets[u]] = v;
            g.adj[--g.offsets[v]] = u;
        }
    }
    return g; /* offsets[v] is now the start of v's list */
}

static int32_t *unreached_levels(uint64_t n)
{
    int32_t *level = wl_alloc(n * sizeof(int32_t));
    for (uint64_t v = 0; v < n; v++)
        level[v] = -1;
    return level;
}

/*
 * The levels are those of a BFS from `root`: root at 0; no edge joins a reached vertex to an
 * unreached one (the whole component is reached); across every edge the levels differ by at
 * most one; every other reached vertex has a neighbour one level up (its parent). Together:
 * level[v] is v's distance from the root. `reached` counts the vertices with a level.
 */
static bool check_levels(const struct graph *g, const int32_t *level, uint32_t root, uint64_t *reached)
{
    *reached = 0;
    if (level[root] != 0)
        return false;
    for (uint64_t v = 0; v < g->n; v++) {
        const int32_t lv = level[v];
        bool parent = v == root;
        for (uint64_t i = g->offsets[v]; i < g->offsets[v + 1]; i++) {
            const int32_t lw = level[g->adj[i]];
            if ((lv < 0) != (lw < 0) || (lv >= 0 && (lw > lv + 1 || lw < lv - 1)))
                return false;
            parent |= lv >= 0 && lw == lv - 1;
        }
        if (lv >= 0 && !parent)
            return false;
        *reached += lv >= 0;
    }
    return true;
}

static struct wl_json report_graph(const struct options *opt, const struct graph *g)
{
    struct wl_json j = wl_report_begin();
    wl_json_str(&j, "kernel", KERNELS[opt->kernel]);
    wl_json_u64(&j, "vertices", g->n);
    wl_json_u64(&j, "degree", opt->degree);
    if (opt->kernel == KERNEL_BC)
        wl_json_u64(&j, "sources", opt->sources);
    else
        wl_json_u64(&j, "warm_passes", opt->warm_passes);
    wl_json_u64(&j, "threads", opt->threads);
    wl_report_data(&j, &opt->common);
    wl_json_u64(&j, "edges", g->offsets[g->n] / 2);
    return j;
}

/* ---- BFS -------------------------------------------------------------------------------- */

struct bfs_result {
    uint64_t reached, levels, edges_scanned;
};

/* Top-down, a level at a time: the queue holds the vertices in the order they were reached. */
__attribute__((noinline)) static struct bfs_result bfs(const struct graph *g, uint32_t root, int32_t *level,
                                                       uint32_t *queue)
{
    const uint64_t *const offsets = g->offsets;
    const uint32_t *const adj = g->adj;
    uint64_t head = 0, tail = 0, scanned = 0;
    int32_t depth = 0;
    level[root] = 0;
    queue[tail++] = root;
    while (head < tail) {
        const uint64_t level_end = tail;
        for (; head < level_end; head++) {
            const uint32_t u = queue[head];
            const uint64_t end = offsets[u + 1];
            scanned += end - offsets[u];
            for (uint64_t i = offsets[u]; i < end; i++) {
                const uint32_t v = adj[i];
                if (level[v] < 0) {
                    level[v] = depth + 1;
                    queue[tail++] = v;
                }
            }
        }
        depth++;
    }
    return (struct bfs_result){.reached = tail, .levels = (uint64_t)depth, .edges_scanned = scanned};
}

/* Thread k's part of [lo, hi). */
#define SHARE_BEGIN(k, lo, hi, threads) ((lo) + (k) * ((hi) - (lo)) / (threads))
#define SHARE_END(k, lo, hi, threads) ((lo) + ((k) + 1) * ((hi) - (lo)) / (threads))

/* Set unreached vertex v's level to `depth` unless another thread did first: true if this
 * thread did (it then appends v to the queue). */
static inline bool claim_vertex(int32_t *level, uint32_t v, int32_t depth)
{
    int32_t unreached = -1;
    return __atomic_load_n(&level[v], __ATOMIC_RELAXED) < 0 &&
           __atomic_compare_exchange_n(&level[v], &unreached, depth, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

struct bfs_run {
    const struct graph *g;
    int32_t *level;
    uint32_t *queue;
    uint64_t threads, tail, scanned; /* tail, scanned: atomic */
    int32_t depth;
    pthread_barrier_t barrier;
};

/* Thread k's share of bfs: a contiguous part of each level's frontier; a vertex goes to the
 * thread whose compare-and-swap sets its level. Two barriers a level: every thread has
 * finished the level before any reads where the next one ends, and has read it before any
 * appends to it. */
static void bfs_share(uint64_t k, void *shared)
{
    struct bfs_run *r = shared;
    const uint64_t *const offsets = r->g->offsets;
    const uint32_t *const adj = r->g->adj;
    uint64_t head = 0, scanned = 0;
    int32_t depth = 0;
    for (;;) {
        pthread_barrier_wait(&r->barrier);
        const uint64_t level_end = __atomic_load_n(&r->tail, __ATOMIC_RELAXED);
        pthread_barrier_wait(&r->barrier);
        if (level_end == head)
            break;
        for (uint64_t q = SHARE_BEGIN(k, head, level_end, r->threads); q < SHARE_END(k, head, level_end, r->threads);
             q++) {
            const uint32_t u = r->queue[q];
            const uint64_t end = offsets[u + 1];
            scanned += end - offsets[u];
            for (uint64_t i = offsets[u]; i < end; i++) {
                const uint32_t v = adj[i];
                if (claim_vertex(r->level, v, depth + 1))
                    r->queue[__atomic_fetch_add(&r->tail, 1, __ATOMIC_RELAXED)] = v;
            }
        }
        head = level_end;
        depth++;
    }
    __atomic_fetch_add(&r->scanned, scanned, __ATOMIC_RELAXED);
    if (k == 0)
        r->depth = depth;
}

/* One BFS from root over levels all unreached (-1), in opt->threads threads; with `roi`, its
 * ROI begins once the threads have started (wl_run_threads). */
static struct bfs_result bfs_pass(const struct options *opt, const struct graph *g, uint32_t root, int32_t *level,
                                  uint32_t *queue, const struct wl_common *roi)
{
    if (opt->threads == 1) {
        wl_roi_begin(roi);
        return bfs(g, root, level, queue);
    }
    struct bfs_run run = {.g = g, .level = level, .queue = queue, .threads = opt->threads, .tail = 1};
    level[root] = 0;
    queue[0] = root;
    wl_run_threads(opt->threads, bfs_share, &run, &run.barrier, roi);
    return (struct bfs_result){.reached = run.tail, .levels = (uint64_t)run.depth, .edges_scanned = run.scanned};
}

static int run_bfs(const struct options *opt)
{
    const struct graph g = build_graph(opt);
    const struct wl_scramble ids = vertex_ids(g.n, opt->common.seed);
    const uint32_t root = (uint32_t)wl_scramble(&ids, 0); /* rank 0: the biggest hub */
    int32_t *level = unreached_levels(g.n);
    uint32_t *queue = wl_alloc(g.n * sizeof(uint32_t));

    for (uint64_t pass = 0; pass < opt->warm_passes; pass++) {
        const struct bfs_result warm = bfs_pass(opt, &g, root, level, queue, NULL);
        for (uint64_t q = 0; q < warm.reached; q++) /* only the reached have a level */
            level[queue[q]] = -1;
    }
    const struct bfs_result result = bfs_pass(opt, &g, root, level, queue, &opt->common);
    wl_roi_end(&opt->common, &level[root], sizeof level[root]);

    uint64_t reached, checksum = 0;
    const bool ok = check_levels(&g, level, root, &reached) && reached == result.reached;
    for (uint64_t v = 0; v < g.n; v++)
        checksum += wl_mix64(v << 32 | (uint32_t)level[v]);

    struct wl_json j = report_graph(opt, &g);
    wl_json_u64(&j, "root", root);
    wl_json_u64(&j, "reached", result.reached);
    wl_json_u64(&j, "levels", result.levels);
    wl_json_u64(&j, "edges_scanned", result.edges_scanned);
    return wl_report_end(&j, ok, checksum);
}

/* ---- betweenness centrality ------------------------------------------------------------- */

struct brandes {
    int32_t *dist;         /* from the current source, -1 unreached */
    uint64_t *sigma;       /* shortest paths from the source (a count) */
    double *delta;         /* dependency of the source on v */
    double *score;         /* the result: dependencies summed over the sources */
    uint32_t *queue;       /* the current source's BFS order */
    uint64_t last_reached; /* queue[0 .. last_reached): what the last source reached */
    uint64_t reached;      /* summed over the sources */
    uint64_t interior;     /* sum over sources s, reached t != s, of d(s, t) - 1 */
    bool overflow;         /* a path count did not fit in 64 bits: the self-check fails */
};

/* sigma[w] += paths, atomically if other threads add to it too: true if it overflowed. */
static inline bool add_paths(uint64_t *sigma, uint64_t paths, bool atomic)
{
    if (!atomic)
        return __builtin_add_overflow(*sigma, paths, sigma);
    return __atomic_fetch_add(sigma, paths, __ATOMIC_RELAXED) > UINT64_MAX - paths;
}

/*
 * Brandes, per source: reset the vertices the previous source reached, BFS counting the
 * shortest paths (sigma), then in reverse BFS order pull each vertex's dependency from its
 * successors, delta[v] = sigma[v] * sum over w (1 + delta[w]) / sigma[w], and add it to
 * the score. The last source's state stays for the check.
 */
__attribute__((noinline)) static void brandes(const struct graph *g, const uint32_t *sources, uint64_t count,
                                              struct brandes *b)
{
    const uint64_t *const offsets = g->offsets;
    const uint32_t *const adj = g->adj;
    int32_t *const dist = b->dist;
    uint64_t *const sigma = b->sigma;
    double *const delta = b->delta, *const score = b->score;
    uint32_t *const queue = b->queue;
    uint64_t previous = 0, reached = 0, interior = 0;
    bool overflow = false;
    for (uint64_t s = 0; s < count; s++) {
        for (uint64_t i = 0; i < previous; i++) {
            const uint32_t v = queue[i];
            dist[v] = -1;
            sigma[v] = 0;
            delta[v] = 0;
        }
        const uint32_t source = sources[s];
        uint64_t tail = 1;
        dist[source] = 0;
        sigma[source] = 1;
        queue[0] = source;
        for (uint64_t head = 0; head < tail; head++) {
            const uint32_t v = queue[head];
            const int32_t next = dist[v] + 1;
            const uint64_t paths = sigma[v];
            const uint64_t end = offsets[v + 1];
            for (uint64_t i = offsets[v]; i < end; i++) {
                const uint32_t w = adj[i];
                if (dist[w] < 0) {
                    dist[w] = next;
                    queue[tail++] = w;
                }
                if (dist[w] == next)
                    overflow |= add_paths(&sigma[w], paths, false);
            }
        }
        for (uint64_t q = tail - 1; q > 0; q--) { /* the source (q = 0) has no score */
            const uint32_t v = queue[q];
            const int32_t next = dist[v] + 1;
            const uint64_t end = offsets[v + 1];
            double sum = 0;
            for (uint64_t i = offsets[v]; i < end; i++) {
                const uint32_t w = adj[i];
                if (dist[w] == next)
                    sum += (1 + delta[w]) / (double)sigma[w];
            }
            delta[v] = (double)sigma[v] * sum;
            score[v] += delta[v];
            interior += (uint64_t)(next - 2);
        }
        previous = tail;
        reached += tail;
    }
    b->last_reached = previous;
    b->reached = reached;
    b->interior = interior;
    b->overflow = overflow;
}

static bool close_to(double value, double expected)
{
    return fabs(value - expected) <= REL_TOLERANCE * fmax(fabs(value), fabs(expected));
}

/*
 * The last source's state, against its definitions: dist is a BFS from the source (as for
 * bfs); sigma[v] is the sum of sigma over v's neighbours one level up (exactly);
 * delta[v] is sigma[v] times the sum of
 * (1 + delta[w]) / sigma[w] over its neighbours one level down; and the dependencies sum to
 * the interior vertices of the shortest paths, sum over v of delta[v] = sum over t of
 * (d(t) - 1), an identity the recurrences do not force.
 */
static bool check_brandes(const struct graph *g, const struct brandes *b, uint32_t source)
{
    uint64_t reached, interior = 0;
    if (!check_levels(g, b->dist, source, &reached) || reached != b->last_reached || b->sigma[source] != 1)
        return false;
    double dependencies = 0;
    for (uint64_t v = 0; v < g->n; v++) {
        const int32_t dv = b->dist[v];
        if (dv <= 0)
            continue; /* unreached, or the source */
        uint64_t paths = 0;
        double sum = 0;
        for (uint64_t i = g->offsets[v]; i < g->offsets[v + 1]; i++) {
            const uint32_t w = g->adj[i];
            if (b->dist[w] == dv - 1)
                paths += b->sigma[w];
            else if (b->dist[w] == dv + 1)
                sum += (1 + b->delta[w]) / (double)b->sigma[w];
        }
        if (b->sigma[v] != paths || !close_to(b->delta[v], (double)b->sigma[v] * sum))
            return false;
        dependencies += b->delta[v];
        interior += (uint64_t)dv - 1;
    }
    return close_to(dependencies, (double)interior);
}

struct bc_run {
    const struct graph *g;
    const uint32_t *sources;
    uint64_t count, threads;
    struct brandes *b;
    uint64_t tail, interior; /* atomic */
    bool overflow;           /* atomic */
    uint64_t *level_start;   /* the current source's level d is queue[level_start[d] .. level_start[d + 1]) */
    pthread_barrier_t barrier;
};

/* Brandes with the threads sharing each level of each source (the barriers order the
 * levels): reset what the previous source reached; forward, a level's frontier expanded
 * as in bfs_share, each vertex's path count added to its neighbours one level down as
 * brandes() does, by atomic adds (integers: any order gives the same counts); backward
 * from the deepest level, each vertex pulls its dependency from the level below, as
 * brandes() does, summed in adjacency order by the one thread that owns it. */
static void bc_share(uint64_t k, void *shared)
{
    struct bc_run *r = shared;
    struct brandes *const b = r->b;
    const uint64_t *const offsets = r->g->offsets;
    const uint32_t *const adj = r->g->adj;
    const uint64_t threads = r->threads;
    uint64_t previous = 0, interior = 0;
    bool overflow = false;
    for (uint64_t s = 0; s < r->count; s++) {
        for (uint64_t q = SHARE_BEGIN(k, 0, previous, threads); q < SHARE_END(k, 0, previous, threads); q++) {
            const uint32_t v = b->queue[q];
            b->dist[v] = -1;
            b->sigma[v] = 0;
            b->delta[v] = 0;
        }
        pthread_barrier_wait(&r->barrier);
        if (k == 0) {
            const uint32_t source = r->sources[s];
            b->dist[source] = 0;
            b->sigma[source] = 1;
            b->queue[0] = source;
            r->tail = 1;
        }
        uint64_t head = 0;
        int32_t depth = 0;
        for (;;) {
            pthread_barrier_wait(&r->barrier); /* the last level and its path counts are in */
            const uint64_t level_end = __atomic_load_n(&r->tail, __ATOMIC_RELAXED);
            if (k == 0)
                r->level_start[depth] = head;
            pthread_barrier_wait(&r->barrier); /* everyone has read the tail before anyone appends */
            if (level_end == head)
                break;
            for (uint64_t q = SHARE_BEGIN(k, head, level_end, threads); q < SHARE_END(k, head, level_end, threads);
                 q++) {
                const uint32_t u = b->queue[q];
                const uint64_t paths = b->sigma[u];
                for (uint64_t i = offsets[u]; i < offsets[u + 1]; i++) {
                    const uint32_t w = adj[i];
                    if (claim_vertex(b->dist, w, depth + 1))
                        b->queue[__atomic_fetch_add(&r->tail, 1, __ATOMIC_RELAXED)] = w;
                    if (__atomic_load_n(&b->dist[w], __ATOMIC_RELAXED) == depth + 1)
                        overflow |= add_paths(&b->sigma[w], paths, true);
                }
            }
            head = level_end;
            depth++;
        }
        for (int32_t d = depth - 1; d > 0; d--) { /* the source (level 0) has no score */
            const uint64_t lo = r->level_start[d], hi = r->level_start[d + 1];
            for (uint64_t q = SHARE_BEGIN(k, lo, hi, threads); q < SHARE_END(k, lo, hi, threads); q++) {
                const uint32_t v = b->queue[q];
                double sum = 0;
                for (uint64_t i = offsets[v]; i < offsets[v + 1]; i++) {
                    const uint32_t w = adj[i];
                    if (b->dist[w] == d + 1)
                        sum += (1 + b->delta[w]) / (double)b->sigma[w];
                }
                b->delta[v] = (double)b->sigma[v] * sum;
                b->score[v] += b->delta[v];
                interior += (uint64_t)(d - 1);
            }
            pthread_barrier_wait(&r->barrier); /* the level's dependencies are in */
        }
        previous = head;
        if (k == 0)
            b->reached += head;
    }
    __atomic_fetch_add(&r->interior, interior, __ATOMIC_RELAXED);
    if (overflow)
        __atomic_store_n(&r->overflow, true, __ATOMIC_RELAXED);
    if (k == 0)
        b->last_reached = previous;
}

static int run_bc(const struct options *opt)
{
    const struct graph g = build_graph(opt);
    uint32_t *sources = wl_alloc(opt->sources * sizeof(uint32_t));
    const struct wl_scramble pick = wl_scramble_make(g.n, wl_stream(opt->common.seed, 3));
    for (uint64_t i = 0; i < opt->sources; i++)
        sources[i] = (uint32_t)wl_scramble(&pick, i); /* distinct, spread over the degrees */
    struct brandes b = {.dist = unreached_levels(g.n),
                        .sigma = wl_alloc(g.n * sizeof(uint64_t)),
                        .delta = wl_alloc(g.n * sizeof(double)),
                        .score = wl_alloc(g.n * sizeof(double)),
                        .queue = wl_alloc(g.n * sizeof(uint32_t))};
    /* bookkeeping, not the data (a level a vertex at most; only the levels' entries are touched) */
    uint64_t *level_start = opt->threads > 1 ? malloc((g.n + 2) * sizeof(uint64_t)) : NULL;
    if (opt->threads > 1 && level_start == NULL) {
        fprintf(stderr, "graph: out of memory for the level table\n");
        return 1;
    }
    struct bc_run run = {.g = &g, .sources = sources, .count = opt->sources, .threads = opt->threads, .b = &b,
                         .level_start = level_start};

    if (opt->threads > 1) {
        wl_run_threads(opt->threads, bc_share, &run, &run.barrier, &opt->common); /* begins the ROI */
        b.interior = run.interior;
        b.overflow = run.overflow;
    } else {
        wl_roi_begin(&opt->common);
        brandes(&g, sources, opt->sources, &b);
    }
    wl_roi_end(&opt->common, &b.score[sources[0]], sizeof(double));
    free(level_start);

    /* Over all sources: the scores sum to the interior vertices of all shortest paths. */
    double total = 0, top = 0;
    uint64_t checksum = 0;
    for (uint64_t v = 0; v < g.n; v++) {
        total += b.score[v];
        top = fmax(top, b.score[v]);
        checksum += wl_mix64(wl_double_bits(b.score[v]) ^ v * WL_GOLDEN);
    }
    if (b.overflow)
        fprintf(stderr, "graph: a shortest-path count overflowed 64 bits (a smaller --degree or graph fits)\n");
    const bool ok = !b.overflow && check_brandes(&g, &b, sources[opt->sources - 1]) &&
                    close_to(total, (double)b.interior);

    struct wl_json j = report_graph(opt, &g);
    wl_json_u64(&j, "reached", b.reached);
    wl_json_real(&j, "score_sum", total);
    wl_json_real(&j, "score_max", top);
    return wl_report_end(&j, ok, checksum);
}

int main(int argc, char **argv)
{
    wl_start("graph", USAGE);
    const struct options opt = parse_options(argc, argv);
    return opt.kernel == KERNEL_BFS ? run_bfs(&opt) : run_bc(&opt);
}

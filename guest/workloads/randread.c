/*
 * randread - random reads (and increments) by T tasks per thread, for the OS co-design
 * (cxlssd guest workload): opportunistic context switching and page promotion.
 *
 * The data: --footprint BYTES (default 64 MiB) of 64-bit words, word i = mix(seed, i),
 * then one read of every cache line (so that the LLC and the SSD's data cache hold clean
 * data, as they would long after the data was written: the ROI's misses write nothing
 * back and evict no dirty page), and the promotion daemon's moves decided meanwhile are
 * waited for (cxlssd_settle). With --warm-reads N, N reads of the ROI's distribution (one
 * task, reads only, a stream of their own) come first, and their moves are waited for too
 * (every 10 000 reads): the ROI then sees the steady state of a design that promotes.
 * ROI --roi (1): --tasks T coroutines of the guest runtime (cxlssd_tasks_run), or --threads T
 * POSIX threads (no runtime calls: a design that switches does so in the guest kernel,
 * docs/host-os.md), share --reads N reads. Each read picks a word: with probability --hot-share P one of the first
 * --hot BYTES (a hot set), else any word, uniformly; it awaits the word's line
 * (cxlssd_await: under a design that switches on long delays, another task runs while the
 * line comes from flash; a no-op in threads), reads it, adds it to the task's sum and, with
 * probability --write-share W, increments it (atomically in threads). Then --work K rounds of arithmetic (no memory access).
 *
 * Self-check after the ROI: the accesses are regenerated from the seed (each task's own
 * stream, independent of the order the tasks ran in), the expected increments of every
 * written word are counted (sorted, not in the data), and every written word and 4096
 * random unwritten ones must hold mix(seed, i) + their increments. The report also says
 * where the hot set's pages are, as the guest sees it (move_pages(2)): how many are in host
 * DRAM (promoted) and how many on the CXL node. One JSON line on stdout; exit 0, 1 if the check
 * failed, 2 for a usage error.
 */
#include "common.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define DEFAULT_FOOTPRINT (64ull << 20)
#define DEFAULT_READS 20000u
#define UNWRITTEN_CHECKS 4096u
#define WARM_SETTLE_READS 10000u

/* Generators (wl_stream): task t's accesses, the check's sample, the data. */
#define STREAM_TASK 1ull
#define STREAM_CHECK (1ull << 32)
#define STREAM_DATA (2ull << 32)
#define STREAM_WARM (3ull << 32)

static const char USAGE[] =
    "usage: randread [--footprint BYTES] [--tasks T | --threads T] [--reads N] [--hot BYTES]\n"
    "                [--hot-share P] [--write-share W] [--work K] [--warm-reads N]\n"
    "                [--seed S] [--roi ID]\n"
    "  --footprint    bytes of data (default 64M)\n"
    "  --tasks        tasks of the guest runtime sharing the reads (default 1)\n"
    "  --threads      POSIX threads sharing the reads instead (default 1)\n"
    "  --reads        reads in the measured phase, over all tasks (default 20000)\n"
    "  --hot          bytes at the start of the data that form the hot set (default 0)\n"
    "  --hot-share    probability that a read goes to the hot set (default 0.9 if --hot)\n"
    "  --write-share  probability that a read is followed by an increment (default 0)\n"
    "  --work         arithmetic rounds after each read (default 0)\n"
    "  --warm-reads   reads of the same distribution before the ROI, not measured (default 0)\n"
    WL_COMMON_USAGE;

struct options {
    uint64_t words, tasks, threads, reads, hot_words, work, warm_reads; /* tasks: one per thread with --threads */
    double hot_share, write_share;
    struct wl_common common;
};

struct access {
    uint64_t word;
    bool write;
};

struct run {
    const struct options *opt;
    uint64_t *data;
    uint64_t *sums; /* per task: what it read (kept, so that nothing is optimised away) */
};

WL_HOT uint64_t initial(uint64_t key, uint64_t word)
{
    return wl_mix64(key ^ word);
}

/* The CPU time of this process's parent so far (guest ns, /proc/PPID/schedstat): under
 * cxlssd-promote, the promotion daemon's work, page copies included, that fell into the
 * ROI (the guest's clock follows its instructions: 1 ns each). 0 if unknown. */
static uint64_t parent_cpu_ns(void)
{
    char path[64];
    unsigned long long ns = 0;
    snprintf(path, sizeof path, "/proc/%d/schedstat", (int)getppid());
    FILE *f = fopen(path, "r");
    if (f != NULL) {
        if (fscanf(f, "%llu", &ns) != 1)
            ns = 0;
        fclose(f);
    }
    return ns;
}

/* The k-th access of a task, from its generator (the same in the ROI and in the check). */
WL_HOT struct access next_access(const struct options *opt, uint64_t *state)
{
    struct access a;
    const bool hot = opt->hot_words != 0 && wl_unit(state) < opt->hot_share;
    a.word = wl_below(state, hot ? opt->hot_words : opt->words);
    a.write = opt->write_share > 0 && wl_unit(state) < opt->write_share;
    return a;
}

/* Task t's share of the reads. */
static uint64_t task_reads(const struct options *opt, uint64_t t)
{
    return opt->reads / opt->tasks + (t < opt->reads % opt->tasks);
}

static void task(unsigned t, void *arg)
{
    const struct run *run = arg;
    const struct options *opt = run->opt;
    uint64_t state = wl_stream(opt->common.seed, STREAM_TASK + t), sum = 0;
    for (uint64_t k = task_reads(opt, t); k > 0; k--) {
        const struct access a = next_access(opt, &state);
        volatile uint64_t *word = &run->data[a.word];
        cxlssd_await(word);
        const uint64_t value = *word;
        if (a.write && opt->threads > 1)
            __atomic_fetch_add(word, 1, __ATOMIC_RELAXED); /* another thread may hit the word */
        else if (a.write)
            *word = value + 1;
        uint64_t acc = value;
        for (uint64_t i = 0; i < opt->work; i++)
            __asm__ volatile("imul $0x5851f42d, %0, %0" : "+r"(acc)); /* kept: no memory */
        sum += acc;
    }
    run->sums[t] = sum;
}

/* Task k's reads in thread k (--threads). */
static void thread_task(uint64_t k, void *run)
{
    task((unsigned)k, run);
}

static int compare_u64(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Every written word holds its initial value plus its increments; so do word 0 and
 * `UNWRITTEN_CHECKS` random words not written. Returns the number of mismatches; `*writes`
 * gets the increments, `*digest` a hash of the checked words (in word order: independent of
 * the order the tasks ran in). */
static uint64_t check(const struct options *opt, const uint64_t *data, uint64_t *writes, uint64_t *digest)
{
    const uint64_t key = wl_stream(opt->common.seed, STREAM_DATA);
    uint64_t n = 0;
    for (uint64_t t = 0; t < opt->tasks; t++) {
        uint64_t state = wl_stream(opt->common.seed, STREAM_TASK + t);
        for (uint64_t k = task_reads(opt, t); k > 0; k--)
            n += next_access(opt, &state).write;
    }
    uint64_t *written = wl_alloc((n ? n : 1) * sizeof *written), w = 0;
    for (uint64_t t = 0; t < opt->tasks; t++) {
        uint64_t state = wl_stream(opt->common.seed, STREAM_TASK + t);
        for (uint64_t k = task_reads(opt, t); k > 0; k--) {
            const struct access a = next_access(opt, &state);
            if (a.write)
                written[w++] = a.word;
        }
    }
    qsort(written, n, sizeof *written, compare_u64);
    uint64_t mismatches = 0;
    for (uint64_t i = 0; i < n;) {
        uint64_t j = i;
        while (j < n && written[j] == written[i])
            j++;
        mismatches += data[written[i]] != initial(key, written[i]) + (j - i);
        *digest = wl_hash(*digest, data[written[i]]);
        i = j;
    }
    uint64_t state = wl_stream(opt->common.seed, STREAM_CHECK);
    for (unsigned c = 0; c <= UNWRITTEN_CHECKS; c++) {
        const uint64_t word = c == 0 ? 0 : wl_below(&state, opt->words);
        if (bsearch(&word, written, n, sizeof *written, compare_u64) == NULL) {
            mismatches += data[word] != initial(key, word);
            *digest = wl_hash(*digest, data[word]);
        }
    }
    *writes = n;
    return mismatches;
}

/* Pages of [data, data + bytes) in host DRAM (any node but the CXL node), of those on the
 * node promoted pages go to (cxlssd_dram_node()), and on the CXL node (move_pages with no
 * target nodes only reports where each page is). */
static void where_pages_are(const uint64_t *data, uint64_t bytes, uint64_t *in_dram, uint64_t *on_dram_node,
                            uint64_t *on_cxl)
{
    enum { BATCH = 512 };
    void *pages[BATCH];
    int status[BATCH];
    const int cxl_node = cxlssd_cxl_node(), dram_node = cxlssd_dram_node();
    *in_dram = *on_dram_node = *on_cxl = 0;
    const uint64_t n = (bytes + 4095) / 4096;
    for (uint64_t first = 0; first < n; first += BATCH) {
        const unsigned count = n - first < BATCH ? (unsigned)(n - first) : BATCH;
        for (unsigned k = 0; k < count; k++)
            pages[k] = (char *)data + (first + k) * 4096;
        if (syscall(SYS_move_pages, 0, (unsigned long)count, pages, NULL, status, 0) != 0)
            return;
        for (unsigned k = 0; k < count; k++) {
            *in_dram += status[k] >= 0 && status[k] != cxl_node;
            *on_dram_node += status[k] == dram_node;
            *on_cxl += status[k] == cxl_node;
        }
    }
}

int main(int argc, char **argv)
{
    wl_start("randread", USAGE);
    struct options opt = {.tasks = 1, .threads = 1, .reads = DEFAULT_READS, .hot_share = -1, .write_share = 0,
                          .common = WL_COMMON_DEFAULTS};
    uint64_t hot_bytes = 0;
    struct wl_option options[] = {
        WL_COUNT("tasks", &opt.tasks, 1, 256),
        WL_COUNT("threads", &opt.threads, 1, WL_MAX_THREADS),
        WL_SIZE("reads", &opt.reads, 1, 1ull << 32),
        WL_SIZE("hot", &hot_bytes, 0, 1ull << 40),
        WL_REAL("hot-share", &opt.hot_share, 0, 1),
        WL_REAL("write-share", &opt.write_share, 0, 1),
        WL_COUNT("work", &opt.work, 0, 1u << 20),
        WL_SIZE("warm-reads", &opt.warm_reads, 0, 1ull << 32),
        WL_END,
    };
    wl_parse(argc, argv, options, &opt.common);
    const uint64_t footprint = opt.common.footprint ? opt.common.footprint : DEFAULT_FOOTPRINT;
    opt.words = footprint / sizeof(uint64_t);
    if (opt.words < 512)
        wl_usage_error("--footprint %" PRIu64 ": must be at least 4K", footprint);
    if (hot_bytes > footprint)
        wl_usage_error("--hot %" PRIu64 ": larger than the footprint (%" PRIu64 ")", hot_bytes, footprint);
    if (opt.threads > 1 && opt.tasks > 1)
        wl_usage_error("--tasks %" PRIu64 " with --threads %" PRIu64 ": give one of them", opt.tasks, opt.threads);
    if (opt.threads > 1)
        opt.tasks = opt.threads; /* each thread's reads are a task's: the same streams and check */
    opt.hot_words = hot_bytes / sizeof(uint64_t);
    if (opt.hot_share < 0)
        opt.hot_share = opt.hot_words ? 0.9 : 0;
    else if (opt.hot_words == 0)
        wl_usage_error("--hot-share needs --hot");

    uint64_t *data = wl_alloc(opt.words * sizeof *data);
    uint64_t *sums = wl_alloc(opt.tasks * sizeof *sums);
    const uint64_t key = wl_stream(opt.common.seed, STREAM_DATA);
    for (uint64_t i = 0; i < opt.words; i++)
        data[i] = initial(key, i);
    uint64_t warm = 0;
    for (uint64_t i = 0; i < opt.words; i += 64 / sizeof *data)
        warm += ((volatile uint64_t *)data)[i];
    uint64_t state = wl_stream(opt.common.seed, STREAM_WARM);
    for (uint64_t k = 0; k < opt.warm_reads; k++) {
        warm += ((volatile uint64_t *)data)[next_access(&opt, &state).word];
        /* the promotion daemon shares the vCPU and falls behind the decisions (they
         * wait in the firmware): let the moves catch up now and then */
        if ((k + 1) % WARM_SETTLE_READS == 0)
            cxlssd_settle(60000);
    }
    sums[0] = warm; /* (overwritten by task 0: only so that the warm reads stay) */
    struct run run = {.opt = &opt, .data = data, .sums = sums};

    /* the set-up's page moves (it touched every page many times) belong to the set-up */
    cxlssd_settle(60000);
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    const long faults_before = usage.ru_minflt + usage.ru_majflt;
    const uint64_t parent_before_ns = parent_cpu_ns();
    if (opt.threads > 1) {
        wl_run_threads(opt.threads, thread_task, &run, NULL, &opt.common); /* begins the ROI */
    } else {
        wl_roi_begin(&opt.common);
        if (cxlssd_tasks_run((unsigned)opt.tasks, task, &run) != 0)
            wl_fail("cxlssd_tasks_run", opt.tasks);
    }
    wl_roi_end(&opt.common, &data[0], sizeof data[0]);
    getrusage(RUSAGE_SELF, &usage);
    /* a page fault in the ROI lets the promotion daemon rescan the program's pages */
    const long roi_faults = usage.ru_minflt + usage.ru_majflt - faults_before;
    const uint64_t parent_roi_ns = parent_cpu_ns() - parent_before_ns;

    uint64_t writes, checksum = 0, hot_in_dram, hot_on_dram_node, hot_on_cxl;
    where_pages_are(data, opt.hot_words * sizeof *data, &hot_in_dram, &hot_on_dram_node, &hot_on_cxl);
    const uint64_t mismatches = check(&opt, data, &writes, &checksum);

    struct wl_json j = wl_report_begin();
    wl_json_u64(&j, "tasks", opt.threads > 1 ? 1 : opt.tasks);
    wl_json_u64(&j, "threads", opt.threads);
    wl_json_u64(&j, "reads", opt.reads);
    wl_json_u64(&j, "hot_bytes", opt.hot_words * sizeof(uint64_t));
    wl_json_real(&j, "hot_share", opt.hot_share);
    wl_json_real(&j, "write_share", opt.write_share);
    wl_json_u64(&j, "work", opt.work);
    wl_json_u64(&j, "warm_reads", opt.warm_reads);
    wl_report_data(&j, &opt.common);
    wl_json_u64(&j, "writes", writes);
    wl_json_u64(&j, "switches", cxlssd_switches());
    wl_json_u64(&j, "mismatches", mismatches);
    wl_json_u64(&j, "hot_pages_in_dram", hot_in_dram);
    wl_json_u64(&j, "hot_pages_on_dram_node", hot_on_dram_node);
    wl_json_u64(&j, "hot_pages_on_cxl", hot_on_cxl);
    wl_json_u64(&j, "roi_page_faults", (uint64_t)roi_faults);
    wl_json_u64(&j, "roi_parent_cpu_ns", parent_roi_ns);
    return wl_report_end(&j, mismatches == 0, checksum);
}
